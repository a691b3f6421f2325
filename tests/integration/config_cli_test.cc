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
#include <vector>

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
  EXPECT_HAS(r.out,
             "zero_optimization.stage3_prefetch_bucket: unknown key (did you mean "
             "\"stage3_prefetch_bucket_size\"?)");
  EXPECT_HAS(r.out,
             "zero_optimization.offload_param.pin_memroy: unknown key (did you mean "
             "\"pin_memory\"?)");
  EXPECT_HAS(r.out, "fp16.loss_scale_windows: unknown key");
  EXPECT_HAS(r.out, "optimizer.params.lr: expected");
  EXPECT_HAS(r.out,
             "gradient_acumulation_steps: unknown key (did you mean "
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
      {"/dev/zero",
       "--config: /dev/zero is a character device, expected a file"},  // grew without bound
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
  EXPECT_HAS(r.out,
             "accepted but ignored by strata: comms_logger, compile, hybrid_engine, "
             "monitor_config, tensor_parallel, tensorboard");
  EXPECT_HAS(r.out,
             "not DeepSpeed config keys, ignored (as DeepSpeed ignores them): "
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

// offload_param.buffer_count / buffer_size / max_in_cpu and offload_optimizer.buffer_count, as
// DeepSpeed defines them: each changes the pinned arena `strata estimate` plans and `strata train`
// allocates (the same bytes), none changes a loss (bitwise), and a value that cannot work is
// refused by both commands naming the key and the least value that works. tiny's blocks are the
// offload units (persistence threshold 0), so the numbers follow from estimate's own plan.
class OffloadBufferKeysTest : public ConfigCliTest {
 protected:
  // The tiny preset's ZeRO-3 config with both offloads on NVMe; `param` and `optimizer` are extra
  // keys of offload_param and offload_optimizer (each starting with a comma).
  std::string Config(const std::string& name, const std::string& param,
                     const std::string& optimizer) const {
    return Write(name, R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
        "sub_group_size": 20000,
        "offload_param": {"device": "nvme", "nvme_path": ")" +
                           dir_ + "/nvme\"" + param + R"(},
        "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                           dir_ + "/nvme\"" + optimizer + "}}}");
  }
  nlohmann::json Estimate(const std::string& cfg, const std::string& flags = "") const {
    CliRun r = Strata("estimate --model tiny --json --config " + cfg + " " + flags);
    EXPECT_EQ(r.rc, 0) << r.out;
    if (r.rc != 0) return nlohmann::json::object();
    return nlohmann::json::parse(r.out.substr(r.out.find('{')));
  }
  static uint64_t Arena(const nlohmann::json& estimate) {
    return estimate["config"]["plan"]["pinned_arena_bytes"].get<uint64_t>();
  }
  // Trains 3 steps; the per-step JSON lines.
  std::vector<nlohmann::json> TrainLog(const std::string& cfg, const std::string& flags = "") {
    const std::string log = dir_ + "/" + std::to_string(logs_++) + ".jsonl";
    CliRun r = Strata(Train(cfg, "--log-json " + log + " " + flags, 3));
    EXPECT_EQ(r.rc, 0) << r.out;
    return strata::testing::JsonLines(log);
  }
  int logs_ = 0;
};

TEST_F(OffloadBufferKeysTest, EachKeyChangesTheArenaAndNoLoss) {
  const nlohmann::json base = Estimate(Config("base.json", R"(, "buffer_count": 2)", ""));
  ASSERT_TRUE(base.contains("config"));
  const uint64_t unit = base["config"]["plan"]["largest_unit"].get<uint64_t>();
  const uint64_t group = base["config"]["plan"]["largest_sub_group"].get<uint64_t>();
  const uint64_t units = base["units"].get<uint64_t>();
  ASSERT_GE(units, 2u);
  ASSERT_GT(unit, 0u);
  auto padded = [](uint64_t bytes) { return (bytes + 4095) / 4096 * 4096; };
  struct Case {
    std::string name, param, optimizer;
    uint64_t extra;  // pinned bytes over the base
  } cases[] = {
      // Three more parameter slots of one unit each (fp32).
      {"count5", R"(, "buffer_count": 5)", "", 3 * padded(4 * unit)},
      // The first unit kept in pinned memory (no NVMe extent, no slot taken from the pool).
      {"in_cpu", R"(, "buffer_count": 2, "max_in_cpu": )" + std::to_string(unit), "",
       padded(4 * unit)},
      // A buffer of exactly one unit is accepted and changes nothing.
      {"size", R"(, "buffer_count": 2, "buffer_size": )" + std::to_string(unit), "", 0},
      // 20 swap tensors = 5 sub-groups of Adam's 4 (master, 2 moments, gradient): two more
      // sub-group buffers than the pipeline's 3.
      {"opt20", R"(, "buffer_count": 2)", R"(, "buffer_count": 20)",
       2 * (padded(12 * group) + padded(4 * group))},
  };
  const std::vector<nlohmann::json> base_log =
      TrainLog(Config("base.json", R"(, "buffer_count": 2)", ""));
  ASSERT_EQ(base_log.size(), 3u);
  EXPECT_EQ(base_log[0]["pinned_capacity_bytes"].get<uint64_t>(), Arena(base));
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string cfg = Config(c.name + ".json", c.param, c.optimizer);
    const nlohmann::json e = Estimate(cfg);
    ASSERT_TRUE(e.contains("config"));
    EXPECT_EQ(Arena(e), Arena(base) + c.extra);
    const std::vector<nlohmann::json> log = TrainLog(cfg);
    ASSERT_EQ(log.size(), 3u);
    EXPECT_EQ(log[0]["pinned_capacity_bytes"].get<uint64_t>(), Arena(e));  // the engine's arena
    for (size_t i = 0; i < log.size(); ++i) {  // bitwise: the JSON carries every digit
      EXPECT_EQ(log[i]["loss"].get<double>(), base_log[i]["loss"].get<double>()) << i;
    }
    if (c.name == "in_cpu") {  // one unit's parameters are never written to NVMe again
      EXPECT_EQ(log[2]["nvme_written_bytes"].get<double>() + padded(4 * unit),
                base_log[2]["nvme_written_bytes"].get<double>());
    }
  }
  EXPECT_LT(base_log[2]["loss"].get<double>(), base_log[0]["loss"].get<double>());
}

TEST_F(OffloadBufferKeysTest, ValuesThatCannotWorkAreRefusedNamingTheNeed) {
  const nlohmann::json base = Estimate(Config("base.json", "", ""));
  ASSERT_TRUE(base.contains("config"));
  const std::string unit = std::to_string(base["config"]["plan"]["largest_unit"].get<uint64_t>());
  struct Case {
    std::string name, param, optimizer, says;
  } cases[] = {
      {"size", R"(, "buffer_size": 1000)", "",
       "zero_optimization.offload_param.buffer_size: 1000 elements cannot hold the largest "
       "offload unit on NVMe (" +
           unit +
           " elements; a pinned parameter buffer holds one whole "
           "unit, as DeepSpeed's holds one whole partition): set it to at least " +
           unit},
      {"opt", "", R"(, "buffer_count": 3)",
       "zero_optimization.offload_optimizer.buffer_count: 3 cannot hold one sub-group's 4 "
       "swapped tensors (fp32 master, 2 optimizer moments and the fp32 gradient): set it to at "
       "least 4"},
  };
  for (const Case& c : cases) {
    const std::string cfg = Config(c.name + ".json", c.param, c.optimizer);
    for (const std::string& command : {Train(cfg, ""), "estimate --model tiny --config " + cfg}) {
      SCOPED_TRACE(command);
      CliRun r = Strata(command);
      EXPECT_EQ(r.rc, 2) << r.out;
      EXPECT_EQ(r.signal, 0);
      EXPECT_HAS(r.out, c.says);
      EXPECT_EQ(r.out.find("done after"), std::string::npos) << r.out;
    }
  }
  // Below DeepSpeed's ranges: refused by the parser, naming the key.
  CliRun r = Strata(Train(Config("neg.json", R"(, "max_in_cpu": -1)", ""), ""));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_HAS(r.out, "zero_optimization.offload_param.max_in_cpu: expected an integer >= 0");
}

// --host-memory caps the run: the plan's arena and what the budget holds beside it (the process's
// reserve, the host-emulated device's default budget, as estimate computes them) exactly is
// accepted and trains the same losses, less is refused naming the flag, the need, its parts and
// the budget; estimate marks each mode and refuses the config the same way.
TEST_F(OffloadBufferKeysTest, HostMemoryCapsThePinnedArena) {
  const std::string cfg = Config("base.json", R"(, "buffer_count": 2)", "");
  const nlohmann::json base = Estimate(cfg);
  ASSERT_TRUE(base.contains("config"));
  const nlohmann::json& beside = base["config"]["host_cache"]["beside"];
  const uint64_t arena =
      Arena(base) + beside["process"].get<uint64_t>() + beside["emulated_device"].get<uint64_t>();
  const std::vector<nlohmann::json> free_log = TrainLog(cfg);
  const std::vector<nlohmann::json> capped =
      TrainLog(cfg, "--host-memory " + std::to_string(arena));
  ASSERT_EQ(free_log.size(), 3u);
  ASSERT_EQ(capped.size(), 3u);
  for (size_t i = 0; i < capped.size(); ++i) {
    EXPECT_EQ(capped[i]["loss"].get<double>(), free_log[i]["loss"].get<double>()) << i;
  }
  const std::string over = std::to_string(arena - 4096);
  for (const std::string& command :
       {Train(cfg, "--host-memory " + over),
        "estimate --model tiny --config " + cfg + " --host-memory " + over}) {
    SCOPED_TRACE(command);
    CliRun r = Strata(command);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_HAS(r.out, "--host-memory ");
    EXPECT_HAS(r.out, ": the run needs ");
    EXPECT_HAS(r.out, "of host memory: the pinned host arena ");
    EXPECT_HAS(r.out, "params.pinned_buffers");
    EXPECT_HAS(r.out, "raise --host-memory to at least ");
  }
  // Without --config, estimate marks the modes: no offload in fp32 needs no pinned memory at all
  // (in bf16 strata runs the optimizer on the CPU), so a budget of what is beside the arena and
  // 4 KiB holds it and not the offloaded modes.
  const std::string modes = "estimate --model tiny --dtype fp32 --json --device-memory 64M";
  CliRun r = Strata(modes + " --host-memory 0");
  ASSERT_EQ(r.rc, 0) << r.out;
  const nlohmann::json mode0 =
      nlohmann::json::parse(r.out.substr(r.out.find('{')))["modes"][0]["host_cache"]["beside"];
  const uint64_t no_arena =
      mode0["process"].get<uint64_t>() + mode0["emulated_device"].get<uint64_t>();
  EXPECT_EQ(no_arena, (512u + 64u) << 20);
  r = Strata(modes + " --host-memory " + std::to_string(no_arena + 4096));
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  int within = 0, over_budget = 0;
  for (const auto& mode : j["modes"]) {
    (mode["within_host_memory"].get<bool>() ? within : over_budget)++;
    if (mode["name"] == "no offload") {
      EXPECT_TRUE(mode["within_host_memory"].get<bool>());
    }
  }
  EXPECT_GT(within, 0);
  EXPECT_GT(over_budget, 0);
}

}  // namespace
