// Self-tests of the dense-family reference (hf_reference_dense.cc, reached through
// hf_config_reference.h). Each checks the reference against something computed another way:
// hf_reference.h's Llama reference, the same model with the window or rope written differently,
// frequencies computed by hand in double, a Llama assembled from Phi3's split fused weights, and
// perturbations that a sliding window must not see.
#include "tests/testing/hf_reference_dense.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/hf_config_reference.h"
#include "tests/testing/hf_reference.h"

namespace strata::testing {
namespace {

using nlohmann::json;

// ---- Shrunk versions of published config.json files (same keys, tiny sizes). -----------------

// mistralai/Mistral-7B-v0.1, with hidden 4096 -> 32, 32 layers -> 2, sliding_window 4096 -> 5.
json MistralConfig() {
  return json::parse(R"({
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
    "intermediate_size": 64, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 5,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 61})");
}

// Qwen/Qwen2.5-7B-Instruct with the yarn rope_scaling its model card recommends for long inputs.
json Qwen25YarnConfig() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
    "intermediate_size": 48, "max_position_embeddings": 32768, "max_window_layers": 28,
    "model_type": "qwen2", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 67,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}})");
}

// microsoft/Phi-3-mini-4k-instruct (sliding_window 2047 in the published file; null here unless
// a test sets it).
json Phi3MiniConfig() {
  return json::parse(R"({
    "architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 32,
    "initializer_range": 0.02, "intermediate_size": 40, "max_position_embeddings": 4096,
    "model_type": "phi3", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 4, "original_max_position_embeddings": 4096, "pad_token_id": 70,
    "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.2", "use_cache": true, "vocab_size": 71})");
}

// microsoft/Phi-3-mini-128k-instruct: longrope with short/long factors of length head_dim / 2
// (head_dim 8 here), original 4096 -> 16 and max 131072 -> 512 (factor 32 as published).
json Phi3LongConfig() {
  json c = Phi3MiniConfig();
  c["max_position_embeddings"] = 512;
  c["original_max_position_embeddings"] = 16;
  c["rope_scaling"] = json::parse(R"({"long_factor": [1.2, 2.5, 6.0, 11.0],
                                      "short_factor": [1.0, 1.1, 1.3, 1.7], "type": "longrope"})");
  return c;
}

// meta-llama/Llama-3.1-8B with its llama3 rope_scaling (original 8192 -> 64).
json Llama31Config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 32,
    "initializer_range": 0.02, "intermediate_size": 56, "max_position_embeddings": 1024,
    "mlp_bias": false, "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 64, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 53})");
}

torch::Tensor Ids(const json& config, int64_t b, int64_t t, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randint(config["vocab_size"].get<int64_t>(), {b, t}, torch::kLong);
}

torch::Tensor Logits(const json& config, const HfWeights& w, const torch::Tensor& ids) {
  return ConfigReferenceLogits(config, w, ids);
}

double MaxDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

std::set<std::string> Names(const HfWeights& w) {
  std::set<std::string> out;
  for (const auto& [name, t] : w) out.insert(name);
  return out;
}

// ---- Agreement with hf_reference.h's Llama/Mistral/Qwen2 reference.
// ------------------------------

TEST(HfReferenceDense, PlainFamiliesMatchTheLlamaReference) {
  std::vector<LlamaSpec> specs(5);
  specs[0].attention_bias = specs[0].mlp_bias = true;
  specs[1].architecture = "MistralForCausalLM";
  specs[2].architecture = "Qwen2ForCausalLM";
  specs[2].tie_word_embeddings = true;
  specs[3].rope_scaling = Llama3Scaling{8.0, 1.0, 4.0, 64};
  specs[3].max_position_embeddings = 1024;
  specs[4].head_dim = 24;
  for (LlamaSpec& s : specs) {
    s.vocab_size = 29;
    s.hidden_size = 32;
    s.intermediate_size = 40;
  }
  for (const LlamaSpec& spec : specs) {
    SCOPED_TRACE(spec.architecture + " head_dim " + std::to_string(spec.head_dim));
    const json config = LlamaConfigJson(spec, "float32");
    const HfWeights w = RandomWeightsFor(config, 11);
    const auto expected_w = RandomLlamaWeights(spec, 11);
    ASSERT_EQ(Names(w), Names(expected_w));
    for (const auto& [name, t] : expected_w) EXPECT_TRUE(torch::equal(w.at(name), t)) << name;
    torch::manual_seed(3);
    const torch::Tensor ids = torch::randint(spec.vocab_size, {2, 13}, torch::kLong);
    EXPECT_LT(MaxDiff(Logits(config, w, ids), ReferenceLogits(spec, w, ids)), 1e-6);
  }
}

TEST(HfReferenceDense, WeightsAreTransformersParameterSet) {
  const json phi3 = Phi3MiniConfig();
  const HfWeights w = RandomWeightsFor(phi3, 5);
  std::set<std::string> expected = {"model.embed_tokens.weight", "model.norm.weight",
                                    "lm_head.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* n :
         {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.qkv_proj.weight",
          "self_attn.o_proj.weight", "mlp.gate_up_proj.weight", "mlp.down_proj.weight"}) {
      expected.insert(p + n);
    }
  }
  EXPECT_EQ(Names(w), expected);
  EXPECT_EQ(w.at("model.layers.0.self_attn.qkv_proj.weight").sizes(),
            torch::IntArrayRef({32 + 2 * 32, 32}));
  EXPECT_EQ(w.at("model.layers.1.mlp.gate_up_proj.weight").sizes(), torch::IntArrayRef({80, 32}));
  // Deterministic in (config, seed); another seed draws other numbers.
  EXPECT_TRUE(torch::equal(RandomWeightsFor(phi3, 5).at("lm_head.weight"), w.at("lm_head.weight")));
  EXPECT_FALSE(
      torch::equal(RandomWeightsFor(phi3, 6).at("lm_head.weight"), w.at("lm_head.weight")));

  json tied = Phi3MiniConfig();
  tied["tie_word_embeddings"] = true;
  EXPECT_EQ(RandomWeightsFor(tied, 5).count("lm_head.weight"), 0u);

  // Qwen2: q, k, v biases and no o bias.
  const HfWeights q = RandomWeightsFor(Qwen25YarnConfig(), 5);
  EXPECT_EQ(q.count("model.layers.0.self_attn.k_proj.bias"), 1u);
  EXPECT_EQ(q.count("model.layers.0.self_attn.o_proj.bias"), 0u);
  json qwen_null_kv = Qwen25YarnConfig();
  qwen_null_kv["num_key_value_heads"] = nullptr;  // null: as many kv heads as heads
  EXPECT_EQ(RandomWeightsFor(qwen_null_kv, 5).at("model.layers.0.self_attn.v_proj.bias").size(0),
            32);
  json llama_defaults = Llama31Config();
  llama_defaults.erase("num_key_value_heads");  // LlamaConfig: kv heads = attention heads
  EXPECT_EQ(
      RandomWeightsFor(llama_defaults, 5).at("model.layers.0.self_attn.k_proj.weight").size(0), 32);
}

// ---- Sliding window.
// ---------------------------------------------------------------------------------

TEST(HfReferenceDense, SlidingWindowMasksExactlyTheKeysBeyondIt) {
  json full = MistralConfig();
  full["sliding_window"] = nullptr;
  const json windowed = MistralConfig();  // window 5
  const HfWeights w = RandomWeightsFor(windowed, 7);
  const torch::Tensor ids = Ids(windowed, 1, 16, 1);
  const torch::Tensor reference = Logits(full, w, ids);

  // A window covering the whole sequence is full attention.
  for (int64_t window : {16, 40}) {
    json c = MistralConfig();
    c["sliding_window"] = window;
    EXPECT_EQ(MaxDiff(Logits(c, w, ids), reference), 0.0) << window;
  }
  // Window 5: positions 0..4 see all their keys; every later position loses some.
  const torch::Tensor sliding = Logits(windowed, w, ids);
  EXPECT_EQ(MaxDiff(sliding.narrow(1, 0, 5), reference.narrow(1, 0, 5)), 0.0);
  for (int64_t pos = 5; pos < 16; ++pos) {
    EXPECT_GT(MaxDiff(sliding.select(1, pos), reference.select(1, pos)), 1e-4) << pos;
  }

  // Perturbing token 0 reaches at most 2 layers x (5 - 1) = 8 positions further.
  torch::Tensor perturbed_ids = ids.clone();
  perturbed_ids[0][0] = (ids[0][0].item<int64_t>() + 1) % 61;
  const torch::Tensor perturbed = Logits(windowed, w, perturbed_ids);
  EXPECT_GT(MaxDiff(perturbed.select(1, 4), sliding.select(1, 4)), 1e-4);
  EXPECT_EQ(MaxDiff(perturbed.narrow(1, 9, 7), sliding.narrow(1, 9, 7)), 0.0);
  // Without the window it does reach the end.
  EXPECT_GT(MaxDiff(Logits(full, w, perturbed_ids).select(1, 15), reference.select(1, 15)), 1e-6);

  // The planted off-by-one is exactly a window one key wider.
  json wider = MistralConfig();
  wider["sliding_window"] = 6;
  PlantBug("sliding_window_off_by_one");
  const torch::Tensor buggy = Logits(windowed, w, ids);
  PlantBug("");
  EXPECT_EQ(MaxDiff(buggy, Logits(wider, w, ids)), 0.0);
  EXPECT_GT(MaxDiff(buggy, sliding), 1e-4);
}

TEST(HfReferenceDense, Qwen2SlidesTheLayersFromMaxWindowLayersOn) {
  json base = Qwen25YarnConfig();
  base.erase("rope_scaling");
  base["sliding_window"] = 4;
  const HfWeights w = RandomWeightsFor(base, 9);
  const torch::Tensor ids = Ids(base, 2, 12, 2);
  const torch::Tensor full = Logits(base, w, ids);  // use_sliding_window false: window ignored

  json second_slides = base;
  second_slides["use_sliding_window"] = true;
  second_slides["max_window_layers"] = 1;  // layer 0 full, layer 1 sliding
  const torch::Tensor mixed = Logits(second_slides, w, ids);
  EXPECT_GT(MaxDiff(mixed, full), 1e-4);

  json explicit_types = base;
  explicit_types["use_sliding_window"] = true;
  explicit_types["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_EQ(MaxDiff(Logits(explicit_types, w, ids), mixed), 0.0);
  explicit_types["layer_types"] = {"sliding_attention", "full_attention"};
  EXPECT_GT(MaxDiff(Logits(explicit_types, w, ids), mixed), 1e-4);

  json null_window = second_slides;
  null_window["sliding_window"] = nullptr;  // use_sliding_window with no window: nothing slides
  EXPECT_EQ(MaxDiff(Logits(null_window, w, ids), full), 0.0);

  json none_slide = second_slides;
  none_slide["max_window_layers"] = 2;
  EXPECT_EQ(MaxDiff(Logits(none_slide, w, ids), full), 0.0);
}

// ---- Phi3.
// ---------------------------------------------------------------------------------------------

// The Llama (or Mistral) whose q/k/v and gate/up are the row blocks of Phi3's fused weights.
HfWeights SplitPhi3(const HfWeights& phi3, int64_t q_out, int64_t kv_out, int64_t inter) {
  HfWeights out;
  for (const auto& [name, t] : phi3) {
    const auto at = name.find("self_attn.qkv_proj.weight");
    const auto gu = name.find("mlp.gate_up_proj.weight");
    if (at != std::string::npos) {
      const std::string p = name.substr(0, at) + "self_attn.";
      out[p + "q_proj.weight"] = t.narrow(0, 0, q_out);
      out[p + "k_proj.weight"] = t.narrow(0, q_out, kv_out);
      out[p + "v_proj.weight"] = t.narrow(0, q_out + kv_out, kv_out);
    } else if (gu != std::string::npos) {
      const std::string p = name.substr(0, gu) + "mlp.";
      out[p + "gate_proj.weight"] = t.narrow(0, 0, inter);
      out[p + "up_proj.weight"] = t.narrow(0, inter, inter);
    } else {
      out[name] = t;
    }
  }
  return out;
}

json LlamaTwinOf(const json& phi3, const std::string& arch) {
  json c = phi3;
  c["architectures"] = {arch};
  c["model_type"] = arch == "MistralForCausalLM" ? "mistral" : "llama";
  c.erase("original_max_position_embeddings");
  if (arch != "MistralForCausalLM") c.erase("sliding_window");
  return c;
}

TEST(HfReferenceDense, Phi3FusedWeightsEqualALlamaOfTheirBlocks) {
  json phi3 = Phi3MiniConfig();
  phi3["num_key_value_heads"] = 2;
  const HfWeights w = RandomWeightsFor(phi3, 13);
  const HfWeights split = SplitPhi3(w, 32, 16, 40);
  const torch::Tensor ids = Ids(phi3, 2, 14, 4);
  const torch::Tensor phi3_logits = Logits(phi3, w, ids);
  // One fused matmul and its split blocks round differently (the blocking depends on the CPU's
  // GEMM kernel: 1.7e-6 on an AMD EPYC, below 1e-6 on the Intel machines): 1e-5 is still 10x
  // below what each planted bug moves (> 1e-4).
  constexpr double kFusedVsSplit = 1e-5;
  EXPECT_LT(MaxDiff(phi3_logits, Logits(LlamaTwinOf(phi3, "LlamaForCausalLM"), split, ids)),
            kFusedVsSplit);

  // Phi3's sliding_window slides every layer, as Mistral's does.
  phi3["sliding_window"] = 6;
  const torch::Tensor phi3_sliding = Logits(phi3, w, ids);
  EXPECT_GT(MaxDiff(phi3_sliding, phi3_logits), 1e-4);
  EXPECT_LT(MaxDiff(phi3_sliding, Logits(LlamaTwinOf(phi3, "MistralForCausalLM"), split, ids)),
            kFusedVsSplit);

  // gate comes first in gate_up_proj: the planted swap is the Llama with gate and up exchanged.
  HfWeights exchanged = split;
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".mlp.";
    std::swap(exchanged[p + "gate_proj.weight"], exchanged[p + "up_proj.weight"]);
  }
  PlantBug("phi3_gate_up_swapped");
  const torch::Tensor swapped = Logits(phi3, w, ids);
  PlantBug("");
  EXPECT_GT(MaxDiff(swapped, phi3_sliding), 1e-4);
  EXPECT_LT(MaxDiff(swapped, Logits(LlamaTwinOf(phi3, "MistralForCausalLM"), exchanged, ids)),
            kFusedVsSplit);
}

TEST(HfReferenceDense, Phi3PartialRotaryRotatesOnlyTheFirstDims) {
  json phi3 = Phi3MiniConfig();
  phi3["partial_rotary_factor"] = 0.5;
  const families::DenseRopeTables rope = families::DenseRope(phi3, 10);
  EXPECT_EQ(rope.rotary_dim, 4);
  EXPECT_EQ(rope.cos.sizes(), torch::IntArrayRef({10, 4}));
  // inv_freq = 1 / theta^(2i / rotary_dim).
  EXPECT_NEAR(rope.inv_freq[1].item<double>(), 1.0 / std::pow(10000.0, 2.0 / 4.0), 1e-9);
  const HfWeights w = RandomWeightsFor(phi3, 3);
  const torch::Tensor ids = Ids(phi3, 1, 10, 5);
  EXPECT_GT(MaxDiff(Logits(phi3, w, ids), Logits(Phi3MiniConfig(), w, ids)), 1e-4);
}

// ---- RoPE scaling types.
// --------------------------------------------------------------------------------

json WithRope(json config, const json& rope_scaling) {
  config["rope_scaling"] = rope_scaling;
  return config;
}

json SmallLlama() {
  json c = Llama31Config();
  c["rope_scaling"] = nullptr;
  c["rope_theta"] = 10000.0;
  c["max_position_embeddings"] = 16;
  return c;
}

TEST(HfReferenceDense, LinearScalingIsDefaultRopeAtPositionsOverFactor) {
  const families::DenseRopeTables plain = families::DenseRope(SmallLlama(), 20);
  const json linear = WithRope(SmallLlama(), {{"type", "linear"}, {"factor", 4.0}});
  const families::DenseRopeTables scaled = families::DenseRope(linear, 20);
  const torch::Tensor positions = torch::arange(20, torch::kDouble) / 4.0;
  const torch::Tensor freqs = torch::outer(positions, plain.inv_freq.to(torch::kDouble));
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  EXPECT_LT(MaxDiff(scaled.cos.to(torch::kDouble), emb.cos()), 1e-5);
  EXPECT_LT(MaxDiff(scaled.sin.to(torch::kDouble), emb.sin()), 1e-5);
  EXPECT_GT(MaxDiff(scaled.cos, plain.cos), 0.1);
}

TEST(HfReferenceDense, DynamicNtkRecomputesOnlyPastMaxPositions) {
  const json dynamic = WithRope(SmallLlama(), {{"rope_type", "dynamic"}, {"factor", 2.0}});
  EXPECT_TRUE(torch::equal(families::DenseRope(dynamic, 16).inv_freq,
                           families::DenseRope(SmallLlama(), 16).inv_freq));
  // T = 24 > 16: base = theta * (2 * 24 / 16 - 1)^(8 / 6), head_dim 8.
  const torch::Tensor inv = families::DenseRope(dynamic, 24).inv_freq;
  const double base = 10000.0 * std::pow(2.0 * 24 / 16 - 1.0, 8.0 / 6.0);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(inv[i].item<double>() / std::pow(base, -2.0 * i / 8.0), 1.0, 1e-5) << i;
  }
}

// _compute_yarn_parameters by hand, in double, for one rotary dim.
std::vector<double> HandYarn(double theta, int dim, double factor, double original, bool truncate) {
  auto correction = [&](double rotations) {
    return dim * std::log(original / (rotations * 2 * M_PI)) / (2 * std::log(theta));
  };
  double low = correction(32), high = correction(1);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  std::vector<double> out;
  for (int i = 0; i < dim / 2; ++i) {
    const double extrapolated = std::pow(theta, -2.0 * i / dim);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    out.push_back(extrapolated / factor * ramp + extrapolated * (1 - ramp));
  }
  return out;
}

TEST(HfReferenceDense, YarnFrequenciesAndAttentionFactorMatchHandComputation) {
  const json qwen = Qwen25YarnConfig();  // theta 1e6, head_dim 8, factor 4, original 32768
  const families::DenseRopeTables rope = families::DenseRope(qwen, 6);
  const std::vector<double> expected = HandYarn(1e6, 8, 4.0, 32768, true);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(rope.inv_freq[i].item<double>() / expected[i], 1, 1e-5);
  // The ramp really blends here: dims 0-1 extrapolate, 2 is half-way, 3 interpolates.
  EXPECT_NEAR(expected[3], std::pow(1e6, -6.0 / 8) / 4, 1e-12);
  EXPECT_NEAR(rope.attention_scaling, 0.1 * std::log(4.0) + 1.0, 1e-12);
  EXPECT_NEAR(rope.cos[0][0].item<double>(), rope.attention_scaling, 1e-6);

  json untruncated = qwen;
  untruncated["rope_scaling"]["truncate"] = false;
  const std::vector<double> smooth = HandYarn(1e6, 8, 4.0, 32768, false);
  const torch::Tensor inv = families::DenseRope(untruncated, 6).inv_freq;
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(inv[i].item<double>() / smooth[i], 1, 1e-5);

  json explicit_factor = qwen;
  explicit_factor["rope_scaling"]["attention_factor"] = 1.5;
  EXPECT_DOUBLE_EQ(families::DenseRope(explicit_factor, 6).attention_scaling, 1.5);
  json mscale = qwen;
  mscale["rope_scaling"]["mscale"] = 1.0;
  mscale["rope_scaling"]["mscale_all_dim"] = 0.5;
  EXPECT_NEAR(families::DenseRope(mscale, 6).attention_scaling,
              (0.1 * std::log(4.0) + 1) / (0.05 * std::log(4.0) + 1), 1e-12);
}

TEST(HfReferenceDense, LongropeSwitchesToLongFactorsPastTheOriginalLength) {
  const json phi3 = Phi3LongConfig();
  const std::vector<double> short_f = {1.0, 1.1, 1.3, 1.7}, long_f = {1.2, 2.5, 6.0, 11.0};
  const families::DenseRopeTables at16 = families::DenseRope(phi3, 16);
  const families::DenseRopeTables at17 = families::DenseRope(phi3, 17);
  for (int i = 0; i < 4; ++i) {
    const double plain = std::pow(10000.0, -2.0 * i / 8);
    EXPECT_NEAR(at16.inv_freq[i].item<double>() * short_f[i] / plain, 1, 1e-5) << i;
    EXPECT_NEAR(at17.inv_freq[i].item<double>() * long_f[i] / plain, 1, 1e-5) << i;
  }
  // factor = 512 / 16 = 32: attention factor sqrt(1 + ln 32 / ln 16) at every length.
  const double attention = std::sqrt(1 + std::log(32.0) / std::log(16.0));
  EXPECT_NEAR(at16.attention_scaling, attention, 1e-12);
  EXPECT_NEAR(at17.attention_scaling, attention, 1e-12);

  // The legacy names Phi-3 checkpoints shipped ("su", "yarn") are longrope.
  for (const char* legacy : {"su", "yarn"}) {
    json c = phi3;
    c["rope_scaling"]["type"] = legacy;
    EXPECT_TRUE(torch::equal(families::DenseRope(c, 17).cos, at17.cos)) << legacy;
  }
  json dynamic = phi3;
  dynamic["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  EXPECT_THROW(families::DenseRope(dynamic, 4), std::invalid_argument);
}

TEST(HfReferenceDense, Llama3RopeOfTheConfigMatchesTheLlamaReference) {
  LlamaSpec spec;
  spec.hidden_size = 32;
  spec.rope_theta = 500000.0;
  spec.rope_scaling = Llama3Scaling{8.0, 1.0, 4.0, 64};
  spec.max_position_embeddings = 1024;
  EXPECT_TRUE(torch::equal(families::DenseRope(Llama31Config(), 8).inv_freq, RopeInvFreq(spec)));
}

// ---- Every planted bug of this family changes the logits, and only while planted.
// ---------------------

TEST(HfReferenceDense, EachPlantedBugChangesTheLogits) {
  struct Case {
    const char* bug;
    json config;
    int64_t t;
  };
  json phi3_sliding = Phi3MiniConfig();
  phi3_sliding["sliding_window"] = 4;
  const std::vector<Case> cases = {
      {"sliding_window_off_by_one", MistralConfig(), 12},
      {"rope_linear_unscaled", WithRope(SmallLlama(), {{"type", "linear"}, {"factor", 4.0}}), 12},
      {"rope_dynamic_static", WithRope(SmallLlama(), {{"type", "dynamic"}, {"factor", 4.0}}), 24},
      {"rope_yarn_no_attention_factor", Qwen25YarnConfig(), 12},
      {"rope_longrope_short_factor_only", Phi3LongConfig(), 20},
      {"phi3_gate_up_swapped", phi3_sliding, 12},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.bug);
    const HfWeights w = RandomWeightsFor(c.config, 17);
    const torch::Tensor ids = Ids(c.config, 1, c.t, 6);
    const torch::Tensor before = Logits(c.config, w, ids);
    PlantBug(c.bug);
    const torch::Tensor planted = Logits(c.config, w, ids);
    PlantBug("");
    EXPECT_GT(MaxDiff(planted, before), 1e-4);
    EXPECT_TRUE(torch::equal(Logits(c.config, w, ids), before));
    EXPECT_TRUE(torch::isfinite(before).all().item<bool>());
  }
  // Bugs of length-dependent rope only bite past their threshold.
  const json dynamic = WithRope(SmallLlama(), {{"type", "dynamic"}, {"factor", 4.0}});
  const HfWeights w = RandomWeightsFor(dynamic, 17);
  const torch::Tensor ids = Ids(dynamic, 1, 16, 6);
  const torch::Tensor before = Logits(dynamic, w, ids);
  PlantBug("rope_dynamic_static");
  const torch::Tensor planted = Logits(dynamic, w, ids);
  PlantBug("");
  EXPECT_TRUE(torch::equal(planted, before));
}

TEST(HfReferenceDense, RejectsConfigsTransformersWouldNotBuild) {
  json bad_heads = MistralConfig();
  bad_heads["num_key_value_heads"] = 3;
  EXPECT_THROW(RandomWeightsFor(bad_heads, 1), std::invalid_argument);
  json short_factors = Phi3LongConfig();
  short_factors["rope_scaling"]["short_factor"] = {1.0, 1.0};
  EXPECT_THROW(RandomWeightsFor(short_factors, 1), std::invalid_argument);
  json unknown = SmallLlama();
  unknown["rope_scaling"] = {{"rope_type", "ntk-by-parts"}, {"factor", 2.0}};
  EXPECT_THROW(RandomWeightsFor(unknown, 1), std::invalid_argument);
}

}  // namespace
}  // namespace strata::testing
