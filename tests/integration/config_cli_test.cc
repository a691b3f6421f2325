// DeepSpeed configs through the binary as a Hugging Face user writes them: "auto" values resolved
// from the flags (or TrainingArguments' defaults) and printed, flags that contradict the config
// refused naming the key, every problem of a file reported in one run, and the sections strata
// ignores accepted with one warning. `strata estimate` resolves the same way.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/testing/cli_run.h"

namespace {

using strata::testing::CliRun;
using strata::testing::Shell;

CliRun Strata(const std::string& args) { return Shell(std::string(STRATA_BINARY) + " " + args); }

#define EXPECT_HAS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing: " << (part) << "\nin:\n" << (text)

// The shape of transformers' tests/deepspeed/ds_config_zero3.json: "auto" wherever HF fills.
constexpr const char* kHfZero3 = R"({
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
           "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW",
                "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                               "warmup_num_steps": "auto"}},
  "zero_optimization": {
    "stage": 3,
    "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "offload_param": {"device": "cpu", "pin_memory": true},
    "overlap_comm": true, "contiguous_gradients": true, "sub_group_size": 1e9,
    "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true
  },
  "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
  "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
  "wall_clock_breakdown": false
})";

class ConfigCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-config-cli-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream data(dir_ + "/data.txt");
    for (int i = 0; i < 300; ++i) data << "Pack my box with five dozen liquor jugs " << i << ".\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) const {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string Train(const std::string& config, const std::string& flags, int steps = 2) const {
    return "train --model tiny --steps " + std::to_string(steps) + " --threads 1 --quiet --data " +
           dir_ + "/data.txt --config " + config + " " + flags;
  }
  std::string dir_;
};

TEST_F(ConfigCliTest, HuggingFaceAutoConfigTrainsAndPrintsWhatEachAutoBecame) {
  const std::string cfg = Write("hf.json", kHfZero3);
  const std::string log = dir_ + "/log.jsonl";
  CliRun r = Strata(Train(cfg, "--lr 3e-4 --micro-batch 2 --grad-accum 2 --log-json " + log, 3));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_HAS(r.out, "optimizer.params.lr: \"auto\" -> 0.0003 (--lr)");
  EXPECT_HAS(r.out, "train_micro_batch_size_per_gpu: \"auto\" -> 2 (--micro-batch)");
  EXPECT_HAS(r.out, "gradient_accumulation_steps: \"auto\" -> 2 (--grad-accum)");
  EXPECT_HAS(r.out, "train_batch_size: \"auto\" -> 4");
  EXPECT_HAS(r.out, "gradient_clipping: \"auto\" -> 1 (Hugging Face's default");
  // tiny's hidden size is 64: HF's rules.
  EXPECT_HAS(r.out, "zero_optimization.reduce_bucket_size: \"auto\" -> 4096");
  EXPECT_HAS(r.out, "zero_optimization.stage3_prefetch_bucket_size: \"auto\" -> 3686");
  EXPECT_HAS(r.out, "zero_optimization.stage3_param_persistence_threshold: \"auto\" -> 640");
  EXPECT_HAS(r.out, "scheduler.params.warmup_num_steps: \"auto\" -> 0");
  EXPECT_HAS(r.out, "fp16.enabled: \"auto\" -> false");
  // The learning rate that ran is the flag's: WarmupLR's warmup is at least 2 steps (DeepSpeed's
  // max(2, warmup_num_steps)), so the third step runs at warmup_max_lr = --lr.
  std::ifstream in(log);
  std::string line, last;
  int steps = 0;
  while (std::getline(in, line)) last = line, ++steps;
  ASSERT_EQ(steps, 3);
  EXPECT_NEAR(nlohmann::json::parse(last)["lr"].get<double>(), 3e-4, 1e-12) << last;
}

TEST_F(ConfigCliTest, FlagsThatContradictTheConfigAreRefusedNamingTheKey) {
  const std::string cfg = Write("explicit.json", R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "gradient_clipping": 0.5})");
  CliRun r = Strata(Train(cfg, "--lr 2e-4 --max-grad-norm 1"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_HAS(r.out, "optimizer.params.lr: the config says 0.001, --lr says 0.0002");
  EXPECT_HAS(r.out, "gradient_clipping: the config says 0.5, --max-grad-norm says 1");
  // Agreeing flags are fine.
  r = Strata(Train(cfg, "--lr 1e-3 --micro-batch 2"));
  EXPECT_EQ(r.rc, 0) << r.out;
}

TEST_F(ConfigCliTest, EveryProblemOfAFileInOneRun) {
  const std::string cfg = Write("bad.json", R"({"train_micro_batch_size_per_gpu": 2,
      "zero_optimization": {"stage": 3, "stage3_prefetch_bucket": 100,
                            "offload_param": {"device": "cpu", "pin_memroy": true}},
      "fp16": {"enabled": false, "loss_scale_windows": 100},
      "optimizer": {"type": "AdamW", "params": {"lr": "fast"}},
      "gradient_acumulation_steps": 2})");
  CliRun r = Strata(Train(cfg, ""));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_HAS(r.out, "5 problems");
  EXPECT_HAS(r.out, "zero_optimization.stage3_prefetch_bucket: unknown key (did you mean "
                    "\"stage3_prefetch_bucket_size\"?)");
  EXPECT_HAS(r.out, "zero_optimization.offload_param.pin_memroy: unknown key (did you mean "
                    "\"pin_memory\"?)");
  EXPECT_HAS(r.out, "fp16.loss_scale_windows: unknown key");
  EXPECT_HAS(r.out, "optimizer.params.lr: expected");
  EXPECT_HAS(r.out, "gradient_acumulation_steps: unknown key (did you mean "
                    "\"gradient_accumulation_steps\"?)");
}

// Inputs that once crashed the binary or were misread: each is refused with exit code 2 and a
// message naming the file and the problem, never a signal. `strata estimate` reads configs the
// same way.
TEST_F(ConfigCliTest, HostileConfigFilesAreRefusedCleanly) {
  std::string deep = "{\"zero_optimization\": ";
  deep += std::string(1 << 20, '[');  // 1 MB deep: overflowed the stack in an error message
  deep += std::string(1 << 20, ']') + "}";
  const std::string deep_path = Write("deep.json", deep);
  const std::string dup = Write("dup.json", R"({"train_micro_batch_size_per_gpu": 2,
      "zero_optimization": {"stage": 3, "stage": 0}})");
  struct Case {
    std::string path;
    std::string message;
  } cases[] = {
      {"/dev/zero", "--config: /dev/zero is a character device, expected a file"},  // grew without bound
      {dir_, "--config: " + dir_ + " is a directory, expected a file"},
      {deep_path, deep_path + ": nested deeper than 64 levels (at byte 85)"},
      {dup, dup + ": duplicate key \"stage\" in zero_optimization"},  // was: stage 0, silently
  };
  for (const Case& c : cases) {
    for (const std::string& command :
         {Train(c.path, ""), "estimate --model tiny --config " + c.path}) {
      CliRun r = Strata(command);
      EXPECT_EQ(r.signal, 0) << command << "\n" << r.out.substr(0, 2000);
      EXPECT_EQ(r.rc, 2) << command << "\n" << r.out.substr(0, 2000);
      EXPECT_HAS(r.out, c.message);
    }
  }
}

TEST_F(ConfigCliTest, SectionsStrataIgnoresAreAcceptedWithOneWarning) {
  const std::string cfg = Write("extra.json", R"({"train_micro_batch_size_per_gpu": 2,
      "zero_optimization": {"stage": 2, "cpu_offload": true, "sub_group_size": 0},
      "comms_logger": {"enabled": true, "verbose": false},
      "monitor_config": {"enabled": true}, "tensorboard": {"enabled": false},
      "hybrid_engine": {"enabled": false}, "compile": {"deepcompile": false},
      "tensor_parallel": {"autotp_size": 1}, "my_project_notes": "kept out of DeepSpeed",
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 0,
                                                        "total_num_steps": "auto"}}})");
  CliRun r = Strata(Train(cfg, ""));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_HAS(r.out, "accepted but ignored by strata: comms_logger, compile, hybrid_engine, "
                    "monitor_config, tensor_parallel, tensorboard");
  EXPECT_HAS(r.out, "not DeepSpeed config keys, ignored (as DeepSpeed ignores them): "
                    "my_project_notes");
  EXPECT_HAS(r.out, "zero_optimization.cpu_offload: deprecated; read as offload_optimizer");
  EXPECT_HAS(r.out, "optimizer on cpu");
  EXPECT_HAS(r.out, "sub_group_size: 0");
}

TEST_F(ConfigCliTest, EstimateResolvesAutoAsTrainDoes) {
  const std::string cfg = Write("hf.json", kHfZero3);
  CliRun r = Strata("estimate --model small --config " + cfg + " --micro-batch 4 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["settings"]["micro_batch"], 4);
  std::string resolved;
  for (const auto& line : j["config"]["auto_resolved"]) resolved += line.get<std::string>() + "\n";
  EXPECT_HAS(resolved, "train_micro_batch_size_per_gpu: \"auto\" -> 4 (--micro-batch)");
  EXPECT_HAS(resolved, "zero_optimization.reduce_bucket_size: \"auto\" -> ");
  r = Strata("estimate --model small --config " + cfg);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_HAS(r.out, "optimizer.params.lr: \"auto\" -> 5e-05 (Hugging Face's default");
}

}  // namespace
