// Mixtures of experts (MixtralForCausalLM, Qwen2MoeForCausalLM) through the user's path: the
// `strata` binary on Hugging Face directories written by the independent reference
// (tests/testing/hf_config_reference.h) from config.json texts shrunk from the published ones.
//   - `strata eval` gives the reference's loss (fp32, relative 1e-5) with and without
//     output_router_logits (the router aux loss), with and without offload; the planted routing
//     bugs make that comparison fail;
//   - `strata train` gives bitwise equal losses with no offload (torch::optim), optimizer on NVMe
//     and parameters + optimizer on NVMe, with experts left without tokens in some steps (stepped
//     on a zero gradient, skipped by none) and the aux loss's gradient entering through the
//     offload units; per-expert paging (--page-experts) gives the same losses and reads less
//     from NVMe, and its bytes per step fall with the experts routed; a resumed run continues
//     with the same losses; with offload_param.buffer_count 2 paged and
//     whole-layer runs keep training (the pinned buffers never all wait on each other);
//   - one AdamW step equals torch's AdamW on the reference's gradients with a zero gradient for an
//     expert no token chose (transformers 5's fused experts get one), which weight decay moves;
//   - `--steps 0 --export` re-exports the input tensors byte for byte;
//   - `strata eval --page-experts` gives the unpaged losses bit for bit (weights on NVMe),
//     and --page-experts on a model without experts is refused by train, eval and generate;
//   - Qwen2-MoE's sliding window (use_sliding_window, max_window_layers or layer_types) at a
//     sequence longer than the window gives the reference's loss, paged or not;
//   - a checkpoint saved with --page-experts resumes without it and the reverse, continuing the
//     uninterrupted run's losses bit for bit (no offload and everything on NVMe), and the paged
//     run's --export is the unpaged one's byte for byte;
//   - the NVMe bytes a run writes are what `strata estimate`'s model (runtime/plan/step_traffic.h)
//     predicts for the units the run's tokens reached (its --log-json units_routed; the optimizer
//     steps every unit), to the byte, with
//     whole layers and with --page-experts; its reads are within the bounds that model states;
//   - 2 ranks (`--nproc 2`) give bitwise the losses of 1 rank with the same global batch when an
//     expert gets tokens on one rank only (the optimizer's "got a gradient" is OR-ed over ranks),
//     and --page-experts on 2 ranks is refused with the reason.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "runtime/persist/hf_checkpoint.h"
#include "runtime/plan/llama_shape.h"
#include "runtime/plan/memory_plan.h"
#include "runtime/plan/step_traffic.h"
#include "tests/testing/cli_data.h"
#include "tests/testing/cli_run.h"
#include "tests/testing/hf_config_reference.h"
#include "tests/testing/hf_reference_families.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using strata::testing::EvalWindows;
using strata::testing::LastJson;
using strata::testing::WriteTokens;

using nlohmann::json;
using strata::testing::CliRun;
using strata::testing::HfWeights;
using strata::testing::Shell;
using strata::testing::TempDir;

const std::string kStrata = STRATA_BINARY;

// mistralai/Mixtral-8x7B-v0.1's config.json, shrunk (hidden 4096 -> 32, 32 layers -> 2, ...).
constexpr const char* kMixtralConfig = R"({
  "architectures": ["MixtralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 32,
  "initializer_range": 0.02,
  "intermediate_size": 48,
  "max_position_embeddings": 32768,
  "model_type": "mixtral",
  "num_attention_heads": 4,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 2,
  "num_key_value_heads": 2,
  "num_local_experts": 8,
  "output_router_logits": false,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.02,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0",
  "use_cache": true,
  "vocab_size": 128
})";

// Qwen/Qwen1.5-MoE-A2.7B's config.json, shrunk, with a dense layer (mlp_only_layers).
constexpr const char* kQwenMoeConfig = R"({
  "architectures": ["Qwen2MoeForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "decoder_sparse_step": 1,
  "eos_token_id": 1,
  "hidden_act": "silu",
  "hidden_size": 32,
  "initializer_range": 0.02,
  "intermediate_size": 56,
  "max_position_embeddings": 8192,
  "max_window_layers": 21,
  "mlp_only_layers": [1],
  "model_type": "qwen2_moe",
  "moe_intermediate_size": 24,
  "norm_topk_prob": false,
  "num_attention_heads": 4,
  "num_experts": 6,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 3,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "shared_expert_intermediate_size": 40,
  "sliding_window": 32768,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.39.0.dev0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 128
})";

// Field `key` of every step of a --log-json file.
std::vector<double> PerStep(const std::string& log_json, const char* key = "loss") {
  std::vector<double> out;
  std::ifstream in(log_json);
  for (std::string line; std::getline(in, line);) {
    out.push_back(json::parse(line).at(key).get<double>());
  }
  return out;
}

std::string WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// engine.json of the checkpoint `save_root/latest` names.
json LatestEngineJson(const std::string& save_root) {
  std::ifstream latest(save_root + "/latest");
  std::string tag;
  latest >> tag;
  std::ifstream f(save_root + "/" + tag + "/engine.json");
  return json::parse(f, nullptr, /*allow_exceptions=*/false);
}

// Parameter name -> the applied steps the optimizer skipped it in, from a checkpoint's engine.json
// (0 where its group records none).
std::map<std::string, int64_t> SkippedSteps(const json& engine) {
  std::map<std::string, int64_t> out;
  for (const json& g : engine.at("groups")) {
    const json& params = g.at("params");
    for (size_t i = 0; i < params.size(); ++i) {
      out[params[i].at("name").get<std::string>()] =
          g.contains("skipped_steps") ? g.at("skipped_steps").at(i).get<int64_t>() : 0;
    }
  }
  return out;
}

class HfMoeCliTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }

  // Writes `config` with the reference's random weights (fp32) to DIR/name; returns the directory.
  std::string WriteModel(const json& config, const std::string& name, uint64_t seed) {
    const std::string model = dir_.path() + "/" + name;
    std::filesystem::remove_all(model);
    std::filesystem::create_directories(model);
    weights_ = strata::testing::RandomWeightsFor(config, seed);
    strata::testing::WriteHfDirectory(model, config, weights_, "F32", 1);
    return model;
  }

  // DeepSpeed configs: no offload, optimizer on NVMe, parameters + optimizer on NVMe (tight).
  // Two pinned parameter buffers, the least: paged and whole layers must train with them
  // (PagedTrainsWithTwoParameterBuffers).
  std::vector<std::pair<std::string, std::string>> Configs(int micro_batch, int accumulation) {
    const std::string d = dir_.path();
    const std::string common =
        R"("train_micro_batch_size_per_gpu": )" + std::to_string(micro_batch) +
        R"(, "gradient_accumulation_steps": )" + std::to_string(accumulation) +
        R"(, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}})";
    return {
        {"none", WriteText(d + "/none.json", "{" + common + "}")},
        {"optimizer_nvme",
         WriteText(d + "/opt.json", "{" + common +
                                        R"(, "zero_optimization": {"stage": 2, "offload_optimizer":
                   {"device": "nvme", "nvme_path": ")" +
                                        d + R"(/swap"}}})")},
        {"all_nvme", WriteText(d + "/all.json", "{" + common +
                                                    R"(, "zero_optimization": {"stage": 3,
                   "sub_group_size": 3000, "stage3_param_persistence_threshold": 100,
                   "stage3_max_live_parameters": 30000, "stage3_prefetch_bucket_size": 20000,
                   "offload_param": {"device": "nvme", "nvme_path": ")" +
                                                    d + R"(/swap", "buffer_count": 2},
                   "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                                                    d + R"(/swap"}}})")},
    };
  }

  TempDir dir_{"strata-hf-moe"};
  HfWeights weights_;
};

double Relative(double a, double b) { return std::abs(a - b) / std::abs(b); }

TEST_F(HfMoeCliTest, EvalMatchesTheReferenceAndFailsWithPlantedRoutingBugs) {
  const std::string data = dir_.path() + "/eval.bin";
  const auto ids = WriteTokens(data, 4 * 17, 128, 3);  // 4 windows of 16 + 1
  const torch::Tensor windows = EvalWindows(ids, 16);
  const auto configs = Configs(/*micro_batch=*/4, 1);  // one eval batch: the aux loss's batch
  for (const char* text : {kMixtralConfig, kQwenMoeConfig}) {
    json config = json::parse(text);
    const std::string arch = config.at("architectures")[0];
    for (const bool aux : {false, true}) {
      config["output_router_logits"] = aux;
      const std::string model = WriteModel(config, "model", 11);
      const double reference = strata::testing::ConfigReferenceLoss(config, weights_, windows);
      double strata_loss = 0;
      for (const auto& [label, deepspeed] : configs) {
        if (label == "optimizer_nvme" || (label == "all_nvme" && !aux)) continue;
        const CliRun r = Shell(kStrata + " eval --model " + model + " --data " + data +
                               " --seq-len 16 --json --config " + deepspeed);
        ASSERT_EQ(r.rc, 0) << arch << " " << label << "\n" << r.out;
        const json j = LastJson(r.out);
        ASSERT_TRUE(j.is_object()) << r.out;
        strata_loss = j.at("loss").get<double>();
        EXPECT_LE(Relative(strata_loss, reference), 1e-5)
            << arch << " aux " << aux << " " << label << ": " << strata_loss << " vs " << reference;
      }
      if (aux) {
        // The aux term is large enough that leaving it out would fail the comparison.
        json without = config;
        without["output_router_logits"] = false;
        EXPECT_GT(
            Relative(strata::testing::ConfigReferenceLoss(without, weights_, windows), reference),
            1e-4)
            << arch;
        continue;
      }
      // The planted bugs change the reference enough to fail the comparison above.
      const std::vector<std::string> bugs =
          arch == "MixtralForCausalLM" ? std::vector<std::string>{"moe_no_topk_renormalization"}
                                       : std::vector<std::string>{"moe_softmax_after_topk",
                                                                  "qwen2moe_no_shared_expert_gate"};
      for (const std::string& bug : bugs) {
        strata::testing::PlantBug(bug);
        const double planted = strata::testing::ConfigReferenceLoss(config, weights_, windows);
        strata::testing::PlantBug("");
        EXPECT_GT(Relative(strata_loss, planted), 1e-4) << arch << " " << bug;
      }
    }
  }
}

TEST_F(HfMoeCliTest, TrainIsBitwiseEqualInEveryOffloadModeAndResumesWithStepCounts) {
  json config = json::parse(kMixtralConfig);
  config["output_router_logits"] = true;  // the aux loss's gradient enters through the units
  // More layers than the all_nvme config's 2 parameter buffers, as in any real model: with 2
  // layers, whole layers keep the whole model in pinned memory and read no parameter after the
  // first step, which no model larger than RAM can do.
  config["num_hidden_layers"] = 4;
  const std::string model = WriteModel(config, "model", 5);
  const std::string data = dir_.path() + "/train.bin";
  // Windows of 4 tokens, 2 per step: 8 tokens choose 2 of 8 experts, so some steps leave experts
  // without a token.
  WriteTokens(data, 5 * 40, 128, 9);
  const auto configs = Configs(/*micro_batch=*/1, /*accumulation=*/2);
  const std::string train =
      kStrata + " train --quiet --model " + model + " --data " + data + " --seq-len 4 ";
  // Per-expert paging (each expert its own unit) too, everything on NVMe.
  std::vector<std::pair<std::string, std::string>> runs = configs;
  runs.emplace_back("all_nvme_paged", configs[2].second);
  std::vector<double> first;
  std::map<std::string, double> read_bytes;
  for (const auto& [label, deepspeed] : runs) {
    const std::string log = dir_.path() + "/" + label + ".jsonl";
    const std::string save = dir_.path() + "/save-" + label;
    const CliRun r =
        Shell(train + "--steps 6 --config " + deepspeed + " --log-json " + log + " --save " + save +
              (label.starts_with("all_nvme") ? " --device-memory 400K" : "") +
              (label == "all_nvme_paged" ? " --page-experts" : ""));
    ASSERT_EQ(r.rc, 0) << label << "\n" << r.out;
    const std::vector<double> losses = PerStep(log);
    ASSERT_EQ(losses.size(), 6u) << label;
    for (double b : PerStep(log, "nvme_read_bytes")) read_bytes[label] += b;
    if (label != "none") {
      // No parameter is skipped: an expert without tokens steps on a zero gradient.
      for (const auto& [name, n] : SkippedSteps(LatestEngineJson(save))) {
        EXPECT_EQ(n, 0) << label << " " << name;
      }
    }
    if (label == "all_nvme_paged") {
      // Some step left some expert without a token (else this test would not exercise the rule),
      // and the optimizer still updated every unit.
      const std::vector<double> routed = PerStep(log, "units_routed");
      const std::vector<double> updated = PerStep(log, "units_updated");
      ASSERT_EQ(routed.size(), updated.size());
      bool some_without = false;
      for (size_t i = 0; i < routed.size(); ++i) {
        EXPECT_EQ(updated[i], 4 * (1 + 8)) << "step " << i + 1;
        some_without = some_without || routed[i] < updated[i];
      }
      EXPECT_TRUE(some_without) << "every expert got a token in every step: the test shows nothing";
    }
    if (first.empty()) {
      first = losses;
      continue;
    }
    for (size_t i = 0; i < losses.size(); ++i) {
      // torch::optim's sqrt without offload is MKL's, not IEEE's (README "Exactness").
      EXPECT_NEAR(losses[i], first[i], 1e-5 * std::abs(first[i])) << label << " step " << i + 1;
    }
  }
  // Paged, the experts without tokens are not read by the gathers and the optimizer, and no
  // expert is read because an earlier pass used it (before experts were kept out of the recorded
  // order, the prefetcher read the previous step's experts and this run read about as much paged
  // as whole layers).
  std::cout << "NVMe bytes read: whole layers " << read_bytes["all_nvme"] << ", paged "
            << read_bytes["all_nvme_paged"] << "\n";
  EXPECT_GT(read_bytes["all_nvme_paged"], 0);
  EXPECT_LT(read_bytes["all_nvme_paged"], read_bytes["all_nvme"]);
  // Resumed at step 3 (with its per-parameter step counts), steps 4..6 are the same again.
  const std::string deepspeed = configs[1].second;
  const std::string save = dir_.path() + "/resume";
  CliRun r = Shell(train + "--steps 3 --config " + deepspeed + " --save " + save);
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::string log = dir_.path() + "/resumed.jsonl";
  r = Shell(train + "--steps 6 --config " + deepspeed + " --resume " + save + " --log-json " + log);
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::vector<double> resumed = PerStep(log);
  ASSERT_EQ(resumed.size(), 3u) << r.out;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(resumed[i], first[3 + i], 1e-5 * std::abs(first[3 + i])) << "step " << 4 + i;
  }
}

// Paged, a step reads the experts its tokens route to: with windows of 1 token (each micro-batch
// routes 2 of 8 experts per layer) a step reads fewer NVMe bytes than with windows of 16 (nearly
// every expert) and than whole layers. Unit bytes do not depend on the window; the routing does.
TEST_F(HfMoeCliTest, PagedNvmeBytesPerStepFallWithTheRoutedExperts) {
  const std::string model = WriteModel(json::parse(kMixtralConfig), "model", 7);
  const std::string data = dir_.path() + "/train.bin";
  WriteTokens(data, 400, 128, 13);
  const std::string deepspeed = Configs(/*micro_batch=*/1, /*accumulation=*/2)[2].second;
  std::map<std::string, double> per_step;
  for (const auto& [label, flags] :
       std::vector<std::pair<std::string, std::string>>{{"paged_1", "--seq-len 1 --page-experts"},
                                                        {"paged_16", "--seq-len 16 --page-experts"},
                                                        {"whole_1", "--seq-len 1"}}) {
    const std::string log = dir_.path() + "/" + label + ".jsonl";
    const CliRun r = Shell(kStrata + " train --quiet --model " + model + " --data " + data +
                           " --steps 4 --device-memory 400K --config " + deepspeed +
                           " --log-json " + log + " " + flags);
    ASSERT_EQ(r.rc, 0) << label << "\n" << r.out;
    const std::vector<double> bytes = PerStep(log, "nvme_read_bytes");
    ASSERT_EQ(bytes.size(), 4u) << label;
    // From step 2: step 1 reads what initialization left out of the pinned slots.
    for (size_t i = 1; i < bytes.size(); ++i) per_step[label] += bytes[i] / 3;
    // What the router's history read ahead and did not use is within what was read.
    double speculative = 0, wasted = 0;
    for (double b : PerStep(log, "speculative_read_bytes")) speculative += b;
    for (double b : PerStep(log, "speculative_wasted_bytes")) wasted += b;
    EXPECT_LE(wasted, speculative) << label;
    if (label.starts_with("whole")) {
      EXPECT_EQ(speculative, 0) << label;
    }
  }
  std::cout << "NVMe bytes per step: paged, 1 token " << per_step["paged_1"]
            << "; paged, 16 tokens " << per_step["paged_16"] << "; whole layers "
            << per_step["whole_1"] << "\n";
  EXPECT_LT(per_step["paged_1"], per_step["paged_16"]);
  EXPECT_LT(per_step["paged_1"], per_step["whole_1"]);
}

// Paged with offload_param.buffer_count 2 (the smallest): the optimizer's deferred updates, its
// write-behind queue and the gathers share the pinned parameter buffers. Before an updated copy
// was written back before it left pinned memory (tiers/tier_manager.h), these runs stopped within
// a few steps ("pinned tier cannot hold block param/...: everything resident there is pinned or
// in use"), paged or (with more layers than buffers) whole layers. In fp32 the losses equal the
// whole-layer run's.
TEST_F(HfMoeCliTest, PagedTrainsWithTwoParameterBuffers) {
  json config = json::parse(kMixtralConfig);
  config["num_hidden_layers"] = 4;  // more layers than the buffers hold: copies come and go
  const std::string model = WriteModel(config, "model", 3);
  const std::string data = dir_.path() + "/train.bin";
  WriteTokens(data, 400, 128, 17);
  for (const char* precision : {"", R"("bf16": {"enabled": true}, )"}) {
    for (const char* optimizer : {"cpu", "nvme"}) {
      if (*precision && std::string(optimizer) == "nvme") continue;
      const std::string label =
          std::string(*precision ? "bf16" : "fp32") + " optimizer " + optimizer;
      const std::string deepspeed = WriteText(
          dir_.path() + "/bc2.json",
          std::string(
              R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, )") +
              precision + R"("optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100,
              "offload_param": {"device": "nvme", "nvme_path": ")" +
              dir_.path() + R"(/swap", "buffer_count": 2},
              "offload_optimizer": {"device": ")" +
              optimizer + R"(", "nvme_path": ")" + dir_.path() + R"(/swap"}}})");
      std::map<std::string, std::vector<double>> losses;
      for (const char* paging : {" --page-experts", ""}) {
        const std::string log = dir_.path() + "/bc2-" + (*paging ? "paged" : "whole") + ".jsonl";
        std::filesystem::remove(log);
        const CliRun r =
            Shell(kStrata + " train --quiet --model " + model + " --data " + data +
                  " --seq-len 4 --steps 6 --config " + deepspeed + " --log-json " + log + paging);
        ASSERT_EQ(r.rc, 0) << label << paging << "\n" << r.out;
        losses[paging] = PerStep(log);
        ASSERT_EQ(losses[paging].size(), 6u) << label << paging;
        double read = 0;
        for (double b : PerStep(log, "nvme_read_bytes")) read += b;
        EXPECT_GT(read, 0) << label << paging << ": the buffers held everything";
      }
      if (!*precision) {
        EXPECT_EQ(losses[" --page-experts"], losses[""]) << label;
      }
    }
  }
}

TEST_F(HfMoeCliTest, AnExpertWithoutTokensStepsOnAZeroGradientAsTorchAdamWOnFusedExperts) {
  json config = json::parse(kMixtralConfig);
  const std::string model = WriteModel(config, "model", 21);
  const std::string data = dir_.path() + "/one.bin";
  const auto ids = WriteTokens(data, 5, 128, 4);  // one window of 4 tokens: step 1's only sample
  const torch::Tensor window = EvalWindows(ids, 4);
  const std::string save = dir_.path() + "/save";
  const std::string out = dir_.path() + "/export";
  const CliRun r = Shell(kStrata + " train --quiet --model " + model + " --data " + data +
                         " --seq-len 4 --steps 1 --config " + Configs(1, 1)[1].second + " --save " +
                         save + " --export " + out);
  ASSERT_EQ(r.rc, 0) << r.out;

  // torch.optim.AdamW on the reference's gradients (cross-entropy, no aux loss), as transformers 5
  // trains it: its experts are one fused tensor, so an expert no token chose has a zero gradient
  // (momentum and weight decay still apply), not none.
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  HfWeights trainable;
  for (const auto& [name, t] : weights_) {
    names.push_back(name);
    params.push_back(t.clone().requires_grad_(true));
    trainable[name] = params.back();
  }
  const torch::Tensor inputs = window.slice(1, 0, 4), targets = window.slice(1, 1, 5);
  const torch::Tensor logits =
      strata::testing::families::MoeLogits(config, trainable, inputs, nullptr);
  torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape(-1))
      .backward();
  std::vector<bool> had_grad;
  for (torch::Tensor& p : params) {
    had_grad.push_back(p.grad().defined());
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
  }
  torch::optim::AdamW adamw(params, torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  adamw.step();

  auto exported = runtime::HfCheckpoint::Open(out);
  ASSERT_TRUE(exported.ok()) << r.out;
  const std::map<std::string, int64_t> skipped = SkippedSteps(LatestEngineJson(save));
  int without_tokens = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    torch::Tensor got = torch::empty(params[i].sizes(), torch::kFloat32);
    ASSERT_TRUE((*exported)->ReadFloat32(name, got.data_ptr<float>()).ok()) << name;
    ASSERT_TRUE(skipped.count(name)) << name;
    EXPECT_EQ(skipped.at(name), 0) << name;
    if (!had_grad[i]) {
      ++without_tokens;
      EXPECT_FALSE(torch::equal(got, weights_.at(name)))
          << name << ": weight decay did not move it";
    }
    const double diff = (got - params[i].detach()).abs().max().item<double>();
    EXPECT_LE(diff, 3e-6) << name;
  }
  EXPECT_GT(without_tokens, 0) << "no expert went without a token: the test shows nothing";
}

TEST_F(HfMoeCliTest, ZeroStepExportReproducesTheInputBytes) {
  for (const char* text : {kMixtralConfig, kQwenMoeConfig}) {
    const json config = json::parse(text);
    const std::string model = WriteModel(config, "model", 2);
    const std::string data = dir_.path() + "/d.bin";
    WriteTokens(data, 100, 128, 1);
    const std::string out = dir_.path() + "/export";
    std::filesystem::remove_all(out);
    const CliRun r = Shell(kStrata + " train --quiet --model " + model + " --data " + data +
                           " --seq-len 8 --steps 0 --export " + out);
    ASSERT_EQ(r.rc, 0) << r.out;
    auto in = runtime::HfCheckpoint::Open(model);
    auto exported = runtime::HfCheckpoint::Open(out);
    ASSERT_TRUE(in.ok() && exported.ok()) << r.out;
    ASSERT_EQ((*in)->tensors().size(), (*exported)->tensors().size());
    for (const auto& t : (*in)->tensors()) {
      const runtime::HfTensorInfo* e = (*exported)->Find(t.name);
      ASSERT_NE(e, nullptr) << t.name;
      EXPECT_EQ(e->shape, t.shape) << t.name;
      std::string a(t.end - t.begin, '\0'), b(e->end - e->begin, '\0');
      ASSERT_TRUE((*in)->ReadRaw(t.name, a.data()).ok());
      ASSERT_TRUE((*exported)->ReadRaw(t.name, b.data()).ok());
      EXPECT_TRUE(a == b) << t.name << " differs";
    }
    std::ifstream exported_config(out + "/config.json");
    const json c = json::parse(exported_config);
    EXPECT_EQ(c.at("architectures"), config.at("architectures"));
  }
}

// Every file of directory `a` has the same bytes in `b`, and `b` has no other file.
void ExpectSameFiles(const std::string& a, const std::string& b) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(a)) {
    names.insert(e.path().filename().string());
    std::ifstream fa(e.path(), std::ios::binary),
        fb(b + "/" + e.path().filename().string(), std::ios::binary);
    ASSERT_TRUE(fb.good()) << e.path().filename() << " missing in " << b;
    const std::string ca((std::istreambuf_iterator<char>(fa)), std::istreambuf_iterator<char>());
    const std::string cb((std::istreambuf_iterator<char>(fb)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(ca == cb) << e.path().filename() << " differs between " << a << " and " << b;
  }
  for (const auto& e : std::filesystem::directory_iterator(b)) {
    EXPECT_TRUE(names.count(e.path().filename().string())) << e.path() << " only in " << b;
  }
  EXPECT_GT(names.size(), 1u);  // config.json and the weights at least
}

// Qwen2-MoE's shared expert is a unit of its own when paged: the gradient of the layer's input
// must be summed in the same order either way (before the shared expert's two uses of its input
// were added into that gradient one by one whole-layer, and the paged run's losses and weights
// drifted from step 1 by 1e-7 and 1e-5). Losses bitwise, exports the same bytes, with and
// without the aux loss, optimizer on NVMe and everything on NVMe.
TEST_F(HfMoeCliTest, QwenMoePagedTrainsBitwiseAsWholeLayers) {
  for (const bool aux : {false, true}) {
    json config = json::parse(kQwenMoeConfig);
    config["output_router_logits"] = aux;
    const std::string model = WriteModel(config, aux ? "qwen-aux" : "qwen", 11);
    const std::string data = dir_.path() + "/qwen.bin";
    WriteTokens(data, 400, 128, 23);
    for (const auto& [label, deepspeed] : Configs(/*micro_batch=*/2, /*accumulation=*/2)) {
      if (label == "none") continue;
      std::map<bool, std::vector<double>> losses;
      for (const bool paged : {false, true}) {
        const std::string tag = label + (aux ? "-aux" : "") + (paged ? "-paged" : "-whole");
        const std::string log = dir_.path() + "/" + tag + ".jsonl";
        const CliRun r =
            Shell(kStrata + " train --quiet --model " + model + " --data " + data +
                  " --seq-len 6 --steps 4 --config " + deepspeed + " --log-json " + log +
                  " --export " + dir_.path() + "/export-" + tag + (paged ? " --page-experts" : ""));
        ASSERT_EQ(r.rc, 0) << tag << "\n" << r.out;
        losses[paged] = PerStep(log);
        ASSERT_EQ(losses[paged].size(), 4u) << tag;
      }
      for (size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(losses[true][i], losses[false][i])
            << label << " aux " << aux << " step " << i + 1;
      }
      const std::string base = dir_.path() + "/export-" + label + (aux ? "-aux" : "");
      ExpectSameFiles(base + "-whole", base + "-paged");
    }
  }
}

TEST_F(HfMoeCliTest, PagedEvalGivesTheUnpagedLossAndModelsWithoutExpertsAreRefused) {
  const std::string data = dir_.path() + "/eval.bin";
  WriteTokens(data, 4 * 17, 128, 5);
  const auto configs = Configs(/*micro_batch=*/2, 1);
  for (const char* text : {kMixtralConfig, kQwenMoeConfig}) {
    json config = json::parse(text);
    config["output_router_logits"] = true;
    const std::string arch = config.at("architectures")[0];
    const std::string model = WriteModel(config, "model", 13);
    for (const auto& [label, deepspeed] : configs) {
      if (label != "all_nvme") continue;  // parameters paged unit by unit from NVMe
      double losses[2] = {0, 0};
      for (const bool paged : {false, true}) {
        const CliRun r =
            Shell(kStrata + " eval --model " + model + " --data " + data +
                  " --seq-len 16 --json --config " + deepspeed + (paged ? " --page-experts" : ""));
        ASSERT_EQ(r.rc, 0) << arch << " " << label << "\n" << r.out;
        losses[paged] = LastJson(r.out).at("loss").get<double>();
      }
      EXPECT_EQ(losses[1], losses[0]) << arch << " " << label;
    }
  }
  // A dense model has no experts to page: each command refuses, naming the flag.
  const json llama = json::parse(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 32,
      "intermediate_size": 48, "num_attention_heads": 4, "num_hidden_layers": 1,
      "num_key_value_heads": 2, "vocab_size": 128})");
  const std::string dense = WriteModel(llama, "dense", 1);
  const std::string ids = WriteText(dir_.path() + "/p.ids", "1 2 3");
  for (const std::string& args :
       {"eval --model " + dense + " --data " + data + " --seq-len 8",
        "train --quiet --steps 1 --model " + dense + " --data " + data + " --seq-len 8",
        "generate --model " + dense + " --prompt-ids " + ids}) {
    const CliRun r = Shell(kStrata + " " + args + " --page-experts");
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("--page-experts needs a mixture of experts"), std::string::npos)
        << args << "\n"
        << r.out;
    EXPECT_NE(r.out.find("has no experts"), std::string::npos) << r.out;
  }
}

// Qwen2-MoE with use_sliding_window at 16 tokens past a window of 5: layers 0 and 2 slide
// (transformers 5's rule: even layers below max_window_layers), or those layer_types lists.
TEST_F(HfMoeCliTest, QwenMoeSlidingWindowEvalMatchesTheReference) {
  const std::string data = dir_.path() + "/eval.bin";
  const auto ids = WriteTokens(data, 4 * 17, 128, 7);
  const torch::Tensor windows = EvalWindows(ids, 16);
  json base = json::parse(kQwenMoeConfig);
  base["use_sliding_window"] = true;
  base["sliding_window"] = 5;
  base["max_window_layers"] = 3;
  json listed = base;
  listed["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention"};
  for (const json& config : {base, listed}) {
    const bool has_types = config.contains("layer_types");
    const std::string model = WriteModel(config, "model", 17);
    const double reference = strata::testing::ConfigReferenceLoss(config, weights_, windows);
    double losses[2] = {0, 0};
    for (const bool paged : {false, true}) {
      const CliRun r =
          Shell(kStrata + " eval --model " + model + " --data " + data +
                " --seq-len 16 --micro-batch 4 --json" + (paged ? " --page-experts" : ""));
      ASSERT_EQ(r.rc, 0) << r.out;
      losses[paged] = LastJson(r.out).at("loss").get<double>();
      EXPECT_LE(Relative(losses[paged], reference), 1e-5)
          << "layer_types " << has_types << " paged " << paged << ": " << losses[paged] << " vs "
          << reference;
      // Without layer_types the log says which layers slide, and that transformers 4.x differed.
      EXPECT_EQ(r.out.find("use_sliding_window without layer_types: layers 0, 2 slide") !=
                    std::string::npos,
                !has_types)
          << r.out;
    }
    EXPECT_EQ(losses[1], losses[0]);
    // The window, its width and (without layer_types) its layers all change the loss enough to
    // fail the comparison above.
    json unwindowed = config;
    unwindowed["use_sliding_window"] = false;
    EXPECT_GT(
        Relative(losses[0], strata::testing::ConfigReferenceLoss(unwindowed, weights_, windows)),
        1e-4);
    std::vector<std::string> bugs = {"sliding_window_off_by_one"};
    if (!has_types) bugs.push_back("qwen2moe_window_layers_as_qwen2");
    for (const std::string& bug : bugs) {
      strata::testing::PlantBug(bug);
      const double planted = strata::testing::ConfigReferenceLoss(config, weights_, windows);
      strata::testing::PlantBug("");
      EXPECT_GT(Relative(losses[0], planted), 1e-4) << bug;
    }
  }
}

// A run saved with --page-experts (each expert, attention and dense MLP its own offload unit, so
// its checkpoint's groups differ) resumes without it, and an unpaged run's checkpoint resumes with
// it: both continue the uninterrupted run's losses bit for bit. The exports of paged and unpaged
// runs are the same files.
TEST_F(HfMoeCliTest, CheckpointsResumeAcrossPagingAndExportsAreTheSameBytes) {
  json config = json::parse(kMixtralConfig);
  config["output_router_logits"] = true;
  const std::string model = WriteModel(config, "model", 5);
  const std::string data = dir_.path() + "/train.bin";
  WriteTokens(data, 5 * 40, 128, 9);
  const auto configs = Configs(/*micro_batch=*/1, /*accumulation=*/2);
  const std::string train =
      kStrata + " train --quiet --model " + model + " --data " + data + " --seq-len 4 ";
  for (const auto& [label, deepspeed] : configs) {
    if (label == "optimizer_nvme") continue;
    SCOPED_TRACE(label);
    const std::string common =
        train + "--config " + deepspeed + (label == "all_nvme" ? " --device-memory 400K" : "");
    const std::string d = dir_.path() + "/" + label;
    std::filesystem::create_directories(d);
    CliRun r = Shell(common + " --steps 6 --log-json " + d + "/straight.jsonl");
    ASSERT_EQ(r.rc, 0) << r.out;
    const std::vector<double> straight = PerStep(d + "/straight.jsonl");
    ASSERT_EQ(straight.size(), 6u);
    for (const bool paged : {false, true}) {
      const std::string flag = paged ? " --page-experts" : "";
      const std::string tag = paged ? "paged" : "whole";
      r = Shell(common + " --steps 3" + flag + " --save " + d + "/save-" + tag + " --export " + d +
                "/export-" + tag);
      ASSERT_EQ(r.rc, 0) << r.out;
    }
    ExpectSameFiles(d + "/export-whole", d + "/export-paged");
    for (const bool paged : {false, true}) {
      // Resumed in the other mode than it was saved in.
      const std::string saved = d + (paged ? "/save-whole" : "/save-paged");
      const std::string log = d + (paged ? "/resumed-paged.jsonl" : "/resumed-whole.jsonl");
      r = Shell(common + " --steps 6 --resume " + saved + " --log-json " + log +
                (paged ? " --page-experts" : ""));
      ASSERT_EQ(r.rc, 0) << r.out;
      const std::vector<double> resumed = PerStep(log);
      ASSERT_EQ(resumed.size(), 3u) << r.out;
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(resumed[i], straight[3 + i]) << "paged " << paged << " step " << 4 + i;
      }
    }
    // `strata eval --resume` of the paged checkpoint, with and without paging: the same loss.
    if (label != "all_nvme") continue;
    double losses[2] = {0, 0};
    for (const bool paged : {false, true}) {
      r = Shell(kStrata + " eval --model " + model + " --data " + data +
                " --seq-len 4 --max-batches 2 --json --config " + deepspeed + " --resume " + d +
                "/save-paged" + (paged ? " --page-experts" : ""));
      ASSERT_EQ(r.rc, 0) << r.out;
      losses[paged] = LastJson(r.out).at("loss").get<double>();
    }
    EXPECT_EQ(losses[1], losses[0]);
  }
}

// The JSON lines of --log-json `path`.
std::vector<json> LogLines(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

// NVMe bytes in each step's window of a run with parameters and optimizer on NVMe (fp32,
// sub-groups of 3000, persistence threshold 100: Configs' all_nvme), one micro-batch of 4 tokens
// per step: a step writes its gradient hand-offs and the resident group's state (stepped at
// once), and the units' updates of the step before (deferred into this step's forward). The units
// each step updated come from the run's own log; routed experts are all alike, so their count
// says how many expert units ran and were stepped. Writes are predicted to the byte. Reads are
// not: the model counts a read at every use, and a block the pinned slots still hold is not read
// again, so whole layers (whose order never changes, so nothing is read ahead in vain) read at
// most the prediction; paged, the prefetcher also reads ahead the experts the previous step
// routed to, some of which this step does not use, so only the saving against whole layers is
// checked.
TEST_F(HfMoeCliTest, WrittenBytesAreTheEstimatesForTheExpertsTheRunUpdated) {
  json config = json::parse(kMixtralConfig);
  const std::string model = WriteModel(config, "model", 5);
  const std::string data = dir_.path() + "/train.bin";
  WriteTokens(data, 5 * 40, 128, 9);
  const auto configs = Configs(/*micro_batch=*/1, /*accumulation=*/1);
  std::map<bool, double> read_bytes;
  for (const bool paged : {false, true}) {
    const std::string log = dir_.path() + (paged ? "/paged.jsonl" : "/whole.jsonl");
    const CliRun r =
        Shell(kStrata + " train --quiet --model " + model + " --data " + data +
              " --seq-len 4 --steps 6 --device-memory 400K --config " + configs[2].second +
              " --log-json " + log + (paged ? " --page-experts" : ""));
    ASSERT_EQ(r.rc, 0) << r.out;
    const std::vector<json> steps = LogLines(log);
    ASSERT_EQ(steps.size(), 6u);

    runtime::LlamaShape shape = *runtime::ParseHfConfig(config, "config.json");
    shape.page_experts = paged;
    runtime::PlanInput in = runtime::LlamaPlanInput(shape, 1, 4, /*compute_bytes=*/4, 3000, 100);
    in.params = in.optimizer = Home::kNvme;
    std::vector<bool> expert;
    for (int64_t l = 0; l < shape.num_hidden_layers; ++l) {
      for (const auto& u : runtime::LlamaLayerUnits(shape, l)) {
        expert.push_back(u.kind == runtime::LlamaUnitTensors::Kind::kExpert);
      }
    }
    const size_t units = in.layout.unit_numel.size();
    ASSERT_EQ(units, paged ? 2u * (1 + 8) : 2u);
    const double experts = paged ? 16 : 0;
    const double others = static_cast<double>(units) - experts;
    // Per step: the traffic of the units its tokens reached (a share of the alike experts; every
    // unit is stepped), split into what falls in its own window and what its successor's holds.
    auto traffic = [&](double routed) {
      const double share = experts > 0 ? (routed - others) / experts : 1;
      std::vector<runtime::UnitUse> use(units);
      for (size_t u = 0; u < units; ++u)
        use[u] = expert[u] ? runtime::UnitUse{share, share, 1} : runtime::UnitUse{1, 1, 1};
      return runtime::NvmeTrafficPerStep(in, 1, use);
    };
    // The resident group's share: its state is stepped at once, not deferred.
    const runtime::StepTraffic resident =
        runtime::NvmeTrafficPerStep(in, 1, std::vector<runtime::UnitUse>(units, {0, 0, 0}));
    double deferred = 0;  // the previous step's units' updates
    double predicted_read = 0;
    for (size_t s = 0; s < steps.size(); ++s) {
      const double updated = steps[s].at("units_routed").get<double>();
      EXPECT_EQ(steps[s].at("units_updated").get<double>(), static_cast<double>(units));
      if (paged) {
        EXPECT_GE(updated, others) << "step " << s + 1;  // attention runs every step
        EXPECT_LE(updated, static_cast<double>(units)) << "step " << s + 1;
      } else {
        EXPECT_EQ(updated, 2) << "step " << s + 1;  // whole layers: every layer every step
      }
      const runtime::StepTraffic t = traffic(updated);
      const double expected = t.grads_written + resident.optimizer_written + deferred;
      EXPECT_NEAR(steps[s].at("nvme_written_bytes").get<double>(), expected, 1)
          << (paged ? "paged" : "whole") << " step " << s + 1 << " with " << updated << " units";
      deferred = t.optimizer_written - resident.optimizer_written;
      predicted_read += t.read();
      read_bytes[paged] += steps[s].at("nvme_read_bytes").get<double>();
      std::cout << (paged ? "paged" : "whole") << " step " << s + 1 << ": " << updated
                << " units, read " << steps[s].at("nvme_read_bytes").get<double>() << " predicted "
                << t.read() << ", written " << steps[s].at("nvme_written_bytes").get<double>()
                << " predicted " << expected << "\n";
    }
    if (!paged) {
      EXPECT_LE(read_bytes[paged], predicted_read);
    }
  }
  // (Paged reads are not compared with whole layers here: every expert's state is read by the
  // optimizer either way, and whole layers keep both layers pinned. PagedNvmeBytesPerStepFall...
  // checks that paging reads less where the passes dominate.)
}

// The optimizer's rule ("a parameter with a gradient on some rank, in some micro-batch") across
// ranks. Each window repeats one token, so every position of a window has the same hidden state
// in every layer and routes to the same 2 experts: a rank holding one window reaches exactly 2 of
// a layer's 8 experts. The 1-rank paged run's units_routed shows that a step's two windows reach
// more than 2 in some layer, so some expert gets tokens on one rank only: a rank that skipped its
// slice of that expert would differ from 1 rank.
TEST_F(HfMoeCliTest, TwoRanksGiveOneRanksLossesWhenAnExpertHasTokensOnOneRankOnly) {
  if (!STRATA_HAVE_GLOO) GTEST_SKIP() << "built without Gloo: no --nproc";
  json config = json::parse(kMixtralConfig);
  config["output_router_logits"] = true;  // the aux loss's gradient too
  const std::string model = WriteModel(config, "model", 5);
  const std::string data = dir_.path() + "/repeated.bin";
  {
    std::mt19937 rng(3);
    std::vector<uint16_t> raw;
    for (int w = 0; w < 40; ++w) raw.insert(raw.end(), 5, static_cast<uint16_t>(rng() % 128));
    std::ofstream(data, std::ios::binary)
        .write(reinterpret_cast<const char*>(raw.data()),
               static_cast<std::streamsize>(raw.size() * 2));
  }
  // Global batch 2 windows: 1 rank x micro-batch 1 x 2 accumulation, or 2 ranks x 1 x 1.
  const std::string nvme = dir_.path() + "/swap";
  const std::string deepspeed =
      WriteText(dir_.path() + "/ranks.json",
                R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": "auto",
      "strata": {"comms_timeout_seconds": 60},
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
      "zero_optimization": {"stage": 3, "sub_group_size": 3000,
        "stage3_param_persistence_threshold": 100,
        "offload_param": {"device": "nvme", "nvme_path": ")" +
                    nvme + R"(", "buffer_count": 2},
        "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                    nvme + R"("}}})");
  const std::string train = kStrata + " train --quiet --model " + model + " --data " + data +
                            " --seq-len 4 --steps 5 --config " + deepspeed;
  auto run = [&](const std::string& label, const std::string& flags) {
    const std::string log = dir_.path() + "/" + label + ".jsonl";
    const CliRun r = Shell(train + " --log-json " + log + " " + flags);
    EXPECT_EQ(r.rc, 0) << label << "\n" << r.out;
    return LogLines(log);
  };
  const std::vector<json> one = run("one", "--grad-accum 2");
  const std::vector<json> paged = run("paged", "--grad-accum 2 --page-experts");
  const std::vector<json> two = run("two", "--grad-accum 1 --nproc 2");
  ASSERT_EQ(one.size(), 5u);
  ASSERT_EQ(paged.size(), 5u);
  ASSERT_EQ(two.size(), 5u);
  double most = 0;
  for (size_t s = 0; s < one.size(); ++s) {
    EXPECT_EQ(two[s].at("loss").get<double>(), one[s].at("loss").get<double>()) << "step " << s + 1;
    EXPECT_EQ(paged[s].at("loss").get<double>(), one[s].at("loss").get<double>())
        << "step " << s + 1;
    most = std::max(most, paged[s].at("units_routed").get<double>());
  }
  // 2 attention units and 2 experts per layer per window: one window alone updates 6 units.
  EXPECT_GT(most, 2 + 2 * 2) << "no expert had tokens on one rank only: the test shows nothing";
  EXPECT_LT(most, 2 + 2 * 8);  // and some expert none

  // Per-expert paging on 2 ranks would have ranks gather different experts: refused, saying why.
  const CliRun refused = Shell(train + " --grad-accum 1 --nproc 2 --page-experts");
  EXPECT_EQ(refused.rc, 2) << refused.out;
  EXPECT_NE(refused.out.find("--page-experts runs on one rank only"), std::string::npos)
      << refused.out;
}

}  // namespace
}  // namespace strata
