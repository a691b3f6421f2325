// Self-tests of the Gemma 2 and mixture-of-experts references (hf_config_reference.h via
// hf_reference_gemma2.cc and hf_reference_moe.cc). They are what strata's models are judged by,
// so these check them against things computed another way: a double-precision Gemma 2 forward
// with per-query loops and explicit formulas, Mixtral reduced to hf_reference.h's Llama, routing
// recomputed token by token, the load-balancing loss by hand, and sliding windows by perturbing
// tokens. The configs are shrunk from the published gemma-2-2b, Mixtral-8x7B-v0.1 and
// Qwen1.5-MoE-A2.7B config.json files.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/hf_config_reference.h"
#include "tests/testing/hf_reference.h"
#include "tests/testing/hf_reference_families.h"

namespace strata::testing {
namespace {

// gemma-2-2b's config.json with the sizes shrunk (head_dim and query_pre_attn_scalar kept equal,
// as there).
nlohmann::json Gemma2Config() {
  return nlohmann::json::parse(R"({
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": [1, 107], "final_logit_softcapping": 30.0, "head_dim": 16,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 48,
    "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 4,
    "num_hidden_layers": 3, "num_key_value_heads": 2, "pad_token_id": 0,
    "query_pre_attn_scalar": 16, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 4, "torch_dtype": "float32", "transformers_version": "4.42.4",
    "use_cache": true, "vocab_size": 64})");
}

// Mixtral-8x7B-v0.1's config.json, shrunk.
nlohmann::json MixtralConfig() {
  return nlohmann::json::parse(R"({
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
    "intermediate_size": 40, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "num_local_experts": 4, "output_router_logits": false,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 64})");
}

// Qwen1.5-MoE-A2.7B's config.json, shrunk; layer 1 made dense through mlp_only_layers.
nlohmann::json Qwen2MoeConfig() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 32,
    "initializer_range": 0.02, "intermediate_size": 48, "max_position_embeddings": 8192,
    "max_window_layers": 21, "model_type": "qwen2_moe", "num_attention_heads": 4,
    "num_hidden_layers": 3, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.39.0.dev0", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 64, "decoder_sparse_step": 1,
    "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24,
    "num_experts_per_tok": 2, "num_experts": 6, "norm_topk_prob": false,
    "output_router_logits": false, "router_aux_loss_coef": 0.001, "mlp_only_layers": [1]})");
}

torch::Tensor Ids(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randint(vocab, {b, t}, torch::kLong);
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

std::set<std::string> Names(const HfWeights& w) {
  std::set<std::string> out;
  for (const auto& [name, t] : w) out.insert(name);
  return out;
}

// Restores the reference to its correct form when a test ends, planted bug or not.
class PlantedBug {
 public:
  explicit PlantedBug(const std::string& name) { PlantBug(name); }
  ~PlantedBug() { PlantBug(""); }
};

// ---- Weight sets ------------------------------------------------------------------------------

TEST(Gemma2Reference, WeightsAreTransformersParameters) {
  nlohmann::json c = Gemma2Config();
  const HfWeights w = RandomWeightsFor(c, 1);
  std::set<std::string> expected = {"model.embed_tokens.weight", "model.norm.weight"};
  for (int i = 0; i < 3; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* n :
         {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
          "post_feedforward_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
          "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
      expected.insert(p + n + ".weight");
    }
  }
  EXPECT_EQ(Names(w), expected);  // tied by default: no lm_head
  EXPECT_EQ(w.at("model.layers.0.self_attn.q_proj.weight").sizes(), (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(w.at("model.layers.0.self_attn.k_proj.weight").sizes(), (std::vector<int64_t>{32, 32}));
  // Norm weights are used as 1 + w: drawn around 0.
  EXPECT_LT(w.at("model.norm.weight").abs().mean().item<double>(), 0.3);
  EXPECT_TRUE(w.at("model.norm.weight").equal(RandomWeightsFor(c, 1).at("model.norm.weight")));
  EXPECT_FALSE(w.at("model.norm.weight").equal(RandomWeightsFor(c, 2).at("model.norm.weight")));

  c["tie_word_embeddings"] = false;
  EXPECT_EQ(RandomWeightsFor(c, 1).count("lm_head.weight"), 1u);
}

TEST(MoeReference, MixtralWeightsUseTheHubCheckpointNames) {
  const HfWeights w = RandomWeightsFor(MixtralConfig(), 1);
  std::set<std::string> expected = {"model.embed_tokens.weight", "model.norm.weight",
                                    "lm_head.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* n :
         {"input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
          "self_attn.v_proj", "self_attn.o_proj", "block_sparse_moe.gate"}) {
      expected.insert(p + n + ".weight");
    }
    for (int e = 0; e < 4; ++e) {
      for (const char* n : {"w1", "w2", "w3"}) {
        expected.insert(p + "block_sparse_moe.experts." + std::to_string(e) + "." + n + ".weight");
      }
    }
  }
  EXPECT_EQ(Names(w), expected);
  EXPECT_EQ(w.at("model.layers.0.block_sparse_moe.gate.weight").sizes(),
            (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(w.at("model.layers.1.block_sparse_moe.experts.3.w1.weight").sizes(),
            (std::vector<int64_t>{40, 32}));
  EXPECT_EQ(w.at("model.layers.1.block_sparse_moe.experts.3.w2.weight").sizes(),
            (std::vector<int64_t>{32, 40}));
}

TEST(MoeReference, Qwen2MoeWeightsHaveSharedExpertsBiasesAndDenseLayers) {
  const HfWeights w = RandomWeightsFor(Qwen2MoeConfig(), 1);
  const std::set<std::string> names = Names(w);
  for (int i : {0, 2}) {  // sparse layers
    const std::string p = "model.layers." + std::to_string(i) + ".mlp.";
    EXPECT_EQ(w.at(p + "gate.weight").sizes(), (std::vector<int64_t>{6, 32}));
    EXPECT_EQ(w.at(p + "experts.5.gate_proj.weight").sizes(), (std::vector<int64_t>{16, 32}));
    EXPECT_EQ(w.at(p + "experts.5.down_proj.weight").sizes(), (std::vector<int64_t>{32, 16}));
    EXPECT_EQ(w.at(p + "shared_expert.up_proj.weight").sizes(), (std::vector<int64_t>{24, 32}));
    EXPECT_EQ(w.at(p + "shared_expert_gate.weight").sizes(), (std::vector<int64_t>{1, 32}));
    EXPECT_EQ(names.count(p + "gate_proj.weight"), 0u);
  }
  // mlp_only_layers [1]: a dense MLP of intermediate_size.
  EXPECT_EQ(w.at("model.layers.1.mlp.gate_proj.weight").sizes(), (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(names.count("model.layers.1.mlp.gate.weight"), 0u);
  EXPECT_EQ(names.count("model.layers.1.mlp.experts.0.up_proj.weight"), 0u);
  // Qwen2-MoE attention: q, k, v biases, none on o.
  EXPECT_EQ(names.count("model.layers.0.self_attn.q_proj.bias"), 1u);
  EXPECT_EQ(names.count("model.layers.0.self_attn.v_proj.bias"), 1u);
  EXPECT_EQ(names.count("model.layers.0.self_attn.o_proj.bias"), 0u);
  // 3 layers x (2 norms + 4 attention + 3 biases) + layers 0, 2 x (gate + 6x3 experts + 3 shared
  // + shared gate) + layer 1's 3 + embed, norm, lm_head.
  EXPECT_EQ(w.size(), 3u * 9 + 2 * (1 + 18 + 3 + 1) + 3 + 3);
}

// ---- Gemma 2 against a forward written another way --------------------------------------------

struct Gemma2Numbers {
  int64_t hidden, intermediate, layers, heads, kv_heads, head_dim, window;
  double eps, theta, query_scalar, attn_cap, final_cap;
};

// A [hidden] row of `m` [rows, cols] times x: plain double loops.
std::vector<double> MatVec(const torch::Tensor& m, const std::vector<double>& x) {
  const torch::Tensor md = m.to(torch::kDouble).contiguous();
  const int64_t rows = md.size(0), cols = md.size(1);
  const double* p = md.data_ptr<double>();
  std::vector<double> y(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[r] += p[r * cols + c] * x[c];
  }
  return y;
}

std::vector<double> Row(const torch::Tensor& m, int64_t r) {
  const torch::Tensor row = m[r].to(torch::kDouble).contiguous();
  return std::vector<double>(row.data_ptr<double>(), row.data_ptr<double>() + row.numel());
}

std::vector<double> GemmaNorm(const std::vector<double>& x, const torch::Tensor& w, double eps) {
  double ms = 0;
  for (double v : x) ms += v * v;
  ms /= static_cast<double>(x.size());
  const std::vector<double> wd = Row(w.unsqueeze(0), 0);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] / std::sqrt(ms + eps) * (1.0 + wd[i]);
  return y;
}

// Rotates the pairs (i, i + d/2) of one head's vector by position * theta^(-2i/d).
void Rotate(double* v, int64_t d, int64_t pos, double theta) {
  for (int64_t i = 0; i < d / 2; ++i) {
    const double angle = pos * std::pow(theta, -2.0 * i / d);
    const double a = v[i], b = v[i + d / 2];
    v[i] = a * std::cos(angle) - b * std::sin(angle);
    v[i + d / 2] = b * std::cos(angle) + a * std::sin(angle);
  }
}

// Gemma 2 for one sequence, in double, one query at a time; `slides[l]` says whether layer l only
// sees the last `window` positions.
std::vector<std::vector<double>> Gemma2ByHand(const Gemma2Numbers& n, const HfWeights& w,
                                              const std::vector<int64_t>& ids,
                                              const std::vector<bool>& slides) {
  const int64_t t = static_cast<int64_t>(ids.size()), d = n.head_dim;
  std::vector<std::vector<double>> h;
  for (int64_t id : ids) {
    std::vector<double> e = Row(w.at("model.embed_tokens.weight"), id);
    for (double& v : e) v *= std::sqrt(static_cast<double>(n.hidden));
    h.push_back(e);
  }
  for (int64_t l = 0; l < n.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<std::vector<double>> q(t), k(t), v(t);
    for (int64_t i = 0; i < t; ++i) {
      const std::vector<double> x = GemmaNorm(h[i], w.at(p + "input_layernorm.weight"), n.eps);
      q[i] = MatVec(w.at(p + "self_attn.q_proj.weight"), x);
      k[i] = MatVec(w.at(p + "self_attn.k_proj.weight"), x);
      v[i] = MatVec(w.at(p + "self_attn.v_proj.weight"), x);
      for (int64_t head = 0; head < n.heads; ++head) Rotate(&q[i][head * d], d, i, n.theta);
      for (int64_t head = 0; head < n.kv_heads; ++head) Rotate(&k[i][head * d], d, i, n.theta);
    }
    std::vector<std::vector<double>> next = h;
    for (int64_t i = 0; i < t; ++i) {
      std::vector<double> attn(static_cast<size_t>(n.heads * d), 0.0);
      const int64_t first = slides[l] ? std::max<int64_t>(0, i - n.window + 1) : 0;
      for (int64_t head = 0; head < n.heads; ++head) {
        const int64_t kv = head / (n.heads / n.kv_heads);
        std::vector<double> s;
        for (int64_t j = first; j <= i; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q[i][head * d + c] * k[j][kv * d + c];
          dot /= std::sqrt(n.query_scalar);
          s.push_back(n.attn_cap * std::tanh(dot / n.attn_cap));
        }
        const double top = *std::max_element(s.begin(), s.end());
        double z = 0;
        for (double& x : s) z += (x = std::exp(x - top));
        for (int64_t j = first; j <= i; ++j) {
          for (int64_t c = 0; c < d; ++c) attn[head * d + c] += s[j - first] / z * v[j][kv * d + c];
        }
      }
      const std::vector<double> o = GemmaNorm(MatVec(w.at(p + "self_attn.o_proj.weight"), attn),
                                              w.at(p + "post_attention_layernorm.weight"), n.eps);
      for (int64_t c = 0; c < n.hidden; ++c) next[i][c] += o[c];
      const std::vector<double> x =
          GemmaNorm(next[i], w.at(p + "pre_feedforward_layernorm.weight"), n.eps);
      const std::vector<double> g = MatVec(w.at(p + "mlp.gate_proj.weight"), x);
      const std::vector<double> u = MatVec(w.at(p + "mlp.up_proj.weight"), x);
      std::vector<double> act(g.size());
      for (size_t c = 0; c < g.size(); ++c) {
        const double gelu =
            0.5 * g[c] *
            (1 + std::tanh(std::sqrt(2 / M_PI) * (g[c] + 0.044715 * g[c] * g[c] * g[c])));
        act[c] = gelu * u[c];
      }
      const std::vector<double> m = GemmaNorm(MatVec(w.at(p + "mlp.down_proj.weight"), act),
                                              w.at(p + "post_feedforward_layernorm.weight"), n.eps);
      for (int64_t c = 0; c < n.hidden; ++c) next[i][c] += m[c];
    }
    h = next;
  }
  std::vector<std::vector<double>> logits;
  for (int64_t i = 0; i < t; ++i) {
    std::vector<double> y = MatVec(w.at("model.embed_tokens.weight"),
                                   GemmaNorm(h[i], w.at("model.norm.weight"), n.eps));
    for (double& v : y) v = n.final_cap * std::tanh(v / n.final_cap);
    logits.push_back(y);
  }
  return logits;
}

TEST(Gemma2Reference, MatchesAForwardWrittenByHand) {
  // Small caps so that both softcaps bite; a window of 4 over 9 tokens.
  nlohmann::json c = Gemma2Config();
  c["attn_logit_softcapping"] = 2.0;
  c["final_logit_softcapping"] = 1.5;
  const Gemma2Numbers n{32, 48, 3, 4, 2, 16, 4, 1e-6, 10000.0, 16.0, 2.0, 1.5};
  const HfWeights w = RandomWeightsFor(c, 3);
  const torch::Tensor ids = Ids(1, 9, 64, 5);
  const std::vector<int64_t> seq(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 9);
  const torch::Tensor logits = ConfigReferenceLogits(c, w, ids);
  ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{1, 9, 64}));
  // Layers 0 and 2 slide (the even ones).
  const auto by_hand = Gemma2ByHand(n, w, seq, {true, false, true});
  double worst = 0;
  for (int64_t i = 0; i < 9; ++i) {
    for (int64_t v = 0; v < 64; ++v) {
      worst = std::max(worst, std::abs(logits[0][i][v].item<double>() - by_hand[i][v]));
    }
  }
  EXPECT_LT(worst, 2e-5);
  // The logits are capped at 1.5 and use most of that range.
  EXPECT_LT(logits.abs().max().item<double>(), 1.5);
  EXPECT_GT(logits.abs().max().item<double>(), 0.5);

  // Layer types listed in the config replace the even-layer rule.
  c["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention"};
  const auto listed = Gemma2ByHand(n, w, seq, {false, true, true});
  const torch::Tensor listed_logits = ConfigReferenceLogits(c, w, ids);
  for (int64_t v = 0; v < 64; ++v) {
    EXPECT_NEAR(listed_logits[0][8][v].item<double>(), listed[8][v], 2e-5);
  }
}

TEST(Gemma2Reference, WithoutCapsAndWithZeroNormsItIsTheScaledPlainDecoder) {
  // Caps of 1e9 are the identity in fp32 and norm weights of 0 scale by 1: then the embedding
  // scale and the head are the only Gemma-specific parts left in a 0-layer model.
  nlohmann::json c = Gemma2Config();
  c["num_hidden_layers"] = 0;
  c["final_logit_softcapping"] = 1e9;
  HfWeights w = RandomWeightsFor(c, 4);
  w["model.norm.weight"].zero_();
  const torch::Tensor ids = Ids(2, 5, 64, 6);
  const torch::Tensor e = w.at("model.embed_tokens.weight").index({ids}) * std::sqrt(32.0);
  const torch::Tensor normed = e * torch::rsqrt(e.pow(2).mean(-1, true) + 1e-6);
  const torch::Tensor expected = torch::matmul(normed, w.at("model.embed_tokens.weight").t());
  EXPECT_LT(MaxAbsDiff(ConfigReferenceLogits(c, w, ids), expected), 1e-5);
  // null caps are "no cap" too.
  c["final_logit_softcapping"] = nullptr;
  EXPECT_LT(MaxAbsDiff(ConfigReferenceLogits(c, w, ids), expected), 1e-5);
}

// ---- Sliding windows by perturbation ----------------------------------------------------------

// The positions whose logits change when token 0 changes. Not bitwise: when token 0's routing
// changes, experts multiply differently sized batches, which moves other rows by rounding only;
// a position either moves by rounding (< 1e-5) or really (> 1e-3).
std::vector<int64_t> InfluencedByFirstToken(const nlohmann::json& c, int64_t t) {
  const HfWeights w = RandomWeightsFor(c, 8);
  torch::Tensor ids = Ids(1, t, 64, 9);
  const torch::Tensor before = ConfigReferenceLogits(c, w, ids);
  ids[0][0] = (ids[0][0].item<int64_t>() + 1) % 64;
  const torch::Tensor after = ConfigReferenceLogits(c, w, ids);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < t; ++i) {
    const double moved = MaxAbsDiff(before[0][i], after[0][i]);
    EXPECT_TRUE(moved < 1e-5 || moved > 1e-3) << "position " << i << " moved by " << moved;
    if (moved > 1e-4) out.push_back(i);
  }
  return out;
}

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST(Gemma2Reference, SlidingLayersDoNotSeePastTheirWindow) {
  // Two sliding layers with window 3: position q sees q-2.. per layer, so token 0 reaches
  // positions 0..4 and no further.
  nlohmann::json c = Gemma2Config();
  c["num_hidden_layers"] = 2;
  c["sliding_window"] = 3;
  c["layer_types"] = {"sliding_attention", "sliding_attention"};
  EXPECT_EQ(InfluencedByFirstToken(c, 10), Iota(5));
  {
    PlantedBug bug("gemma2_all_layers_global");
    EXPECT_EQ(InfluencedByFirstToken(c, 10), Iota(10));
  }
  {
    PlantedBug bug("sliding_window_off_by_one");  // windows of 4: reaches positions 0..6
    EXPECT_EQ(InfluencedByFirstToken(c, 10), Iota(7));
  }
  // Without layer_types, layer 0 of a 1-layer model slides (the even-layer rule).
  c.erase("layer_types");
  c["num_hidden_layers"] = 1;
  EXPECT_EQ(InfluencedByFirstToken(c, 10), Iota(3));
  c["layer_types"] = {"full_attention"};
  EXPECT_EQ(InfluencedByFirstToken(c, 10), Iota(10));
}

TEST(MoeReference, MixtralWithASlidingWindowSlidesInEveryLayer) {
  nlohmann::json c = MixtralConfig();
  c["sliding_window"] = 3;
  EXPECT_EQ(InfluencedByFirstToken(c, 9), Iota(5));
  c["sliding_window"] = nullptr;
  EXPECT_EQ(InfluencedByFirstToken(c, 9), Iota(9));
}

// ---- Mixtral reduced to a Llama ---------------------------------------------------------------

// hf_reference.h's Llama with Mixtral's sizes, and Mixtral's weights with expert `e`'s
// w1, w3, w2 as its gate, up and down projections.
LlamaSpec LlamaLike(const nlohmann::json& c) {
  LlamaSpec s;
  s.vocab_size = c["vocab_size"];
  s.hidden_size = c["hidden_size"];
  s.intermediate_size = c["intermediate_size"];
  s.num_hidden_layers = c["num_hidden_layers"];
  s.num_attention_heads = c["num_attention_heads"];
  s.num_key_value_heads = c["num_key_value_heads"];
  s.rms_norm_eps = c["rms_norm_eps"];
  s.rope_theta = c["rope_theta"];
  return s;
}

HfWeights AsLlama(const HfWeights& mixtral, int64_t layers, int64_t e) {
  HfWeights out;
  for (const auto& [name, t] : mixtral) {
    if (name.find("block_sparse_moe") == std::string::npos) out[name] = t;
  }
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
    out[p + "mlp.gate_proj.weight"] = mixtral.at(x + "w1.weight");
    out[p + "mlp.up_proj.weight"] = mixtral.at(x + "w3.weight");
    out[p + "mlp.down_proj.weight"] = mixtral.at(x + "w2.weight");
  }
  return out;
}

TEST(MoeReference, MixtralWithOneExpertIsALlama) {
  nlohmann::json c = MixtralConfig();
  c["num_local_experts"] = 1;
  c["num_experts_per_tok"] = 1;
  const HfWeights w = RandomWeightsFor(c, 10);
  const torch::Tensor ids = Ids(2, 7, 64, 11);
  const torch::Tensor llama = ReferenceLogits(LlamaLike(c), AsLlama(w, 2, 0), ids);
  EXPECT_LT(MaxAbsDiff(ConfigReferenceLogits(c, w, ids), llama), 1e-5);
}

TEST(MoeReference, MixtralRoutingToEveryIdenticalExpertIsTheDenseMlp) {
  nlohmann::json c = MixtralConfig();
  c["num_experts_per_tok"] = 4;  // every expert, weights renormalised to sum 1
  HfWeights w = RandomWeightsFor(c, 12);
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".block_sparse_moe.experts.";
    for (int e = 1; e < 4; ++e) {
      for (const char* n : {".w1.weight", ".w2.weight", ".w3.weight"}) {
        w[p + std::to_string(e) + n] = w.at(p + "0" + n).clone();
      }
    }
  }
  const torch::Tensor ids = Ids(1, 8, 64, 13);
  const torch::Tensor llama = ReferenceLogits(LlamaLike(c), AsLlama(w, 2, 0), ids);
  EXPECT_LT(MaxAbsDiff(ConfigReferenceLogits(c, w, ids), llama), 1e-5);
}

// ---- Routing token by token -------------------------------------------------------------------

// One-layer model whose attention output is zero (o_proj = 0), so the MoE block sees
// post_attention_layernorm(embed(id)) and its output can be recomputed per token.
struct OneLayerMoe {
  nlohmann::json config;
  HfWeights weights;
};

OneLayerMoe ZeroAttention(nlohmann::json c, uint64_t seed) {
  c["num_hidden_layers"] = 1;
  c.erase("mlp_only_layers");
  HfWeights w = RandomWeightsFor(c, seed);
  w["model.layers.0.self_attn.o_proj.weight"].zero_();
  return {c, w};
}

std::vector<double> LlamaNorm(const std::vector<double>& x, const torch::Tensor& w, double eps) {
  double ms = 0;
  for (double v : x) ms += v * v;
  ms /= static_cast<double>(x.size());
  const std::vector<double> wd = Row(w.unsqueeze(0), 0);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = wd[i] * x[i] / std::sqrt(ms + eps);
  return y;
}

std::vector<double> SwiGluByHand(const HfWeights& w, const std::string& gate, const std::string& up,
                                 const std::string& down, const std::vector<double>& x) {
  const std::vector<double> g = MatVec(w.at(gate), x), u = MatVec(w.at(up), x);
  std::vector<double> a(g.size());
  for (size_t i = 0; i < g.size(); ++i) a[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
  return MatVec(w.at(down), a);
}

// Per token: router logits, softmax, the k largest by sorting, weights (renormalised when asked),
// the chosen experts' outputs summed, the shared expert (Qwen2-MoE), final norm and head.
// Returns the logits [T][vocab] and fills `router` [T][E].
std::vector<std::vector<double>> MoeByHand(const OneLayerMoe& m, const std::vector<int64_t>& ids,
                                           bool qwen, bool renormalize,
                                           std::vector<std::vector<double>>* router) {
  const nlohmann::json& c = m.config;
  const HfWeights& w = m.weights;
  const double eps = c["rms_norm_eps"];
  const int64_t k = c["num_experts_per_tok"];
  const std::string p = qwen ? "model.layers.0.mlp." : "model.layers.0.block_sparse_moe.";
  std::vector<std::vector<double>> logits;
  for (int64_t id : ids) {
    std::vector<double> h = Row(w.at("model.embed_tokens.weight"), id);
    const std::vector<double> x =
        LlamaNorm(h, w.at("model.layers.0.post_attention_layernorm.weight"), eps);
    const std::vector<double> r = MatVec(w.at(p + "gate.weight"), x);
    router->push_back(r);
    const double top = *std::max_element(r.begin(), r.end());
    std::vector<double> prob(r.size());
    double z = 0;
    for (size_t e = 0; e < r.size(); ++e) z += (prob[e] = std::exp(r[e] - top));
    for (double& v : prob) v /= z;
    std::vector<int64_t> order(r.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return prob[a] > prob[b]; });
    double chosen_sum = 0;
    for (int64_t j = 0; j < k; ++j) chosen_sum += prob[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[j];
      const std::string x_p = p + "experts." + std::to_string(e) + ".";
      const std::vector<double> y =
          qwen ? SwiGluByHand(w, x_p + "gate_proj.weight", x_p + "up_proj.weight",
                              x_p + "down_proj.weight", x)
               : SwiGluByHand(w, x_p + "w1.weight", x_p + "w3.weight", x_p + "w2.weight", x);
      const double weight = renormalize ? prob[e] / chosen_sum : prob[e];
      for (size_t i = 0; i < h.size(); ++i) h[i] += weight * y[i];
    }
    if (qwen) {
      const std::vector<double> y =
          SwiGluByHand(w, p + "shared_expert.gate_proj.weight", p + "shared_expert.up_proj.weight",
                       p + "shared_expert.down_proj.weight", x);
      const double gate = 1 / (1 + std::exp(-MatVec(w.at(p + "shared_expert_gate.weight"), x)[0]));
      for (size_t i = 0; i < h.size(); ++i) h[i] += gate * y[i];
    }
    logits.push_back(MatVec(w.at("lm_head.weight"), LlamaNorm(h, w.at("model.norm.weight"), eps)));
  }
  return logits;
}

void ExpectRoutingMatchesByHand(const OneLayerMoe& m, bool qwen, bool renormalize) {
  const torch::Tensor ids = Ids(1, 12, 64, 14);
  const std::vector<int64_t> seq(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 12);
  std::vector<std::vector<double>> router_by_hand;
  const auto by_hand = MoeByHand(m, seq, qwen, renormalize, &router_by_hand);
  const torch::Tensor logits = ConfigReferenceLogits(m.config, m.weights, ids);
  double worst = 0;
  for (int64_t i = 0; i < 12; ++i) {
    for (int64_t v = 0; v < 64; ++v) {
      worst = std::max(worst, std::abs(logits[0][i][v].item<double>() - by_hand[i][v]));
    }
  }
  EXPECT_LT(worst, 1e-5);
  // The tokens do not all pick the same experts (else routing would be untested).
  std::set<std::vector<int64_t>> choices;
  for (const auto& r : router_by_hand) {
    std::vector<int64_t> order(r.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return r[a] > r[b]; });
    order.resize(static_cast<size_t>(m.config["num_experts_per_tok"].get<int64_t>()));
    std::sort(order.begin(), order.end());
    choices.insert(order);
  }
  EXPECT_GE(choices.size(), 3u);
}

TEST(MoeReference, MixtralRoutingMatchesATokenByTokenLoop) {
  ExpectRoutingMatchesByHand(ZeroAttention(MixtralConfig(), 15), false, /*renormalize=*/true);
}

TEST(MoeReference, Qwen2MoeRoutingMatchesATokenByTokenLoop) {
  nlohmann::json c = Qwen2MoeConfig();
  ExpectRoutingMatchesByHand(ZeroAttention(c, 16), true, /*renormalize=*/false);
  c["norm_topk_prob"] = true;
  ExpectRoutingMatchesByHand(ZeroAttention(c, 16), true, /*renormalize=*/true);
}

TEST(MoeReference, RouterLogitsComeFromTheMoeLayersOnly) {
  // decoder_sparse_step 2 makes layers 1 and 3 sparse; mlp_only_layers [3] leaves layer 1.
  nlohmann::json c = Qwen2MoeConfig();
  c["num_hidden_layers"] = 4;
  c["decoder_sparse_step"] = 2;
  c["mlp_only_layers"] = {3};
  const HfWeights w = RandomWeightsFor(c, 17);
  EXPECT_EQ(w.count("model.layers.1.mlp.gate.weight"), 1u);
  for (int i : {0, 2, 3}) {
    EXPECT_EQ(w.count("model.layers." + std::to_string(i) + ".mlp.down_proj.weight"), 1u) << i;
  }
  const torch::Tensor ids = Ids(2, 5, 64, 18);
  std::vector<torch::Tensor> router;
  families::MoeLogits(c, w, ids, &router);
  ASSERT_EQ(router.size(), 1u);
  EXPECT_EQ(router[0].sizes(), (std::vector<int64_t>{10, 6}));
  c["mlp_only_layers"] = {1, 3};  // no MoE layer left: nothing to balance
  EXPECT_EQ(ConfigReferenceRouterAuxLoss(c, RandomWeightsFor(c, 17), ids), 0.0);
}

// ---- The load-balancing loss by hand ----------------------------------------------------------

TEST(MoeReference, LoadBalancingLossOfTinyRouterLogitsByHand) {
  // A 1-layer Mixtral made to produce chosen router logits: o_proj = 0 and norm weights 1, so the
  // router sees embed / rms(embed); two experts, top-1.
  nlohmann::json c = MixtralConfig();
  c["num_hidden_layers"] = 1;
  c["num_local_experts"] = 2;
  c["num_experts_per_tok"] = 1;
  c["hidden_size"] = 4;
  c["num_attention_heads"] = 2;
  c["num_key_value_heads"] = 1;
  HfWeights w = RandomWeightsFor(c, 19);
  w["model.layers.0.self_attn.o_proj.weight"].zero_();
  w["model.layers.0.post_attention_layernorm.weight"].fill_(1.0);
  // Token 0 embeds as (1, 1, 1, 1): normed (1, 1, 1, 1). Router row e reads coordinate e times
  // log(3): logits (0, log 3) -> p = (1/4, 3/4), expert 1 chosen. Token 1: (1, 1, 1, 1) too.
  w["model.embed_tokens.weight"][0].fill_(1.0);
  w["model.embed_tokens.weight"][1].fill_(1.0);
  torch::Tensor gate = torch::zeros({2, 4});
  gate[1][0] = std::log(3.0);
  w["model.layers.0.block_sparse_moe.gate.weight"] = gate;
  const torch::Tensor ids = torch::tensor({0, 1}, torch::kLong).unsqueeze(0);
  // f = (0, 1) (both tokens pick expert 1), P = (1/4, 3/4): loss = 2 * 3/4.
  EXPECT_NEAR(ConfigReferenceRouterAuxLoss(c, w, ids), 1.5, 1e-5);
  // Uniform routing (all logits equal): loss = E * sum_j,e f * (1/E) = top_k.
  w["model.layers.0.block_sparse_moe.gate.weight"].zero_();
  EXPECT_NEAR(ConfigReferenceRouterAuxLoss(c, w, ids), 1.0, 1e-5);
  c["num_experts_per_tok"] = 2;
  EXPECT_NEAR(ConfigReferenceRouterAuxLoss(c, w, ids), 2.0, 1e-5);
}

// load_balancing_loss_func recomputed with loops over the concatenated router logits.
double LoadBalancingByHand(const std::vector<std::vector<double>>& logits, int64_t k) {
  const size_t m = logits.size(), e_count = logits[0].size();
  std::vector<double> chosen_fraction(e_count, 0.0), mean_prob(e_count, 0.0);
  for (const auto& r : logits) {
    const double top = *std::max_element(r.begin(), r.end());
    std::vector<double> p(e_count);
    double z = 0;
    for (size_t e = 0; e < e_count; ++e) z += (p[e] = std::exp(r[e] - top));
    std::vector<size_t> order(e_count);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
    for (int64_t j = 0; j < k; ++j) chosen_fraction[order[j]] += 1.0 / m;
    for (size_t e = 0; e < e_count; ++e) mean_prob[e] += p[e] / z / m;
  }
  double loss = 0;
  for (size_t e = 0; e < e_count; ++e) loss += chosen_fraction[e] * mean_prob[e];
  return loss * static_cast<double>(e_count);
}

TEST(MoeReference, LoadBalancingLossOverAllLayersMatchesLoops) {
  // Two MoE layers: the loss concatenates both layers' router logits (as the forward reports
  // them) before the softmax, top-k and means.
  const nlohmann::json c = MixtralConfig();
  const HfWeights w = RandomWeightsFor(c, 20);
  const torch::Tensor ids = Ids(2, 6, 64, 21);
  std::vector<torch::Tensor> router;
  families::MoeLogits(c, w, ids, &router);
  ASSERT_EQ(router.size(), 2u);
  std::vector<std::vector<double>> rows;
  for (const torch::Tensor& layer : router) {
    ASSERT_EQ(layer.sizes(), (std::vector<int64_t>{12, 4}));
    for (int64_t i = 0; i < 12; ++i) rows.push_back(Row(layer, i));
  }
  const double aux = ConfigReferenceRouterAuxLoss(c, w, ids);
  EXPECT_NEAR(aux, LoadBalancingByHand(rows, 2), 1e-5);
  EXPECT_GT(aux, 2.0);  // above its value for uniform routing

  // ConfigReferenceLoss adds router_aux_loss_coef x aux when output_router_logits is set.
  nlohmann::json with_aux = c;
  with_aux["output_router_logits"] = true;
  const torch::Tensor windows = Ids(2, 7, 64, 22);
  const double total = ConfigReferenceLoss(with_aux, w, windows);
  const double plain = ConfigReferenceLoss(c, w, windows);
  EXPECT_NEAR(total - plain, 0.02 * ConfigReferenceRouterAuxLoss(c, w, windows.narrow(1, 0, 6)),
              1e-9);
}

TEST(MoeReference, LoadBalancingLossOfOneLayerMatchesLoops) {
  // One layer: the router logits are recomputed token by token (o_proj = 0), then the loss by
  // loops.
  const OneLayerMoe m = ZeroAttention(MixtralConfig(), 23);
  const torch::Tensor ids = Ids(1, 12, 64, 14);
  const std::vector<int64_t> seq(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 12);
  std::vector<std::vector<double>> router;
  MoeByHand(m, seq, false, true, &router);
  EXPECT_NEAR(ConfigReferenceRouterAuxLoss(m.config, m.weights, ids),
              LoadBalancingByHand(router, 2), 1e-5);
}

// ---- Planted bugs -----------------------------------------------------------------------------

void ExpectBugChangesLogits(const std::string& bug, const nlohmann::json& c) {
  const HfWeights w = RandomWeightsFor(c, 24);
  const torch::Tensor ids = Ids(2, 10, 64, 25);
  const torch::Tensor good = ConfigReferenceLogits(c, w, ids);
  torch::Tensor bad;
  {
    PlantedBug planted(bug);
    bad = ConfigReferenceLogits(c, w, ids);
  }
  EXPECT_GT(MaxAbsDiff(good, bad), 1e-3) << bug;
  EXPECT_TRUE(ConfigReferenceLogits(c, w, ids).equal(good)) << bug << " was not removed";
}

TEST(PlantedBugs, EachChangesTheNumbers) {
  nlohmann::json gemma = Gemma2Config();
  gemma["attn_logit_softcapping"] = 5.0;
  gemma["final_logit_softcapping"] = 3.0;
  ExpectBugChangesLogits("gemma2_norm_without_one", gemma);
  ExpectBugChangesLogits("gemma2_no_softcap", gemma);
  ExpectBugChangesLogits("gemma2_all_layers_global", gemma);

  const nlohmann::json qwen = Qwen2MoeConfig();  // norm_topk_prob false
  ExpectBugChangesLogits("moe_softmax_after_topk", qwen);
  ExpectBugChangesLogits("moe_no_topk_renormalization", qwen);
  ExpectBugChangesLogits("qwen2moe_no_shared_expert_gate", qwen);
  ExpectBugChangesLogits("moe_no_topk_renormalization", MixtralConfig());

  // Mixtral renormalises, so taking the softmax after top-k gives the same routing weights; the
  // bug shows in the load-balancing loss instead.
  const nlohmann::json mixtral = MixtralConfig();
  const HfWeights w = RandomWeightsFor(mixtral, 26);
  const torch::Tensor ids = Ids(2, 10, 64, 27);
  const double good = ConfigReferenceRouterAuxLoss(mixtral, w, ids);
  PlantedBug planted("moe_softmax_after_topk");
  EXPECT_GT(std::abs(ConfigReferenceRouterAuxLoss(mixtral, w, ids) - good), 1e-4);
}

// ---- Configs the reference refuses ------------------------------------------------------------

TEST(MoeReference, RefusesWhatItDoesNotCover) {
  nlohmann::json c = MixtralConfig();
  c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_THROW(RandomWeightsFor(c, 1), std::invalid_argument);
  c = MixtralConfig();
  c["num_experts_per_tok"] = 5;
  EXPECT_THROW(RandomWeightsFor(c, 1), std::invalid_argument);
  // Qwen2-MoE's use_sliding_window is computed (transformers' current layer rule, or layer_types).
  c = Qwen2MoeConfig();
  c["use_sliding_window"] = true;
  EXPECT_NO_THROW(RandomWeightsFor(c, 1));
  c["layer_types"] = {"sliding_attention", "full_attention", "full_attention"};
  EXPECT_NO_THROW(RandomWeightsFor(c, 1));
  c = Gemma2Config();
  c["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  EXPECT_THROW(RandomWeightsFor(c, 1), std::invalid_argument);
  c = Gemma2Config();
  c["num_attention_heads"] = 3;
  EXPECT_THROW(RandomWeightsFor(c, 1), std::invalid_argument);
}

}  // namespace
}  // namespace strata::testing
