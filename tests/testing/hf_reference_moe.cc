// hf_reference_moe.cc: MixtralForCausalLM and Qwen2MoeForCausalLM for hf_config_reference.h,
// written from transformers' modeling_mixtral.py, modeling_qwen2_moe.py, their configuration
// files and masking_utils.py.
//
// Both are Llama-shaped decoders (RMSNorm, default RoPE, GQA, causal mask) whose MLP is a sparse
// mixture of experts:
//   router_logits = x @ gate^T                       [B*T, E], returned per MoE layer
//   p = softmax(router_logits) in fp32; top-k of p; renormalised to sum 1 (Mixtral always,
//   Qwen2-MoE when norm_topk_prob); out = sum over the k chosen experts of p_e * expert_e(x),
//   expert(x) = down(silu(gate(x)) * up(x)).
// Qwen2-MoE adds a shared expert: out += sigmoid(x @ shared_expert_gate^T) * shared_expert(x).
//
// Mixtral (config defaults of MixtralConfig): vocab 32000, hidden 4096, intermediate 14336,
// 32 layers, 32 heads, 8 kv heads, head_dim hidden / heads, rms_norm_eps 1e-5, rope_theta 1e6,
// sliding_window null (when set, every layer slides), num_local_experts 8, num_experts_per_tok 2,
// tie_word_embeddings false, no biases. Parameter names are those of the checkpoints on the Hub
// (Mixtral-8x7B-v0.1): model.layers.L.block_sparse_moe.gate.weight and
// model.layers.L.block_sparse_moe.experts.E.{w1,w2,w3}.weight (w1 gate, w3 up, w2 down); newer
// transformers fuse the experts in memory but still load these names.
//
// Qwen2-MoE (Qwen2MoeConfig): vocab 151936, hidden 2048, intermediate 5632, 24 layers, 16 heads,
// 16 kv heads, rms_norm_eps 1e-6, rope_theta 10000, qkv_bias true (q, k, v biases, none on o),
// num_experts 60, num_experts_per_tok 4, moe_intermediate_size 1408,
// shared_expert_intermediate_size 5632, norm_topk_prob false, decoder_sparse_step 1,
// mlp_only_layers [], tie_word_embeddings false. Layer L is sparse (mlp.gate, mlp.experts.E.*,
// mlp.shared_expert.*, mlp.shared_expert_gate) when L is not in mlp_only_layers, num_experts > 0
// and (L + 1) % decoder_sparse_step == 0; otherwise a dense mlp.{gate,up,down}_proj of
// intermediate_size. Sliding window (configuration_qwen2_moe.py's __post_init__, transformers 5):
// sliding_window (default 4096) only when use_sliding_window (default false); the layers that slide
// are those "layer_types" lists as sliding_attention, else layer i slides iff (i + 1) % 2 != 0 and
// i < max_window_layers (default 28) -- not Qwen2's i >= max_window_layers. (transformers 4.x had
// no layer_types here and decided in the attention code, differently per implementation; this
// reference follows the current source.)
//
// Load-balancing loss (load_balancing_loss_func, attention_mask None): all MoE layers' router
// logits concatenated [M, E]; p = softmax; f[j, e] = mean over tokens of (e is the j-th choice),
// P[e] = mean of p[:, e]; loss = E * sum_{j, e} f[j, e] * P[e] (top_k for uniform routing).
//
// Planted bugs: "qwen2moe_window_layers_as_qwen2" (without layer_types, Qwen2's rule: layers
// i >= max_window_layers slide), "moe_softmax_after_topk" (top-k of the raw logits, then softmax
// over those k; in the load-balancing loss too, with 0 for the experts not chosen),
// "moe_no_topk_renormalization" (flips the renormalisation: Mixtral skips it, Qwen2-MoE does the
// opposite of norm_topk_prob), "qwen2moe_no_shared_expert_gate" (the shared expert's output is
// added ungated).
#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/testing/hf_reference_decoder.h"
#include "tests/testing/hf_reference_families.h"

namespace strata::testing::families {
namespace {

struct MoeConfig {
  bool mixtral = true;
  int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0;
  AttentionShape attention;
  double eps = 0, rope_theta = 0;
  int64_t num_experts = 0, top_k = 0, expert_intermediate = 0, shared_intermediate = 0;
  bool renormalize = true;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  std::optional<int64_t> sliding_window;
  bool use_sliding_window = false;  // Qwen2-MoE only
  int64_t max_window_layers = 28;   // Qwen2-MoE only
  bool tied = false;
};

MoeConfig ReadConfig(const nlohmann::json& c) {
  const std::string arch = c["architectures"][0].get<std::string>();
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument("hf_config_reference: " + arch + " config: " + why);
  };
  MoeConfig m;
  m.mixtral = arch == "MixtralForCausalLM";
  if (!m.mixtral && arch != "Qwen2MoeForCausalLM") fail("not a mixture-of-experts architecture");
  if (m.mixtral) {
    m.vocab = IntKey(c, "vocab_size", 32000);
    m.hidden = IntKey(c, "hidden_size", 4096);
    m.intermediate = IntKey(c, "intermediate_size", 14336);
    m.layers = IntKey(c, "num_hidden_layers", 32);
    m.attention.heads = IntKey(c, "num_attention_heads", 32);
    m.attention.kv_heads = IntKey(c, "num_key_value_heads", 8);
    m.eps = DoubleKey(c, "rms_norm_eps", 1e-5);
    m.rope_theta = DefaultRopeTheta(c, 1e6);
    m.num_experts = IntKey(c, "num_local_experts", 8);
    m.top_k = IntKey(c, "num_experts_per_tok", 2);
    m.expert_intermediate = m.intermediate;
    m.sliding_window = OptionalIntKey(c, "sliding_window", std::nullopt);
  } else {
    m.vocab = IntKey(c, "vocab_size", 151936);
    m.hidden = IntKey(c, "hidden_size", 2048);
    m.intermediate = IntKey(c, "intermediate_size", 5632);
    m.layers = IntKey(c, "num_hidden_layers", 24);
    m.attention.heads = IntKey(c, "num_attention_heads", 16);
    m.attention.kv_heads = IntKey(c, "num_key_value_heads", 16);
    m.attention.qkv_bias = BoolKey(c, "qkv_bias", true);
    m.eps = DoubleKey(c, "rms_norm_eps", 1e-6);
    m.rope_theta = DefaultRopeTheta(c, 10000.0);
    m.num_experts = IntKey(c, "num_experts", 60);
    m.top_k = IntKey(c, "num_experts_per_tok", 4);
    m.expert_intermediate = IntKey(c, "moe_intermediate_size", 1408);
    m.shared_intermediate = IntKey(c, "shared_expert_intermediate_size", 5632);
    m.renormalize = BoolKey(c, "norm_topk_prob", false);
    m.decoder_sparse_step = IntKey(c, "decoder_sparse_step", 1);
    if (c.contains("mlp_only_layers") && !c["mlp_only_layers"].is_null()) {
      if (!c["mlp_only_layers"].is_array()) fail("mlp_only_layers must be a list of layers");
      for (const nlohmann::json& l : c["mlp_only_layers"]) {
        if (!l.is_number_integer()) fail("mlp_only_layers must be a list of layers");
        m.mlp_only_layers.push_back(l.get<int64_t>());
      }
    }
    m.use_sliding_window = BoolKey(c, "use_sliding_window", false);
    m.sliding_window = OptionalIntKey(c, "sliding_window", 4096);
    m.max_window_layers = IntKey(c, "max_window_layers", 28);
  }
  m.attention.head_dim =
      IntKey(c, "head_dim", m.attention.heads > 0 ? m.hidden / m.attention.heads : 0);
  m.tied = BoolKey(c, "tie_word_embeddings", false);
  if (StringKey(c, "hidden_act", "silu") != "silu") fail("hidden_act other than silu");
  if (m.vocab <= 0 || m.hidden <= 0 || m.intermediate <= 0 || m.layers < 0 ||
      m.attention.heads <= 0 || m.attention.kv_heads <= 0 || m.attention.head_dim <= 0) {
    fail("sizes must be positive");
  }
  if (m.attention.heads % m.attention.kv_heads != 0) fail("heads must be a multiple of kv heads");
  if (m.attention.head_dim % 2 != 0) fail("head_dim must be even for rotate_half");
  if (m.num_experts < 0 || (m.mixtral && m.num_experts == 0)) fail("num experts must be > 0");
  if (m.num_experts > 0 && (m.top_k <= 0 || m.top_k > m.num_experts)) {
    fail("num_experts_per_tok must be in [1, number of experts]");
  }
  if (m.decoder_sparse_step <= 0) fail("decoder_sparse_step must be > 0");
  if (m.sliding_window && *m.sliding_window <= 0) fail("sliding_window must be > 0");
  if (m.expert_intermediate <= 0 || (!m.mixtral && m.shared_intermediate <= 0)) {
    fail("expert intermediate sizes must be positive");
  }
  return m;
}

bool IsSparseLayer(const MoeConfig& m, int64_t layer) {
  if (m.mixtral) return true;
  for (int64_t l : m.mlp_only_layers) {
    if (l == layer) return false;
  }
  return m.num_experts > 0 && (layer + 1) % m.decoder_sparse_step == 0;
}

std::optional<int64_t> LayerWindow(const nlohmann::json& c, const MoeConfig& m, int64_t layer) {
  if (m.mixtral) return m.sliding_window;
  if (!m.use_sliding_window) return std::nullopt;
  if (const std::optional<bool> listed = ListedLayerSlides(c, layer, m.layers)) {
    return *listed ? m.sliding_window : std::nullopt;
  }
  const bool slides = BugPlanted("qwen2moe_window_layers_as_qwen2")
                          ? layer >= m.max_window_layers
                          : (layer + 1) % 2 != 0 && layer < m.max_window_layers;
  return slides ? m.sliding_window : std::nullopt;
}

std::string MoePrefix(const MoeConfig& m, int64_t layer) {
  return "model.layers." + std::to_string(layer) + (m.mixtral ? ".block_sparse_moe." : ".mlp.");
}

// Names of one expert's gate (act input), up and down projections under `prefix`.
struct ExpertNames {
  std::string gate, up, down;
};
ExpertNames ExpertWeightNames(const MoeConfig& m, const std::string& prefix) {
  if (m.mixtral) return {prefix + "w1.weight", prefix + "w3.weight", prefix + "w2.weight"};
  return {prefix + "gate_proj.weight", prefix + "up_proj.weight", prefix + "down_proj.weight"};
}

torch::Tensor SwiGlu(const torch::Tensor& x, const HfWeights& w, const ExpertNames& n) {
  const torch::Tensor gate = Linear(x, Get(w, n.gate), {});
  const torch::Tensor up = Linear(x, Get(w, n.up), {});
  return Linear(torch::silu(gate) * up, Get(w, n.down), {});
}

struct Routing {
  torch::Tensor weights;  // [N, k] fp32
  torch::Tensor experts;  // [N, k] int64
};

Routing Route(const torch::Tensor& router_logits, const MoeConfig& m) {
  Routing r;
  if (BugPlanted("moe_softmax_after_topk")) {
    auto [values, indices] = torch::topk(router_logits, m.top_k, -1);
    r.weights = torch::softmax(values, -1, torch::kFloat);
    r.experts = indices;
  } else {
    const torch::Tensor probs = torch::softmax(router_logits, -1, torch::kFloat);
    auto [values, indices] = torch::topk(probs, m.top_k, -1);
    r.weights = values;
    r.experts = indices;
  }
  const bool renormalize = m.renormalize != BugPlanted("moe_no_topk_renormalization");
  if (renormalize) r.weights = r.weights / r.weights.sum(-1, /*keepdim=*/true);
  return r;
}

// MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock on x [N, hidden].
torch::Tensor SparseMoe(const torch::Tensor& x, const HfWeights& w, const MoeConfig& m,
                        int64_t layer, std::vector<torch::Tensor>* router_logits_out) {
  const std::string p = MoePrefix(m, layer);
  const torch::Tensor router_logits = Linear(x, Get(w, p + "gate.weight"), {});
  if (router_logits.size(-1) != m.num_experts) {
    throw std::invalid_argument("hf_config_reference: " + p + "gate.weight has " +
                                std::to_string(router_logits.size(-1)) + " experts");
  }
  if (router_logits_out) router_logits_out->push_back(router_logits);
  const Routing r = Route(router_logits, m);
  torch::Tensor out = torch::zeros_like(x);
  for (int64_t e = 0; e < m.num_experts; ++e) {
    const torch::Tensor chosen = r.experts.eq(e);                       // [N, k]
    const torch::Tensor rows = chosen.any(-1).nonzero().reshape({-1});  // tokens routed to e
    if (rows.numel() == 0) continue;
    const torch::Tensor weight = (r.weights * chosen).sum(-1).index_select(0, rows);
    const ExpertNames names = ExpertWeightNames(m, p + "experts." + std::to_string(e) + ".");
    const torch::Tensor y = SwiGlu(x.index_select(0, rows), w, names) * weight.unsqueeze(-1);
    out.index_add_(0, rows, y);
  }
  if (!m.mixtral) {
    torch::Tensor shared = SwiGlu(x, w, ExpertWeightNames(m, p + "shared_expert."));
    if (!BugPlanted("qwen2moe_no_shared_expert_gate")) {
      shared = torch::sigmoid(Linear(x, Get(w, p + "shared_expert_gate.weight"), {})) * shared;
    }
    out = out + shared;
  }
  return out;
}

}  // namespace

HfWeights MoeWeights(const nlohmann::json& config, uint64_t seed) {
  const MoeConfig m = ReadConfig(config);
  const int64_t h = m.hidden, d = m.attention.head_dim;
  const int64_t q_out = m.attention.heads * d, kv_out = m.attention.kv_heads * d;
  HfWeights w;
  auto matrix = [&](const std::string& name, int64_t out, int64_t in, double gain) {
    w[name] = NormalDraw(seed, name, {out, in}, 0.0, gain / std::sqrt(static_cast<double>(in)));
  };
  auto norm = [&](const std::string& name) { w[name] = NormalDraw(seed, name, {h}, 1.0, 0.1); };
  auto bias = [&](const std::string& name, int64_t n) {
    w[name] = NormalDraw(seed, name, {n}, 0.0, 0.05);
  };
  auto swiglu = [&](const ExpertNames& n, int64_t inter) {
    matrix(n.gate, inter, h, 1.0);
    matrix(n.up, inter, h, 1.0);
    matrix(n.down, h, inter, 0.5);
  };
  matrix("model.embed_tokens.weight", m.vocab, h, 1.0);
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    norm(p + "input_layernorm.weight");
    norm(p + "post_attention_layernorm.weight");
    matrix(p + "self_attn.q_proj.weight", q_out, h, 1.0);
    matrix(p + "self_attn.k_proj.weight", kv_out, h, 1.0);
    matrix(p + "self_attn.v_proj.weight", kv_out, h, 1.0);
    matrix(p + "self_attn.o_proj.weight", h, q_out, 0.5);
    if (m.attention.qkv_bias) {
      bias(p + "self_attn.q_proj.bias", q_out);
      bias(p + "self_attn.k_proj.bias", kv_out);
      bias(p + "self_attn.v_proj.bias", kv_out);
    }
    if (!IsSparseLayer(m, i)) {
      swiglu(ExpertWeightNames(m, p + "mlp."), m.intermediate);
      continue;
    }
    const std::string moe = MoePrefix(m, i);
    // Router logits of std ~2 (the normed input has RMS ~1): wide enough that tokens choose
    // different experts and near-ties between the k-th and (k+1)-th expert stay rare.
    matrix(moe + "gate.weight", m.num_experts, h, 2.0);
    for (int64_t e = 0; e < m.num_experts; ++e) {
      swiglu(ExpertWeightNames(m, moe + "experts." + std::to_string(e) + "."),
             m.expert_intermediate);
    }
    if (!m.mixtral) {
      swiglu(ExpertWeightNames(m, moe + "shared_expert."), m.shared_intermediate);
      matrix(moe + "shared_expert_gate.weight", 1, h, 1.0);
    }
  }
  norm("model.norm.weight");
  if (!m.tied) matrix("lm_head.weight", m.vocab, h, 1.0);
  return w;
}

torch::Tensor MoeLogits(const nlohmann::json& config, const HfWeights& weights,
                        const torch::Tensor& ids_in, std::vector<torch::Tensor>* router_logits) {
  const MoeConfig m = ReadConfig(config);
  const torch::Tensor ids = CheckedIds(ids_in, m.vocab);
  const int64_t b = ids.size(0), t = ids.size(1);
  const auto cos_sin = DefaultRope(m.attention.head_dim, m.rope_theta, t);
  const double scaling = std::pow(static_cast<double>(m.attention.head_dim), -0.5);

  const torch::Tensor embed = Get(weights, "model.embed_tokens.weight").to(torch::kFloat);
  torch::Tensor hidden = embed.index_select(0, ids.reshape({-1})).reshape({b, t, m.hidden});
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const torch::Tensor mask = CausalMask(t, LayerWindow(config, m, i));
    const torch::Tensor x = LlamaRmsNorm(hidden, Get(weights, p + "input_layernorm.weight"), m.eps);
    hidden = hidden + SelfAttention(x, weights, p + "self_attn.", m.attention, cos_sin, mask,
                                    scaling, std::nullopt);

    const torch::Tensor y =
        LlamaRmsNorm(hidden, Get(weights, p + "post_attention_layernorm.weight"), m.eps);
    if (IsSparseLayer(m, i)) {
      const torch::Tensor flat = y.reshape({b * t, m.hidden});
      hidden = hidden + SparseMoe(flat, weights, m, i, router_logits).reshape({b, t, m.hidden});
    } else {
      hidden = hidden + SwiGlu(y, weights, ExpertWeightNames(m, p + "mlp."));
    }
  }
  hidden = LlamaRmsNorm(hidden, Get(weights, "model.norm.weight"), m.eps);
  const torch::Tensor head = m.tied ? embed : Get(weights, "lm_head.weight").to(torch::kFloat);
  return torch::linear(hidden, head).to(torch::kFloat);
}

double MoeLoadBalancingLoss(const nlohmann::json& config,
                            const std::vector<torch::Tensor>& router_logits) {
  const MoeConfig m = ReadConfig(config);
  if (router_logits.empty()) return 0.0;  // no MoE layer: transformers has nothing to balance
  const torch::Tensor logits = torch::cat(router_logits, 0).to(torch::kFloat);  // [M, E]
  const int64_t num_experts = logits.size(-1);
  torch::Tensor probs = torch::softmax(logits, -1);
  const torch::Tensor chosen = std::get<1>(torch::topk(probs, m.top_k, -1));  // [M, k]
  if (BugPlanted("moe_softmax_after_topk")) {
    const torch::Tensor top_logits = logits.gather(-1, chosen);
    probs = torch::zeros_like(probs).scatter(-1, chosen, torch::softmax(top_logits, -1));
  }
  const torch::Tensor expert_mask =
      torch::one_hot(chosen, num_experts).to(torch::kFloat);    // [M, k, E]
  const torch::Tensor tokens_per_expert = expert_mask.mean(0);  // [k, E]
  const torch::Tensor router_prob_per_expert = probs.mean(0);   // [E]
  const torch::Tensor loss =
      (tokens_per_expert * router_prob_per_expert.unsqueeze(0)).sum() * num_experts;
  return loss.item<double>();
}

}  // namespace strata::testing::families
