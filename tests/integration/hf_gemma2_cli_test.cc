// Gemma 2 through the user's path: the `strata` binary on Hugging Face directories written by the
// independent config.json reference (tests/testing/hf_config_reference.h) from a config shrunk
// from google/gemma-2-2b's published config.json, and token files written here.
//   - `strata eval` gives the reference's loss (relative 1e-5, fp32) at a sequence longer than
//     the sliding window, from an F32 and a BF16 checkpoint, with and without offload; with each
//     of the reference's Gemma 2 bugs planted the same comparison fails (the test can fail);
//   - `strata train` gives the same losses (bitwise, fp32) with no offload and with parameters +
//     optimizer on NVMe;
//   - `--steps 0 --export` re-exports the input tensors byte for byte, with the input config.json;
//   - the gemma-2-2b preset is planned by `strata estimate --json` with its published size.
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
#include "tests/testing/hf_reference.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using strata::testing::EvalWindows;
using strata::testing::LastJson;
using strata::testing::WriteTokens;

using strata::testing::CliRun;
using strata::testing::Shell;
using strata::testing::TempDir;

const std::string kStrata = STRATA_BINARY;
constexpr int kSeq = 32;  // longer than the window: the sliding layers mask keys the global see

// google/gemma-2-2b's config.json (transformers 4.42) with the sizes shrunk: 3 layers (sliding,
// global, sliding), hidden 64, 4 query heads over 2 kv heads of 16 dims, vocab 128, window 12.
nlohmann::json ShrunkGemma2Config() {
  return nlohmann::json::parse(R"({
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": false,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 4,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 16,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 12,
    "torch_dtype": "float32",
    "transformers_version": "4.42.4",
    "use_cache": true,
    "vocab_size": 128
  })");
}

std::vector<double> Losses(const std::string& log_json) {
  std::vector<double> out;
  for (const nlohmann::json& j : strata::testing::JsonLines(log_json))
    out.push_back(j.at("loss").get<double>());
  return out;
}

class Gemma2CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    model_ = dir_.path() + "/gemma-2-shrunk";
    const std::string opt = R"("train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}})";
    none_ = Write("none.json", "{" + opt + "}");
    all_nvme_ = Write("all.json", "{" + opt + R"(, "zero_optimization": {"stage": 3,
        "sub_group_size": 20000, "stage3_param_persistence_threshold": 100,
        "offload_param": {"device": "nvme", "nvme_path": ")" +
                                      dir_.path() + R"(/swap", "buffer_count": 2},
        "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                                      dir_.path() + R"(/swap"}}})");
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_.path() + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  // Writes the model in `dtype`; returns the weights a loader reads back (fp32).
  strata::testing::HfWeights WriteModel(const std::string& dtype, int shards) {
    std::filesystem::remove_all(model_);
    const strata::testing::HfWeights w = strata::testing::RandomWeightsFor(config_, 5);
    strata::testing::WriteHfDirectory(model_, config_, w, dtype, shards);
    return strata::testing::RoundTripWeights(w, dtype);
  }
  // `strata eval`'s loss on `data` with `config`.
  double EvalLoss(const std::string& data, const std::string& config) {
    const CliRun r = Shell(kStrata + " eval --model " + model_ + " --data " + data + " --seq-len " +
                           std::to_string(kSeq) + " --json --config " + config);
    EXPECT_EQ(r.rc, 0) << r.out;
    const nlohmann::json j = LastJson(r.out);
    if (!j.is_object() || !j.contains("loss")) {
      ADD_FAILURE() << r.out;
      return std::nan("");
    }
    return j.at("loss").get<double>();
  }

  TempDir dir_{"strata-gemma2-cli"};
  nlohmann::json config_ = ShrunkGemma2Config();
  std::string model_, none_, all_nvme_;
};

double Relative(double a, double b) { return std::abs(a - b) / std::abs(b); }

TEST_F(Gemma2CliTest, EvalMatchesTheReferenceAndFailsAgainstEachPlantedBug) {
  const strata::testing::HfWeights weights = WriteModel("F32", 1);
  const std::string data = dir_.path() + "/eval.bin";
  const torch::Tensor windows =
      EvalWindows(WriteTokens(data, 6 * (kSeq + 1) + 5, 128, 3), kSeq);  // 6 windows + a tail
  const double reference = strata::testing::ConfigReferenceLoss(config_, weights, windows);
  const double loss = EvalLoss(data, none_);
  EXPECT_LE(Relative(loss, reference), 1e-5) << loss << " vs " << reference;
  EXPECT_EQ(EvalLoss(data, all_nvme_), loss) << "offloading parameters changed the loss";

  // Each bug, planted in the reference, makes the same comparison fail.
  for (const char* bug :
       {"gemma2_norm_without_one", "gemma2_no_softcap", "gemma2_all_layers_global"}) {
    strata::testing::PlantBug(bug);
    const double bugged = strata::testing::ConfigReferenceLoss(config_, weights, windows);
    strata::testing::PlantBug("");
    EXPECT_GT(Relative(loss, bugged), 1e-5) << bug << ": " << loss << " vs " << bugged;
  }
}

TEST_F(Gemma2CliTest, EvalOfABf16CheckpointMatchesTheReference) {
  const strata::testing::HfWeights loaded = WriteModel("BF16", 2);
  const std::string data = dir_.path() + "/eval.bin";
  const torch::Tensor windows = EvalWindows(WriteTokens(data, 4 * (kSeq + 1), 128, 4), kSeq);
  const double reference = strata::testing::ConfigReferenceLoss(config_, loaded, windows);
  const double loss = EvalLoss(data, none_);
  EXPECT_LE(Relative(loss, reference), 1e-5) << loss << " vs " << reference;
}

TEST_F(Gemma2CliTest, FineTuneLossesAreTheSameWithParametersAndOptimizerOnNvme) {
  WriteModel("F32", 1);
  const std::string data = dir_.path() + "/train.bin";
  WriteTokens(data, 3000, 128, 9);
  std::vector<std::vector<double>> runs;
  for (const std::string& config : {none_, all_nvme_}) {
    const std::string log = config + ".jsonl";
    const CliRun r =
        Shell(kStrata + " train --quiet --model " + model_ + " --data " + data + " --seq-len " +
              std::to_string(kSeq) + " --steps 6 --config " + config + " --log-json " + log);
    ASSERT_EQ(r.rc, 0) << config << "\n" << r.out;
    runs.push_back(Losses(log));
    ASSERT_EQ(runs.back().size(), 6u) << config;
  }
  EXPECT_LT(runs[0].back(), runs[0].front());  // it learns
  // Without offload torch::optim steps, whose sqrt is MKL's, not IEEE's (README "Exactness"): a
  // few ulps apart, not bitwise.
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_NEAR(runs[1][i], runs[0][i], 1e-6 * std::abs(runs[0][i])) << "step " << i + 1;
  }
}

TEST_F(Gemma2CliTest, ZeroStepExportReproducesTheInputBytes) {
  WriteModel("BF16", 2);
  const std::string data = dir_.path() + "/d.bin";
  WriteTokens(data, 500, 128, 1);
  const std::string out = dir_.path() + "/export";
  const CliRun r = Shell(kStrata + " train --quiet --model " + model_ + " --data " + data +
                         " --seq-len 16 --steps 0 --export " + out);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto in = runtime::HfCheckpoint::Open(model_);
  auto exported = runtime::HfCheckpoint::Open(out);
  ASSERT_TRUE(in.ok() && exported.ok()) << r.out;
  ASSERT_EQ((*in)->tensors().size(), (*exported)->tensors().size());
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
  EXPECT_NE((*exported)->Find("model.layers.1.pre_feedforward_layernorm.weight"), nullptr);
  EXPECT_EQ((*exported)->Find("lm_head.weight"), nullptr);  // tied
  std::ifstream config(out + "/config.json");
  const nlohmann::json c = nlohmann::json::parse(config);
  EXPECT_EQ(c.at("architectures"), nlohmann::json::array({"Gemma2ForCausalLM"}));
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping", "sliding_window",
                          "query_pre_attn_scalar", "hidden_activation", "head_dim"}) {
    EXPECT_EQ(c.at(key), config_.at(key)) << key;
  }
  EXPECT_EQ(c.at("torch_dtype"), "bfloat16");
}

TEST(Gemma2EstimateCliTest, PresetIsPlannedWithItsPublishedSize) {
  const CliRun r = Shell(kStrata + " estimate --model gemma-2-2b --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const nlohmann::json j = LastJson(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j.at("params").get<uint64_t>(), 2'614'341'888u);  // google/gemma-2-2b's safetensors
  EXPECT_EQ(j.at("units").get<uint64_t>(), 26u);
  // A layer's four norms (2304 elements each, under the default persistence threshold) stay
  // resident; its 9 matrices are paged.
  const uint64_t h = 2304, q = 8 * 256, kv = 4 * 256, i = 9216;
  EXPECT_EQ(j.at("unit_params").get<uint64_t>(), 2 * h * q + 2 * h * kv + 3 * h * i);
  EXPECT_EQ(j.at("model").at("architecture").get<std::string>(), "Gemma2ForCausalLM");
}

}  // namespace
}  // namespace strata
