// Long context and Phi-3 through the user's path: the `strata` binary on Hugging Face directories
// written by the independent config.json reference (tests/testing/hf_config_reference.h) from
// shrunk copies of published config.json files.
//   - `strata eval` (fp32) gives the reference's loss within 1e-5 relative for a sliding window
//     shorter than the sequence (Mistral; Qwen2 with use_sliding_window and max_window_layers),
//     for each rope_scaling type at positions past the original context (linear, dynamic, yarn,
//     Phi-3's longrope with partial rotary dims) and for Phi-3 with its default rope from bf16
//     files; with the matching bug planted in the reference, the same comparison fails;
//   - `strata train` of a sliding-window Phi-3 gives the same losses with no offload and with
//     parameters and optimizer state on NVMe;
//   - `--steps 0 --export` re-exports a Phi-3 directory's tensors byte for byte, config.json kept.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "runtime/persist/hf_checkpoint.h"
#include "tests/testing/cli_data.h"
#include "tests/testing/cli_run.h"
#include "tests/testing/hf_config_reference.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using strata::testing::EvalWindows;
using strata::testing::LastJson;
using strata::testing::WriteTokens;

using nlohmann::json;
using strata::testing::CliRun;
using strata::testing::Shell;
using strata::testing::TempDir;

const std::string kStrata = STRATA_BINARY;
constexpr int kSeq = 32;  // past every original context below (16)

std::string WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// ---- Shrunk published config.json files (the keys as released, tiny sizes). ----

// mistralai/Mistral-7B-v0.1: sliding_window 4096 -> 8.
json MistralConfig() {
  return json::parse(R"({
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
    "intermediate_size": 48, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 8,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "vocab_size": 96})");
}

// Qwen/Qwen2-7B with its sliding window switched on for layers 1 and up.
json Qwen2Config() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
    "intermediate_size": 48, "max_position_embeddings": 131072, "max_window_layers": 1,
    "model_type": "qwen2", "num_attention_heads": 4, "num_hidden_layers": 3,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 6, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "use_cache": true, "use_sliding_window": true, "vocab_size": 96})");
}

// meta-llama/Llama-2-7b-hf with a rope_scaling of `type` over 16 positions (linear and dynamic
// scale max_position_embeddings itself, as the configs that ship them do).
json LlamaConfig(const std::string& type) {
  json c = json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
    "intermediate_size": 48, "max_position_embeddings": 16, "model_type": "llama",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "tie_word_embeddings": false,
    "torch_dtype": "float16", "use_cache": true, "vocab_size": 96})");
  c["rope_scaling"] = {{"type", type}, {"factor", 3.0}};
  return c;
}

// Qwen/Qwen2.5-7B-Instruct with the yarn setting its model card gives for long inputs.
json Qwen25YarnConfig() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
    "intermediate_size": 48, "max_position_embeddings": 64, "max_window_layers": 28,
    "model_type": "qwen2", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 96,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 16, "type": "yarn"}})");
}

// microsoft/Phi-4-mini-instruct (Phi3ForCausalLM with partial rotary dims and longrope):
// original context 4096 -> 16, 131072 -> 64; head_dim 16, 12 of them rotating.
json Phi3LongropeConfig() {
  return json::parse(R"({
    "architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 199999, "embd_pdrop": 0.0, "eos_token_id": 199999,
    "full_attn_mod": 1, "hidden_act": "silu", "hidden_size": 64,
    "initializer_range": 0.02, "intermediate_size": 96, "interpolate_factor": 1,
    "lm_head_bias": false, "max_position_embeddings": 64, "mlp_bias": false,
    "model_type": "phi3", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "original_max_position_embeddings": 16,
    "pad_token_id": 95, "partial_rotary_factor": 0.75, "resid_pdrop": 0.0,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 262144,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true,
    "vocab_size": 96,
    "rope_scaling": {"type": "longrope",
                     "long_factor": [1.0, 1.118, 1.25, 2.5, 7.75, 22.5],
                     "short_factor": [1.0, 1.0, 1.05, 1.1, 1.2, 1.5]}})");
}

// microsoft/Phi-3-mini-4k-instruct: sliding_window 2047 -> 12.
json Phi3MiniConfig() {
  return json::parse(R"({
    "architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
    "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 48,
    "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 4,
    "num_hidden_layers": 2, "num_key_value_heads": 4, "original_max_position_embeddings": 4096,
    "pad_token_id": 95, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "rope_theta": 10000.0, "sliding_window": 12, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 96})");
}

struct EvalCase {
  std::string label;
  json config;
  std::string dtype;  // of the safetensors files
  std::string bug;    // a reference bug the comparison must catch ("" for none)
};

class LongContextCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    eval_config_ = WriteText(dir_.path() + "/none.json", R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}})");
  }
  // Writes `config` with random weights under DIR/<label>; returns the weights as stored.
  strata::testing::HfWeights WriteModel(const std::string& label, const json& config,
                                        const std::string& dtype, int shards) {
    const std::string model = dir_.path() + "/" + label;
    std::filesystem::create_directories(model);
    strata::testing::HfWeights w = strata::testing::RandomWeightsFor(config, 5);
    strata::testing::WriteHfDirectory(model, config, w, dtype, shards);
    if (dtype == "BF16") {
      for (auto& [name, t] : w) t = t.to(torch::kBFloat16).to(torch::kFloat32);
    }
    return w;
  }

  TempDir dir_{"strata-long-context"};
  std::string eval_config_;
};

TEST_F(LongContextCliTest, EvalMatchesTheReferenceForWindowsAndEveryRopeType) {
  const std::vector<EvalCase> cases = {
      {"mistral_window_8", MistralConfig(), "F32", "sliding_window_off_by_one"},
      {"qwen2_window_from_layer_1", Qwen2Config(), "F32", "sliding_window_off_by_one"},
      {"llama_linear", LlamaConfig("linear"), "F32", "rope_linear_unscaled"},
      {"llama_dynamic", LlamaConfig("dynamic"), "F32", "rope_dynamic_static"},
      {"qwen25_yarn", Qwen25YarnConfig(), "F32", "rope_yarn_no_attention_factor"},
      {"phi3_longrope_partial", Phi3LongropeConfig(), "F32", "rope_longrope_short_factor_only"},
      {"phi3_default_bf16", Phi3MiniConfig(), "BF16", "phi3_gate_up_swapped"},
  };
  const std::string data = dir_.path() + "/eval.bin";
  const auto ids = WriteTokens(data, 4 * (kSeq + 1), 96, 3);
  const torch::Tensor windows = EvalWindows(ids, kSeq);
  for (const EvalCase& c : cases) {
    const strata::testing::HfWeights w = WriteModel(c.label, c.config, c.dtype, 2);
    const double reference = strata::testing::ConfigReferenceLoss(c.config, w, windows);
    const CliRun r =
        Shell(kStrata + " eval --model " + dir_.path() + "/" + c.label + " --data " + data +
              " --seq-len " + std::to_string(kSeq) + " --json --config " + eval_config_);
    ASSERT_EQ(r.rc, 0) << c.label << "\n" << r.out;
    const json j = LastJson(r.out);
    ASSERT_TRUE(j.is_object()) << r.out;
    EXPECT_EQ(j.at("tokens").get<uint64_t>(), 4u * kSeq) << c.label;
    const double loss = j.at("loss").get<double>();
    EXPECT_LE(std::abs(loss - reference) / reference, 1e-5)
        << c.label << ": " << loss << " vs " << reference;
    // The same comparison against a reference with the bug this case is about fails: the case
    // exercises what it names.
    strata::testing::PlantBug(c.bug);
    const double buggy = strata::testing::ConfigReferenceLoss(c.config, w, windows);
    strata::testing::PlantBug("");
    EXPECT_GT(std::abs(loss - buggy) / buggy, 1e-5)
        << c.label << ": the reference with " << c.bug << " gives " << buggy;
  }
}

TEST_F(LongContextCliTest, SlidingWindowPhi3FineTunesAlikeWithAndWithoutOffload) {
  const json config = Phi3MiniConfig();
  WriteModel("phi3", config, "F32", 1);
  const std::string data = dir_.path() + "/train.bin";
  WriteTokens(data, 2000, 96, 9);
  const std::string swap = dir_.path() + "/swap";
  const std::string nvme = WriteText(dir_.path() + "/nvme.json", R"({
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
    "zero_optimization": {"stage": 3, "sub_group_size": 5000,
      "stage3_param_persistence_threshold": 100,
      "offload_param": {"device": "nvme", "nvme_path": ")" + swap + R"("},
      "offload_optimizer": {"device": "nvme", "nvme_path": ")" + swap +
                                                                     R"("}}})");
  std::vector<std::vector<json>> runs;
  for (const std::string& config_path : {eval_config_, nvme}) {
    const std::string log = config_path + ".jsonl";
    const CliRun r = Shell(kStrata + " train --quiet --model " + dir_.path() + "/phi3 --data " +
                           data + " --seq-len " + std::to_string(kSeq) + " --steps 4 --config " +
                           config_path + " --log-json " + log);
    ASSERT_EQ(r.rc, 0) << config_path << "\n" << r.out;
    runs.push_back(strata::testing::JsonLines(log));
  }
  ASSERT_EQ(runs[0].size(), 4u);
  ASSERT_EQ(runs[1].size(), 4u);
  for (size_t i = 0; i < runs[0].size(); ++i) {
    // torch::optim's sqrt without offload is MKL's, not IEEE's (README "Exactness").
    EXPECT_NEAR(runs[0][i].at("loss").get<double>(), runs[1][i].at("loss").get<double>(),
                1e-5 * std::abs(runs[1][i].at("loss").get<double>()))
        << "step " << i + 1;
  }
  EXPECT_LT(runs[0].back().at("loss").get<double>(), runs[0].front().at("loss").get<double>());
}

TEST_F(LongContextCliTest, ZeroStepExportReproducesAPhi3Directory) {
  const json config = Phi3LongropeConfig();
  WriteModel("phi3", config, "BF16", 2);
  const std::string model = dir_.path() + "/phi3";
  const std::string data = dir_.path() + "/d.bin";
  WriteTokens(data, 300, 96, 1);
  const std::string out = dir_.path() + "/export";
  const CliRun r = Shell(kStrata + " train --quiet --model " + model + " --data " + data +
                         " --seq-len 16 --steps 0 --export " + out);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto in = runtime::HfCheckpoint::Open(model);
  auto exported = runtime::HfCheckpoint::Open(out);
  ASSERT_TRUE(in.ok() && exported.ok()) << r.out;
  ASSERT_EQ((*in)->tensors().size(), (*exported)->tensors().size());
  EXPECT_NE((*exported)->Find("model.layers.1.self_attn.qkv_proj.weight"), nullptr);
  EXPECT_NE((*exported)->Find("model.layers.1.mlp.gate_up_proj.weight"), nullptr);
  for (const auto& t : (*in)->tensors()) {
    const runtime::HfTensorInfo* e = (*exported)->Find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    EXPECT_EQ(e->dtype, t.dtype) << t.name;
    EXPECT_EQ(e->shape, t.shape) << t.name;
    std::string a(t.end - t.begin, '\0'), b(e->end - e->begin, '\0');
    ASSERT_TRUE((*in)->ReadRaw(t.name, a.data()).ok());
    ASSERT_TRUE((*exported)->ReadRaw(t.name, b.data()).ok());
    EXPECT_TRUE(a == b) << t.name << " differs";
  }
  const json written = json::parse(std::ifstream(out + "/config.json"));
  for (const char* key : {"architectures", "rope_scaling", "partial_rotary_factor",
                          "original_max_position_embeddings", "sliding_window"}) {
    EXPECT_EQ(written.at(key), config.at(key)) << key;
  }
}

}  // namespace
}  // namespace strata
