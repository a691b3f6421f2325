// The Llama family against an independent reference (tests/testing/hf_reference.h, written from
// transformers' Python source, sharing no code with runtime/models/): checkpoints the reference
// writes (config.json + hand-written safetensors) are opened by strata's registry and must give
// the reference's loss, for each architecture and layout (GQA, tied and untied head, Qwen2
// biases, Llama biases, explicit head_dim, llama3 RoPE scaling, bf16/fp16/fp32, single file and
// sharded). Also: bad checkpoints are refused naming the tensor, and random initialization does
// not depend on the order units are initialized in.
#include "runtime/models/llama.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "runtime/models/causal_lm.h"
#include "tests/testing/hf_reference.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using strata::testing::LlamaSpec;
using strata::testing::TempDir;

struct Case {
  std::string label;
  LlamaSpec spec;
  std::string dtype;
  int shards;
};

std::vector<Case> Cases() {
  std::vector<Case> c;
  LlamaSpec gqa;  // 4 query heads over 2 kv heads, untied
  c.push_back({"llama_gqa_f32_single", gqa, "F32", 1});
  c.push_back({"llama_gqa_bf16_sharded", gqa, "BF16", 3});
  LlamaSpec tied = gqa;
  tied.tie_word_embeddings = true;
  tied.num_key_value_heads = 1;
  c.push_back({"llama_tied_mqa_f16", tied, "F16", 2});
  LlamaSpec biased = gqa;
  biased.attention_bias = true;
  biased.mlp_bias = true;
  biased.head_dim = 6;  // not hidden / heads
  biased.rope_scaling = strata::testing::Llama3Scaling{8.0, 1.0, 4.0, 64};
  biased.rope_theta = 500000;
  c.push_back({"llama_biases_headdim_llama3_f32", biased, "F32", 1});
  LlamaSpec qwen = gqa;
  qwen.architecture = "Qwen2ForCausalLM";
  qwen.rope_theta = 1e6;
  c.push_back({"qwen2_f32_sharded", qwen, "F32", 4});
  LlamaSpec qwen_tied = qwen;
  qwen_tied.tie_word_embeddings = true;
  c.push_back({"qwen2_tied_bf16", qwen_tied, "BF16", 1});
  LlamaSpec mistral = gqa;
  mistral.architecture = "MistralForCausalLM";
  mistral.num_key_value_heads = 4;
  c.push_back({"mistral_f32", mistral, "F32", 2});
  return c;
}

torch::Tensor Windows(int64_t rows, int64_t len, int64_t vocab, uint64_t seed) {
  torch::manual_seed(static_cast<int64_t>(seed));
  return torch::randint(vocab, {rows, len}, torch::kLong);
}

class LlamaParityTest : public ::testing::TestWithParam<Case> {};

TEST_P(LlamaParityTest, LossMatchesTheReference) {
  const Case& c = GetParam();
  TempDir dir("strata-llama");
  ASSERT_TRUE(dir.ok());
  const auto weights = strata::testing::RandomLlamaWeights(c.spec, 7);
  strata::testing::WriteHfCheckpoint(dir.path(), c.spec, weights, c.dtype, c.shards);
  const auto loaded = strata::testing::RoundTripWeights(weights, c.dtype);

  ModelOptions mo;
  mo.spec = dir.path();
  mo.eager = true;
  auto lm = OpenModel(mo);
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  EXPECT_EQ((*lm)->family(), "llama");
  EXPECT_EQ((*lm)->vocab_size(), c.spec.vocab_size);

  // Every parameter holds the stored value upcast to fp32, under transformers' name.
  std::map<std::string, torch::Tensor> params;
  for (const auto& item : (*lm)->module()->named_parameters()) params[item.key()] = item.value();
  ASSERT_EQ(params.size(), loaded.size());
  for (const auto& [name, t] : loaded) {
    ASSERT_TRUE(params.count(name)) << name;
    EXPECT_TRUE(torch::equal(params[name], t)) << name;
  }

  const torch::Tensor windows = Windows(3, 17, c.spec.vocab_size, 11);
  const double reference = strata::testing::ReferenceLoss(c.spec, loaded, windows);
  torch::NoGradGuard no_grad;
  const torch::Tensor inputs = windows.slice(1, 0, 16), targets = windows.slice(1, 1, 17);
  const double got = (*lm)->Loss(inputs, targets).item<double>();
  EXPECT_LE(std::abs(got - reference) / reference, 1e-5) << got << " vs " << reference;
  // The logits themselves, position by position.
  const torch::Tensor ref_logits = strata::testing::ReferenceLogits(c.spec, loaded, inputs);
  const torch::Tensor logits = (*lm)->Logits(inputs);
  EXPECT_LE((logits - ref_logits).abs().max().item<double>(),
            1e-5 * std::max(1.0, ref_logits.abs().max().item<double>()));
}

INSTANTIATE_TEST_SUITE_P(Architectures, LlamaParityTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.label; });

// A checkpoint written for `spec` with `edit` applied to its tensors, then opened.
Status OpenEdited(const LlamaSpec& spec,
                  const std::function<void(std::map<std::string, torch::Tensor>&)>& edit,
                  std::string* dir_out, TempDir& dir) {
  auto weights = strata::testing::RandomLlamaWeights(spec, 3);
  edit(weights);
  strata::testing::WriteHfCheckpoint(dir.path(), spec, weights, "F32", 1);
  *dir_out = dir.path();
  ModelOptions mo;
  mo.spec = dir.path();
  return OpenModel(mo).status();
}

TEST(LlamaCheckpointTest, MissingExtraAndMisshapenTensorsAreRefusedByName) {
  LlamaSpec spec;
  std::string path;
  {
    TempDir dir("strata-llama");
    Status s = OpenEdited(
        spec, [](auto& w) { w.erase("model.layers.1.mlp.up_proj.weight"); }, &path, dir);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("model.layers.1.mlp.up_proj.weight is missing"), std::string::npos)
        << s.ToString();
  }
  {
    TempDir dir("strata-llama");
    Status s = OpenEdited(
        spec, [](auto& w) { w["model.layers.0.extra.weight"] = torch::zeros({2}); }, &path, dir);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("unexpected tensor model.layers.0.extra.weight"), std::string::npos)
        << s.ToString();
  }
  {
    TempDir dir("strata-llama");
    Status s = OpenEdited(
        spec, [&](auto& w) { w["model.norm.weight"] = torch::ones({spec.hidden_size + 1}); }, &path,
        dir);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("model.norm.weight has shape [65]"), std::string::npos)
        << s.ToString();
  }
}

TEST(LlamaCheckpointTest, UnknownArchitectureAndTruncatedShardAreRefused) {
  LlamaSpec spec;
  TempDir dir("strata-llama");
  ASSERT_TRUE(dir.ok());
  strata::testing::WriteHfCheckpoint(dir.path(), spec, strata::testing::RandomLlamaWeights(spec, 1),
                                     "BF16", 2);
  // Truncate the second shard by a few bytes.
  const std::string shard = dir.path() + "/model-00002-of-00002.safetensors";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 5);
  ModelOptions mo;
  mo.spec = dir.path();
  Status s = OpenModel(mo).status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model-00002-of-00002.safetensors"), std::string::npos)
      << s.ToString();

  nlohmann::json config = strata::testing::LlamaConfigJson(spec, "float32");
  config["architectures"] = {"GPTNeoXForCausalLM"};
  config["model_type"] = "gpt_neox";
  std::ofstream(dir.path() + "/config.json") << config.dump();
  s = OpenModel(mo).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("GPTNeoXForCausalLM"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("config.json"), std::string::npos) << s.ToString();
}

// Random initialization is seeded by parameter name: initializing units in another order (as an
// engine with offloaded parameters does) gives the same values, and another seed other values.
TEST(ModelInitTest, ValuesDoNotDependOnTheInitializationOrder) {
  for (const std::string preset : {"llama-tiny", "tiny"}) {
    ModelOptions eager;
    eager.spec = preset;
    eager.eager = true;
    auto a = OpenModel(eager);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ModelOptions deferred = eager;
    deferred.eager = false;
    auto b = OpenModel(deferred);
    ASSERT_TRUE(b.ok());
    torch::NoGradGuard no_grad;
    for (int u = (*b)->num_units() - 1; u >= 0; --u) ASSERT_TRUE((*b)->InitializeUnit(u).ok());
    ModelOptions other = eager;
    other.seed = eager.seed + 1;
    auto c = OpenModel(other);
    ASSERT_TRUE(c.ok());
    auto pa = (*a)->module()->named_parameters(), pb = (*b)->module()->named_parameters(),
         pc = (*c)->module()->named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    int differs = 0;
    for (const auto& item : pa) {
      EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << preset << " " << item.key();
      if (!torch::equal(item.value(), pc[item.key()])) ++differs;
    }
    EXPECT_GT(differs, 0) << preset;
  }
}

TEST(LlamaPresetTest, PresetsHaveTheirPublishedSizes) {
  // Parameter counts of the released checkpoints (safetensors totals / bytes per element).
  EXPECT_EQ(LlamaTotalParams(*FindLlamaPreset("llama-3.2-1b")), 1'235'814'400u);
  EXPECT_EQ(LlamaTotalParams(*FindLlamaPreset("llama-3.2-3b")), 3'212'749'824u);
  EXPECT_EQ(LlamaTotalParams(*FindLlamaPreset("llama-3.1-8b")), 8'030'261'248u);
  EXPECT_EQ(LlamaTotalParams(*FindLlamaPreset("llama-2-7b")), 6'738'415'616u);
  EXPECT_EQ(LlamaTotalParams(*FindLlamaPreset("mistral-7b")), 7'241'732'096u);
  EXPECT_EQ(LlamaTotalParams(*FindLlamaPreset("qwen2.5-7b")), 7'615'616'512u);
  EXPECT_FALSE(FindLlamaPreset("llama-9b").ok());
}

}  // namespace
}  // namespace strata::runtime

namespace strata::runtime {
namespace {

// Mistral's sliding window bounds the sequence strata accepts (it attends fully up to the window);
// Llama and Qwen2 (use_sliding_window false) have no such bound.
TEST(LlamaShapeTest, SlidingWindowBoundsTheSequence) {
  for (const auto& [arch, window] : std::vector<std::pair<std::string, int64_t>>{
           {"MistralForCausalLM", 4096}, {"LlamaForCausalLM", 0}, {"Qwen2ForCausalLM", 0}}) {
    strata::testing::LlamaSpec spec;
    spec.architecture = arch;
    if (arch != "LlamaForCausalLM") spec.num_key_value_heads = 4;
    TempDir dir("strata-llama");
    ASSERT_TRUE(dir.ok());
    strata::testing::WriteHfCheckpoint(dir.path(), spec,
                                       strata::testing::RandomLlamaWeights(spec, 2), "F32", 1);
    ModelOptions mo;
    mo.spec = dir.path();
    auto lm = OpenModel(mo);
    ASSERT_TRUE(lm.ok()) << lm.status().ToString();
    if (window > 0) {
      EXPECT_EQ((*lm)->max_seq_len(), window) << arch;
    } else {
      EXPECT_GT((*lm)->max_seq_len(), 1'000'000) << arch;
    }
  }
}

}  // namespace
}  // namespace strata::runtime

namespace strata::runtime {
namespace {

// Generation with the KV cache: feeding a sequence in pieces (a prompt, then one token at a time)
// gives the logits of one forward over the whole sequence, and turning caching off forgets.
TEST(LlamaKvCacheTest, IncrementalLogitsEqualTheFullForward) {
  ModelOptions mo;
  mo.spec = "llama-tiny";
  mo.eager = true;
  auto lm = OpenModel(mo);
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  ASSERT_TRUE((*lm)->supports_kv_cache());
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  const torch::Tensor ids = torch::randint((*lm)->vocab_size(), {2, 9}, torch::kInt64);
  const torch::Tensor full = (*lm)->Logits(ids);

  (*lm)->SetKvCaching(true);
  std::vector<torch::Tensor> pieces = {(*lm)->LogitsAt(ids.slice(1, 0, 5), 0)};
  for (int64_t t = 5; t < 9; ++t) pieces.push_back((*lm)->LogitsAt(ids.slice(1, t, t + 1), t));
  const torch::Tensor incremental = torch::cat(pieces, 1);
  EXPECT_TRUE(torch::allclose(incremental, full, /*rtol=*/1e-5, /*atol=*/1e-5))
      << (incremental - full).abs().max().item<float>();

  // A cache that kept nothing (off) sees only the new token: different logits.
  (*lm)->SetKvCaching(false);
  const torch::Tensor alone = (*lm)->LogitsAt(ids.slice(1, 8, 9), 8);
  EXPECT_FALSE(torch::allclose(alone, full.slice(1, 8, 9), 1e-3, 1e-3));
}

}  // namespace
}  // namespace strata::runtime
