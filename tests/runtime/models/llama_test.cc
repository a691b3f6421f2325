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

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/models/causal_lm.h"
#include "runtime/models/rope.h"
#include "tests/testing/hf_config_reference.h"
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

Result<LlamaShape> ParseText(const std::string& text) {
  return ParseHfConfig(nlohmann::json::parse(text), "DIR/config.json");
}

std::vector<std::optional<int64_t>> LayerWindows(const LlamaShape& s) {
  std::vector<std::optional<int64_t>> out;
  for (int64_t i = 0; i < s.num_hidden_layers; ++i) out.push_back(LayerSlidingWindow(s, i));
  return out;
}

// pad_token_id as transformers builds nn.Embedding(padding_idx=...): the class default where the
// key is absent (and the vocabulary holds it), null for none, a negative id from the end, an id
// outside the vocabulary refused naming the key and the file; HfConfigJson writes it back.
TEST(LlamaShapeTest, PadTokenIdIsTheEmbeddingsPaddingRow) {
  const std::string sizes =
      R"("hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 64, "num_hidden_layers": 2, "vocab_size": 100)";
  auto parse = [&](const std::string& arch, const std::string& type, const std::string& extra) {
    return ParseText(R"({"architectures": [")" + arch + R"("], "model_type": ")" + type + R"(", )" +
                     sizes + extra + "}");
  };
  using P = std::optional<int64_t>;
  EXPECT_EQ(parse("LlamaForCausalLM", "llama", "")->pad_token_id, P());
  EXPECT_EQ(parse("LlamaForCausalLM", "llama", R"(, "pad_token_id": 7)")->pad_token_id, P(7));
  EXPECT_EQ(parse("LlamaForCausalLM", "llama", R"(, "pad_token_id": -1)")->pad_token_id, P(99));
  EXPECT_EQ(parse("Gemma2ForCausalLM", "gemma2", R"(, "head_dim": 8)")->pad_token_id, P(0));
  EXPECT_EQ(parse("Gemma2ForCausalLM", "gemma2", R"(, "head_dim": 8, "pad_token_id": null)")
                ->pad_token_id,
            P());
  // Phi3Config's 32000 is outside this vocabulary: no padding row (transformers would fail).
  EXPECT_EQ(parse("Phi3ForCausalLM", "phi3", "")->pad_token_id, P());
  for (const char* bad : {R"(, "pad_token_id": 100)", R"(, "pad_token_id": -101)",
                          R"(, "pad_token_id": "0")", R"(, "pad_token_id": 1.5)"}) {
    Result<LlamaShape> r = parse("LlamaForCausalLM", "llama", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().ToString().find("pad_token_id"), std::string::npos)
        << r.status().ToString();
    EXPECT_NE(r.status().ToString().find("DIR/config.json"), std::string::npos)
        << r.status().ToString();
  }
  Result<LlamaShape> seven = parse("LlamaForCausalLM", "llama", R"(, "pad_token_id": 7)");
  ASSERT_TRUE(seven.ok());
  EXPECT_EQ(HfConfigJson(*seven, "float32").at("pad_token_id"), 7);
  EXPECT_TRUE(HfConfigJson(*parse("LlamaForCausalLM", "llama", ""), "float32")
                  .at("pad_token_id")
                  .is_null());
}

// Which layers slide, as each configuration class builds its layer_types.
TEST(LlamaShapeTest, SlidingWindowsPerLayerAsTransformersReadsThem) {
  using W = std::vector<std::optional<int64_t>>;
  const std::string sizes =
      R"("hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 3)";
  auto parse = [&](const std::string& arch, const std::string& keys) {
    Result<LlamaShape> s = ParseText("{\"architectures\": [\"" + arch + "\"], " + sizes +
                                     (keys.empty() ? "" : ", ") + keys + "}");
    EXPECT_TRUE(s.ok()) << arch << " " << keys << ": " << s.status().ToString();
    return s.ok() ? LayerWindows(*s) : W{};
  };
  const std::optional<int64_t> none;
  EXPECT_EQ(parse("MistralForCausalLM", ""), (W{4096, 4096, 4096}));  // MistralConfig's default
  EXPECT_EQ(parse("MistralForCausalLM", R"("sliding_window": null)"), (W{none, none, none}));
  EXPECT_EQ(parse("Qwen2ForCausalLM", R"("sliding_window": 6)"), (W{none, none, none}));
  EXPECT_EQ(parse("Qwen2ForCausalLM",
                  R"("use_sliding_window": true, "sliding_window": 6, "max_window_layers": 1)"),
            (W{none, 6, 6}));
  EXPECT_EQ(parse("Qwen2ForCausalLM", R"("use_sliding_window": true)"),  // max_window_layers 28
            (W{none, none, none}));
  EXPECT_EQ(parse("Phi3ForCausalLM", ""), (W{none, none, none}));
  EXPECT_EQ(parse("Phi3ForCausalLM", R"("sliding_window": 2047)"), (W{2047, 2047, 2047}));
  EXPECT_EQ(parse("LlamaForCausalLM", R"("sliding_window": 5)"), (W{none, none, none}));
  // An explicit layer_types wins.
  EXPECT_EQ(parse("MistralForCausalLM",
                  R"("sliding_window": 5, "layer_types": ["sliding_attention", "full_attention",
               "sliding_attention"])"),
            (W{5, none, 5}));
  Result<LlamaShape> bad = ParseText(R"({"architectures": ["MistralForCausalLM"], )" + sizes +
                                     R"(, "layer_types": ["sliding_attention"]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("DIR/config.json: layer_types"), std::string::npos)
      << bad.status().ToString();
  bad = ParseText(R"({"architectures": ["MistralForCausalLM"], )" + sizes +
                  R"(, "sliding_window": 0})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sliding_window is 0"), std::string::npos);
}

// A window shorter than the sequence is computed, so it no longer bounds the sequence.
TEST(LlamaShapeTest, SlidingWindowDoesNotBoundTheSequence) {
  strata::testing::LlamaSpec spec;
  spec.architecture = "MistralForCausalLM";  // sliding_window absent: 4096
  spec.num_key_value_heads = 4;
  TempDir dir("strata-llama");
  ASSERT_TRUE(dir.ok());
  strata::testing::WriteHfCheckpoint(dir.path(), spec, strata::testing::RandomLlamaWeights(spec, 2),
                                     "F32", 1);
  ModelOptions mo;
  mo.spec = dir.path();
  auto lm = OpenModel(mo);
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  EXPECT_GT((*lm)->max_seq_len(), 1'000'000);
}

// rope_scaling resolved as modeling_rope_utils.py does; what strata does not implement is refused
// naming the file and the key.
TEST(LlamaShapeTest, RopeScalingTypesAndRefusals) {
  const std::string llama =
      R"("architectures": ["LlamaForCausalLM"], "hidden_size": 32, "num_attention_heads": 4,
         "max_position_embeddings": 4096)";
  const std::string phi3 =
      R"("architectures": ["Phi3ForCausalLM"], "hidden_size": 32, "num_attention_heads": 4,
         "max_position_embeddings": 131072, "original_max_position_embeddings": 4096)";
  auto parse = [](const std::string& keys, const std::string& rope) {
    return ParseText("{" + keys + ", \"rope_scaling\": " + rope + "}");
  };
  auto refused = [&](const std::string& keys, const std::string& rope, const std::string& why) {
    Result<LlamaShape> s = parse(keys, rope);
    ASSERT_FALSE(s.ok()) << rope;
    EXPECT_NE(s.status().message().find("DIR/config.json: rope_scaling"), std::string::npos)
        << s.status().ToString();
    EXPECT_NE(s.status().message().find(why), std::string::npos) << s.status().ToString();
  };
  refused(llama, R"({"type": "ntk-by-parts", "factor": 2.0})", "\"ntk-by-parts\" is not one");
  refused(llama, R"({"type": "linear"})", "needs \"factor\"");
  refused(phi3, R"({"type": "linear", "factor": 2.0})", "Phi3 takes rope type default or longrope");
  refused(phi3, R"({"type": "su", "short_factor": [1, 1, 1, 1], "long_factor": [1, 2, 3]})",
          "long_factor, a list of 4 numbers");

  // Phi-3's legacy "su": longrope, factor max / original, attention factor
  // sqrt(1 + ln(factor) / ln(original)).
  Result<LlamaShape> s =
      parse(phi3, R"({"type": "su", "short_factor": [1, 1, 1, 1], "long_factor": [1, 2, 3, 4]})");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->rope_scaling.has_value());
  EXPECT_EQ(s->rope_scaling->type, RopeScaling::Type::kLongrope);
  EXPECT_EQ(s->rope_scaling->factor, 32.0);
  EXPECT_NEAR(s->rope_scaling->attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)),
              1e-15);
  EXPECT_EQ(s->rope_scaling->long_factor, (std::vector<double>{1, 2, 3, 4}));

  // yarn: 0.1 ln(factor) + 1; the mscale ratio when both are set; an explicit value wins.
  s = parse(llama, R"({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024})");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_NEAR(s->rope_scaling->attention_factor, 0.1 * std::log(4.0) + 1, 1e-15);
  EXPECT_EQ(s->rope_scaling->original_max_position_embeddings, 1024);
  EXPECT_EQ(s->rope_scaling->beta_fast, 32.0);
  s = parse(llama, R"({"type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.5})");
  ASSERT_TRUE(s.ok());
  EXPECT_NEAR(s->rope_scaling->attention_factor,
              (0.1 * std::log(4.0) + 1) / (0.05 * std::log(4.0) + 1), 1e-15);
  s = parse(llama, R"({"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.5})");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->rope_scaling->attention_factor, 1.5);

  // transformers v5's rope_parameters, rope_theta inside it.
  s = ParseText("{" + llama +
                R"(, "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                   "rope_theta": 500000.0}})");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->rope_scaling->type, RopeScaling::Type::kLinear);
  EXPECT_EQ(s->rope_theta, 500000.0);
  s = ParseText("{" + llama + R"(, "rope_parameters": {"rope_type": "default"}})");
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->rope_scaling.has_value());
}

// The presets' parameter counts are the published ones, and the per-tensor sizes estimate and
// the memory plan use are the model's own tensors.
TEST(LlamaShapeTest, Phi3PresetsAndTensorSizes) {
  Result<LlamaShape> mini = FindLlamaPreset("phi-3-mini-4k");
  Result<LlamaShape> medium = FindLlamaPreset("phi-3-medium-4k");
  ASSERT_TRUE(mini.ok() && medium.ok());
  EXPECT_EQ(LlamaTotalParams(*mini), 3'821'079'552u);  // microsoft/Phi-3-mini-4k-instruct
  EXPECT_EQ(LlamaTotalParams(*medium), 13'960'238'080u);
  EXPECT_EQ(LlamaLargestLayerTensor(*mini), 2u * 8192 * 3072);  // gate_up_proj
  // The config.json a preset exports reads back as the same model.
  Result<LlamaShape> again = ParseHfConfig(HfConfigJson(*medium, "bfloat16"), "preset");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->architecture, "Phi3ForCausalLM");
  EXPECT_EQ(LlamaTotalParams(*again), LlamaTotalParams(*medium));
  EXPECT_EQ(LayerSlidingWindow(*again, 39), 2047);

  for (const std::string arch : {"Phi3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM"}) {
    Result<LlamaShape> s =
        ParseText("{\"architectures\": [\"" + arch +
                  R"("], "hidden_size": 16, "intermediate_size": 24, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 40,
           "attention_bias": true, "mlp_bias": true})");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    std::vector<uint64_t> model_numels;
    for (const auto& [name, shape] : LlamaTensorShapes(*s)) {
      if (!name.starts_with("model.layers.0.")) continue;
      uint64_t n = 1;
      for (int64_t d : shape) n *= static_cast<uint64_t>(d);
      model_numels.push_back(n);
    }
    std::vector<uint64_t> planned = LlamaLayerTensorNumels(*s);
    std::sort(model_numels.begin(), model_numels.end());
    std::sort(planned.begin(), planned.end());
    EXPECT_EQ(planned, model_numels) << arch;
    EXPECT_EQ(LlamaLargestLayerTensor(*s), model_numels.back()) << arch;
  }
}

// The tables of positions offset .. offset + T - 1 are those rows of a forward over offset + T
// tokens (dynamic NTK and longrope depend on that length, as transformers' position_ids do).
TEST(RopeTest, TablesAtAnOffsetAreRowsOfTheFullForward) {
  const std::string base =
      R"("architectures": ["LlamaForCausalLM"], "hidden_size": 32, "num_attention_heads": 2,
         "max_position_embeddings": 8, "rope_scaling": )";
  for (const std::string& rope :
       {std::string("null"), std::string(R"({"type": "dynamic", "factor": 2.0})"),
        std::string(R"({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4})")}) {
    Result<LlamaShape> s = ParseText("{" + base + rope + "}");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const RotaryEmbedding embedding(*s);
    const RopeTables full = embedding.Tables(0, 12, torch::kFloat32, torch::kCPU);
    const RopeTables tail = embedding.Tables(9, 3, torch::kFloat32, torch::kCPU);
    EXPECT_TRUE(torch::equal(tail.cos, full.cos.slice(0, 9, 12))) << rope;
    EXPECT_TRUE(torch::equal(tail.sin, full.sin.slice(0, 9, 12))) << rope;
    // Dynamic NTK: the default frequencies up to max_position_embeddings, a larger base past it.
    const torch::Tensor short_freqs = embedding.InverseFrequencies(8);
    const torch::Tensor long_freqs = embedding.InverseFrequencies(12);
    if (rope.find("dynamic") != std::string::npos) {
      EXPECT_TRUE((long_freqs.slice(0, 1) < short_freqs.slice(0, 1)).all().item<bool>());
    } else {
      EXPECT_TRUE(torch::equal(long_freqs, short_freqs)) << rope;
    }
  }
  // Partial rotary dims: the dims past rotary_dim pass through.
  const torch::Tensor x = torch::randn({1, 2, 5, 8});
  const torch::Tensor cos = torch::rand({5, 6}), sin = torch::rand({5, 6});
  const torch::Tensor y = ApplyRotary(x, cos, sin);
  EXPECT_TRUE(torch::equal(y.narrow(-1, 6, 2), x.narrow(-1, 6, 2)));
  EXPECT_FALSE(torch::allclose(y.narrow(-1, 0, 6), x.narrow(-1, 0, 6)));
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

// The cache with a sliding window on a Phi-3: incremental logits equal one forward over the whole
// sequence once the sequence is longer than the window.
TEST(LlamaKvCacheTest, SlidingWindowPhi3IncrementalLogitsEqualTheFullForward) {
  const nlohmann::json config = nlohmann::json::parse(R"({
    "architectures": ["Phi3ForCausalLM"], "hidden_size": 32, "intermediate_size": 48,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
    "vocab_size": 64, "sliding_window": 3, "partial_rotary_factor": 0.5})");
  TempDir dir("strata-llama");
  ASSERT_TRUE(dir.ok());
  strata::testing::WriteHfDirectory(dir.path(), config,
                                    strata::testing::RandomWeightsFor(config, 4), "F32", 1);
  ModelOptions mo;
  mo.spec = dir.path();
  mo.eager = true;
  auto lm = OpenModel(mo);
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  torch::NoGradGuard no_grad;
  torch::manual_seed(6);
  const torch::Tensor ids = torch::randint(64, {1, 9}, torch::kInt64);
  const torch::Tensor full = (*lm)->Logits(ids);
  (*lm)->SetKvCaching(true);
  std::vector<torch::Tensor> pieces = {(*lm)->LogitsAt(ids.slice(1, 0, 4), 0)};
  for (int64_t t = 4; t < 9; ++t) pieces.push_back((*lm)->LogitsAt(ids.slice(1, t, t + 1), t));
  (*lm)->SetKvCaching(false);
  const torch::Tensor incremental = torch::cat(pieces, 1);
  EXPECT_TRUE(torch::allclose(incremental, full, 1e-5, 1e-5))
      << (incremental - full).abs().max().item<float>();
}

}  // namespace
}  // namespace strata::runtime
