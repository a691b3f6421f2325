// Gemma2ForCausalLM's shape and model below the CLI (hf_gemma2_cli_test.cc checks the numerics
// against the independent reference through `strata`): config.json as transformers reads it
// (defaults, layer_types, refusals naming the key and the file), the presets' published sizes,
// transformers' initialization (norm weights 0: they scale by 1 + weight), generation with the KV
// cache across sliding-window layers, and the reference's logits on the branches the CLI test's
// released-config shape leaves out.
#include "runtime/models/gemma2.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <numeric>
#include <string>
#include <vector>

#include "runtime/models/causal_lm.h"
#include "runtime/plan/llama_shape.h"
#include "runtime/plan/model_spec.h"
#include "tests/testing/hf_config_reference.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using json = nlohmann::json;

// A Gemma 2 config.json of test size: 3 layers, window 4, O(1) random weights.
json TinyConfig() {
  return json::parse(R"({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
    "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "query_pre_attn_scalar": 8, "sliding_window": 4, "attn_logit_softcapping": 5.0,
    "final_logit_softcapping": 3.0, "initializer_range": 0.5})");
}

Result<std::unique_ptr<CausalLm>> OpenConfig(const json& config) {
  STRATA_ASSIGN_OR_RETURN(LlamaShape shape, ParseHfConfig(config, "tiny/config.json"));
  ModelSpec spec;
  spec.name = "tiny";
  spec.llama = shape;
  spec.hf_config = HfConfigJson(shape, "float32");
  return OpenModel(std::move(spec), /*seed=*/3, /*eager=*/true);
}

TEST(Gemma2ShapeTest, PresetsHaveTheirPublishedSizes) {
  // Parameter counts of google/gemma-2-{2b,9b,27b} (safetensors totals / 4 bytes).
  EXPECT_EQ(LlamaTotalParams(*FindLlamaPreset("gemma-2-2b")), 2'614'341'888u);
  EXPECT_EQ(LlamaTotalParams(*FindLlamaPreset("gemma-2-9b")), 9'241'705'984u);
  EXPECT_EQ(LlamaTotalParams(*FindLlamaPreset("gemma-2-27b")), 27'227'128'320u);
  for (const char* name : {"gemma-2-2b", "gemma-2-9b", "gemma-2-27b"}) {
    const LlamaShape s = *FindLlamaPreset(name);
    const std::vector<uint64_t> numels = LlamaLayerTensorNumels(s);
    EXPECT_EQ(numels.size(), 11u) << name;  // 7 matrices and 4 norms, no biases
    EXPECT_EQ(std::accumulate(numels.begin(), numels.end(), uint64_t{0}), LlamaLayerParams(s))
        << name;
    // The config.json written for the preset reads back as the preset.
    Result<LlamaShape> back = ParseHfConfig(HfConfigJson(s, s.torch_dtype), "preset");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(LlamaTotalParams(*back), LlamaTotalParams(s)) << name;
    EXPECT_EQ(back->head_dim, s.head_dim) << name;
    EXPECT_EQ(back->query_pre_attn_scalar, s.query_pre_attn_scalar) << name;
    EXPECT_EQ(back->attn_logit_softcapping, s.attn_logit_softcapping) << name;
    EXPECT_EQ(back->final_logit_softcapping, s.final_logit_softcapping) << name;
    EXPECT_EQ(back->sliding_window, s.sliding_window) << name;
    EXPECT_EQ(back->sliding_layers, s.sliding_layers) << name;
    EXPECT_TRUE(back->tie_word_embeddings) << name;
  }
}

TEST(Gemma2ShapeTest, AbsentKeysTakeGemma2ConfigDefaults) {
  Result<LlamaShape> s = ParseHfConfig(json{{"architectures", {"Gemma2ForCausalLM"}}}, "c.json");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(LlamaTotalParams(*s), 2'614'341'888u);  // Gemma2Config() is gemma-2-2b
  EXPECT_EQ(s->num_key_value_heads, 4);
  EXPECT_EQ(s->head_dim, 256);
  EXPECT_EQ(s->attn_logit_softcapping, 50.0);
  EXPECT_EQ(s->final_logit_softcapping, 30.0);
  EXPECT_EQ(s->sliding_window, 4096);
  ASSERT_EQ(s->sliding_layers.size(), 26u);
  EXPECT_TRUE(s->sliding_layers[0]);  // layer 0 slides, layer 1 is global, ...
  EXPECT_FALSE(s->sliding_layers[1]);
  EXPECT_TRUE(s->sliding_layers[24]);
  EXPECT_EQ(s->hidden_activation, "gelu_pytorch_tanh");

  json c = TinyConfig();
  c["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention"};
  c["attn_logit_softcapping"] = nullptr;
  c["final_logit_softcapping"] = nullptr;
  s = ParseHfConfig(c, "c.json");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->sliding_layers, (std::vector<bool>{false, true, true}));
  EXPECT_FALSE(s->attn_logit_softcapping.has_value());
  EXPECT_FALSE(s->final_logit_softcapping.has_value());
}

TEST(Gemma2ShapeTest, RefusesWhatItCannotComputeNamingKeyAndFile) {
  const std::vector<std::pair<std::string, json>> bad = {
      {"hidden_activation", "relu"},         {"layer_types", {"sliding_attention"}},
      {"use_bidirectional_attention", true}, {"final_logit_softcapping", -1.0},
      {"query_pre_attn_scalar", 0},
  };
  for (const auto& [key, value] : bad) {
    json c = TinyConfig();
    c[key] = value;
    Result<LlamaShape> s = ParseHfConfig(c, "dir/config.json");
    ASSERT_FALSE(s.ok()) << key;
    EXPECT_NE(s.status().message().find(key), std::string::npos) << s.status().ToString();
    EXPECT_NE(s.status().message().find("dir/config.json"), std::string::npos) << key;
  }
}

// transformers' _init_weights: normal(0, initializer_range) matrices and embedding; the norms 0,
// which Gemma's RMSNorm applies as 1 + 0.
TEST(Gemma2ModelTest, RandomInitializationIsTransformers) {
  auto lm = OpenConfig(TinyConfig());
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  int norms = 0;
  for (const auto& item : (*lm)->module()->named_parameters()) {
    if (item.key().ends_with("norm.weight")) {
      ++norms;
      EXPECT_EQ(item.value().abs().max().item<float>(), 0.0f) << item.key();
    } else {
      EXPECT_NEAR(item.value().std().item<double>(), 0.5, 0.1) << item.key();
    }
  }
  EXPECT_EQ(norms, 3 * 4 + 1);
  EXPECT_EQ((*lm)->num_parameters(), LlamaTotalParams(*ParseHfConfig(TinyConfig(), "c")));
  EXPECT_GT((*lm)->max_seq_len(), 1'000'000);  // the window is computed, not a bound
}

// Generation with the KV cache past the window: a prompt, then one token at a time, gives the
// logits of one forward over the whole sequence; without the cache, the last token alone differs.
TEST(Gemma2ModelTest, IncrementalLogitsEqualTheFullForward) {
  auto lm = OpenConfig(TinyConfig());
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  ASSERT_TRUE((*lm)->supports_kv_cache());
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  const torch::Tensor ids = torch::randint((*lm)->vocab_size(), {2, 11}, torch::kInt64);
  const torch::Tensor full = (*lm)->Logits(ids);
  ASSERT_GT(full.abs().max().item<float>(), 0.5f);  // not a degenerate model

  (*lm)->SetKvCaching(true);
  std::vector<torch::Tensor> pieces = {(*lm)->LogitsAt(ids.slice(1, 0, 3), 0)};
  for (int64_t t = 3; t < 11; ++t) pieces.push_back((*lm)->LogitsAt(ids.slice(1, t, t + 1), t));
  const torch::Tensor incremental = torch::cat(pieces, 1);
  EXPECT_TRUE(torch::allclose(incremental, full, /*rtol=*/1e-5, /*atol=*/1e-5))
      << (incremental - full).abs().max().item<float>();

  (*lm)->SetKvCaching(false);
  const torch::Tensor alone = (*lm)->LogitsAt(ids.slice(1, 10, 11), 10);
  EXPECT_FALSE(torch::allclose(alone, full.slice(1, 10, 11), 1e-3, 1e-3));
}

// The window masks: the same weights with every layer global give other logits past the window,
// the same ones within it.
TEST(Gemma2ModelTest, SlidingLayersSeeOnlyTheWindow) {
  json global = TinyConfig();
  global["sliding_window"] = nullptr;
  auto windowed = OpenConfig(TinyConfig());
  auto full = OpenConfig(global);
  ASSERT_TRUE(windowed.ok() && full.ok());
  torch::NoGradGuard no_grad;
  torch::manual_seed(6);
  const torch::Tensor ids = torch::randint(96, {1, 10}, torch::kInt64);
  const torch::Tensor a = (*windowed)->Logits(ids), b = (*full)->Logits(ids);
  EXPECT_TRUE(torch::equal(a.slice(1, 0, 4), b.slice(1, 0, 4)));
  EXPECT_FALSE(torch::allclose(a.slice(1, 4), b.slice(1, 4), 1e-4, 1e-4));
}

// The branches the CLI test's released-config shape leaves out, against the reference's logits
// position by position: untied head, attention biases, exact GELU, listed layer_types, and an
// attention soft-cap strong enough to matter (the final one off), so the reference without it
// differs.
TEST(Gemma2ModelTest, LogitsMatchTheReferenceOnTheLessCommonBranches) {
  json c = TinyConfig();
  c["tie_word_embeddings"] = false;
  c["attention_bias"] = true;
  c["hidden_activation"] = "gelu";
  c["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention"};
  c["attn_logit_softcapping"] = 1.5;
  c["final_logit_softcapping"] = nullptr;
  strata::testing::TempDir dir("strata-gemma2");
  ASSERT_TRUE(dir.ok());
  const strata::testing::HfWeights weights = strata::testing::RandomWeightsFor(c, 4);
  ASSERT_TRUE(weights.count("lm_head.weight") &&
              weights.count("model.layers.0.self_attn.o_proj.bias"));
  strata::testing::WriteHfDirectory(dir.path(), c, weights, "F32", 2);
  ModelOptions mo;
  mo.spec = dir.path();
  mo.eager = true;
  auto lm = OpenModel(mo);
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  torch::NoGradGuard no_grad;
  torch::manual_seed(7);
  const torch::Tensor ids = torch::randint(96, {2, 10}, torch::kInt64);
  const torch::Tensor reference = strata::testing::ConfigReferenceLogits(c, weights, ids);
  const torch::Tensor logits = (*lm)->Logits(ids);
  const double scale = std::max(1.0, reference.abs().max().item<double>());
  EXPECT_LE((logits - reference).abs().max().item<double>(), 1e-5 * scale);
  strata::testing::PlantBug("gemma2_no_softcap");
  const torch::Tensor uncapped = strata::testing::ConfigReferenceLogits(c, weights, ids);
  strata::testing::PlantBug("");
  EXPECT_GT((logits - uncapped).abs().max().item<double>(), 1e-3 * scale);
}

}  // namespace
}  // namespace strata::runtime
