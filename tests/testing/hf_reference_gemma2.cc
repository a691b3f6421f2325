// hf_reference_gemma2.cc: Gemma2ForCausalLM for hf_config_reference.h, written from
// transformers' modeling_gemma2.py, configuration_gemma2.py and masking_utils.py.
//
// Config keys, with Gemma2Config's defaults when absent: vocab_size 256000, hidden_size 2304,
// intermediate_size 9216, num_hidden_layers 26, num_attention_heads 8, num_key_value_heads 4,
// head_dim 256, hidden_activation "gelu_pytorch_tanh", rms_norm_eps 1e-6, rope_theta 10000,
// attention_bias false, query_pre_attn_scalar 256, sliding_window 4096, final_logit_softcapping
// 30.0, attn_logit_softcapping 50.0 (null: no cap), tie_word_embeddings true. Which layers slide:
// "layer_types" when listed, else every even layer (0, 2, ...), as both the older
// `not bool(layer_idx % 2)` and the newer `bool((i + 1) % 2)` rules say.
//
// Forward (fp32):
//   h = embed(ids) * sqrt(hidden_size)   (the normalizer is a tensor in the hidden dtype)
//   per layer: h = h + post_attention_layernorm(attn(input_layernorm(h)))
//              h = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))
//   norm(x)  = x * rsqrt(mean(x^2) + eps) * (1 + w), in fp32
//   attn     : scores = q.k * query_pre_attn_scalar^-0.5, softcapped (tanh(s / cap) * cap) before
//              the (sliding) causal mask is added, softmax in fp32
//   mlp      = down(gelu_tanh(gate(x)) * up(x))
//   logits   = softcap(norm(h) @ head^T) with final_logit_softcapping; head = embed when tied
//
// Planted bugs: "gemma2_norm_without_one" (every norm scales by w instead of 1 + w),
// "gemma2_no_softcap" (neither softcap), "gemma2_all_layers_global" (no layer slides).
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

struct Gemma2Config {
  int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0;
  AttentionShape attention;
  std::string activation;
  double eps = 0, rope_theta = 0, query_pre_attn_scalar = 0;
  std::optional<int64_t> sliding_window;
  std::optional<double> final_softcap, attn_softcap;
  bool tied = true;
};

Gemma2Config ReadConfig(const nlohmann::json& c) {
  Gemma2Config g;
  g.vocab = IntKey(c, "vocab_size", 256000);
  g.hidden = IntKey(c, "hidden_size", 2304);
  g.intermediate = IntKey(c, "intermediate_size", 9216);
  g.layers = IntKey(c, "num_hidden_layers", 26);
  g.attention.heads = IntKey(c, "num_attention_heads", 8);
  g.attention.kv_heads = IntKey(c, "num_key_value_heads", 4);
  g.attention.head_dim = IntKey(c, "head_dim", 256);
  g.attention.qkv_bias = g.attention.o_bias = BoolKey(c, "attention_bias", false);
  // Older configs also carry "hidden_act"; Gemma2MLP reads hidden_activation only.
  g.activation = StringKey(c, "hidden_activation", "gelu_pytorch_tanh");
  g.eps = DoubleKey(c, "rms_norm_eps", 1e-6);
  g.rope_theta = DefaultRopeTheta(c, 10000.0);
  g.query_pre_attn_scalar = DoubleKey(c, "query_pre_attn_scalar", 256);
  g.sliding_window = OptionalIntKey(c, "sliding_window", 4096);
  g.final_softcap = OptionalDoubleKey(c, "final_logit_softcapping", 30.0);
  g.attn_softcap = OptionalDoubleKey(c, "attn_logit_softcapping", 50.0);
  g.tied = BoolKey(c, "tie_word_embeddings", true);

  auto fail = [](const std::string& why) {
    throw std::invalid_argument("hf_config_reference: Gemma2 config: " + why);
  };
  if (g.vocab <= 0 || g.hidden <= 0 || g.intermediate <= 0 || g.layers < 0 ||
      g.attention.heads <= 0 || g.attention.kv_heads <= 0 || g.attention.head_dim <= 0) {
    fail("sizes must be positive");
  }
  if (g.hidden % g.attention.heads != 0) fail("hidden_size must be a multiple of heads");
  if (g.attention.heads % g.attention.kv_heads != 0) fail("heads must be a multiple of kv heads");
  if (g.attention.head_dim % 2 != 0) fail("head_dim must be even for rotate_half");
  if (g.activation != "gelu_pytorch_tanh" && g.activation != "gelu") {
    fail("hidden_activation " + g.activation + " is not covered");
  }
  if (!(g.query_pre_attn_scalar > 0)) fail("query_pre_attn_scalar must be > 0");
  if (g.sliding_window && *g.sliding_window <= 0) fail("sliding_window must be > 0");
  if (BoolKey(c, "use_bidirectional_attention", false)) {
    fail("use_bidirectional_attention is not covered");
  }
  return g;
}

bool LayerSlides(const nlohmann::json& c, const Gemma2Config& g, int64_t layer) {
  if (BugPlanted("gemma2_all_layers_global")) return false;
  return ListedLayerSlides(c, layer, g.layers).value_or(layer % 2 == 0);
}

// Gemma2RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w), all in fp32.
torch::Tensor Gemma2RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const torch::Tensor h = x.to(torch::kFloat);
  const torch::Tensor normed = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  const torch::Tensor w = weight.to(torch::kFloat);
  return normed * (BugPlanted("gemma2_norm_without_one") ? w : 1.0 + w);
}

torch::Tensor SoftCap(const torch::Tensor& x, std::optional<double> cap) {
  if (!cap || BugPlanted("gemma2_no_softcap")) return x;
  return torch::tanh(x / *cap) * *cap;
}

}  // namespace

HfWeights Gemma2Weights(const nlohmann::json& config, uint64_t seed) {
  const Gemma2Config g = ReadConfig(config);
  const int64_t h = g.hidden, d = g.attention.head_dim;
  const int64_t q_out = g.attention.heads * d, kv_out = g.attention.kv_heads * d;
  HfWeights w;
  auto matrix = [&](const std::string& name, int64_t out, int64_t in, double gain) {
    w[name] = NormalDraw(seed, name, {out, in}, 0.0, gain / std::sqrt(static_cast<double>(in)));
  };
  // Used as 1 + w: small around 0 so the scale stays near 1 yet differs from it.
  auto norm = [&](const std::string& name) { w[name] = NormalDraw(seed, name, {h}, 0.0, 0.1); };
  auto bias = [&](const std::string& name, int64_t n) {
    w[name] = NormalDraw(seed, name, {n}, 0.0, 0.05);
  };
  // The embedding is scaled by sqrt(hidden) in the forward: N(0, 1/sqrt(hidden)) makes that O(1)
  // and keeps the tied head's logits O(1).
  matrix("model.embed_tokens.weight", g.vocab, h, 1.0);
  for (int64_t i = 0; i < g.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    norm(p + "input_layernorm.weight");
    norm(p + "post_attention_layernorm.weight");
    norm(p + "pre_feedforward_layernorm.weight");
    norm(p + "post_feedforward_layernorm.weight");
    matrix(p + "self_attn.q_proj.weight", q_out, h, 1.0);
    matrix(p + "self_attn.k_proj.weight", kv_out, h, 1.0);
    matrix(p + "self_attn.v_proj.weight", kv_out, h, 1.0);
    matrix(p + "self_attn.o_proj.weight", h, q_out, 0.5);
    if (g.attention.qkv_bias) {
      bias(p + "self_attn.q_proj.bias", q_out);
      bias(p + "self_attn.k_proj.bias", kv_out);
      bias(p + "self_attn.v_proj.bias", kv_out);
      bias(p + "self_attn.o_proj.bias", h);
    }
    matrix(p + "mlp.gate_proj.weight", g.intermediate, h, 1.0);
    matrix(p + "mlp.up_proj.weight", g.intermediate, h, 1.0);
    matrix(p + "mlp.down_proj.weight", h, g.intermediate, 0.5);
  }
  norm("model.norm.weight");
  if (!g.tied) matrix("lm_head.weight", g.vocab, h, 1.0);
  return w;
}

torch::Tensor Gemma2Logits(const nlohmann::json& config, const HfWeights& weights,
                           const torch::Tensor& ids_in, std::vector<torch::Tensor>* router_logits) {
  (void)router_logits;  // Gemma 2 has no routers.
  const Gemma2Config g = ReadConfig(config);
  const torch::Tensor ids = CheckedIds(ids_in, g.vocab);
  const int64_t b = ids.size(0), t = ids.size(1);
  const auto cos_sin = DefaultRope(g.attention.head_dim, g.rope_theta, t);
  const torch::Tensor full_mask = CausalMask(t, std::nullopt);
  const torch::Tensor sliding_mask = CausalMask(t, g.sliding_window);
  const double scaling = std::pow(g.query_pre_attn_scalar, -0.5);

  const torch::Tensor embed = Get(weights, "model.embed_tokens.weight").to(torch::kFloat);
  torch::Tensor hidden = embed.index_select(0, ids.reshape({-1})).reshape({b, t, g.hidden});
  // Gemma2Model.forward: the normalizer is torch.tensor(hidden_size**0.5, dtype=hidden dtype).
  hidden = hidden * torch::tensor(std::sqrt(static_cast<double>(g.hidden)), torch::kFloat);
  for (int64_t i = 0; i < g.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    auto norm = [&](const torch::Tensor& x, const char* name) {
      return Gemma2RmsNorm(x, Get(weights, p + name), g.eps);
    };
    const torch::Tensor& mask = LayerSlides(config, g, i) ? sliding_mask : full_mask;
    torch::Tensor attn = SelfAttention(
        norm(hidden, "input_layernorm.weight"), weights, p + "self_attn.", g.attention, cos_sin,
        mask, scaling, BugPlanted("gemma2_no_softcap") ? std::nullopt : g.attn_softcap);
    hidden = hidden + norm(attn, "post_attention_layernorm.weight");

    const torch::Tensor x = norm(hidden, "pre_feedforward_layernorm.weight");
    const torch::Tensor gate = Linear(x, Get(weights, p + "mlp.gate_proj.weight"), {});
    const torch::Tensor up = Linear(x, Get(weights, p + "mlp.up_proj.weight"), {});
    const torch::Tensor act =
        torch::gelu(gate, g.activation == "gelu_pytorch_tanh" ? "tanh" : "none");
    const torch::Tensor mlp = Linear(act * up, Get(weights, p + "mlp.down_proj.weight"), {});
    hidden = hidden + norm(mlp, "post_feedforward_layernorm.weight");
  }
  hidden = Gemma2RmsNorm(hidden, Get(weights, "model.norm.weight"), g.eps);
  const torch::Tensor head = g.tied ? embed : Get(weights, "lm_head.weight").to(torch::kFloat);
  return SoftCap(torch::linear(hidden, head), g.final_softcap).to(torch::kFloat);
}

}  // namespace strata::testing::families
