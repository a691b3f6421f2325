// Runs the built `strata estimate --json` and `strata report --json` and checks what they print
// against the library they are built on (runtime/plan/memory_plan.h), so a drift between the
// command and the engine's plan fails here. GPT presets, Llama-family presets and Hugging Face
// model directories (a config.json written here) are each estimated.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "base/bytes.h"
#include "runtime/plan/llama_shape.h"
#include "runtime/plan/memory_plan.h"
#include "runtime/plan/model_presets.h"
#include "runtime/plan/model_spec.h"
#include "runtime/plan/step_traffic.h"
#include "tests/testing/cli_run.h"

namespace strata::runtime {
namespace {

// stage3_param_persistence_threshold's default (DeepSpeed's, and the config parser's): a layer's
// tensors this small stay resident, in the engine and in the estimate.
constexpr uint64_t kDefaultPersistence = 100000;

using nlohmann::json;

struct CommandResult {
  int exit_code = -1;
  std::string out;
};

// Runs the strata binary with `args` (stderr discarded) and captures stdout.
CommandResult RunStrata(const std::string& args) {
  // `args` may start with `env VAR=value BINARY` to run the binary under a changed environment.
  const std::string command =
      (args.rfind("env ", 0) == 0 ? args : std::string(STRATA_BINARY) + " " + args) +
      " 2>/dev/null";
  CommandResult run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) run.out.append(buf, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

json ParseOrFail(const CommandResult& run) {
  json j = json::parse(run.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON: " << run.out;
  return j;
}

void ExpectTiers(const json& j, const TierBytes& t, const std::string& what) {
  EXPECT_EQ(j.at("device").get<uint64_t>(), t.device) << what;
  EXPECT_EQ(j.at("pinned").get<uint64_t>(), t.pinned) << what;
  EXPECT_EQ(j.at("host").get<uint64_t>(), t.host) << what;
  EXPECT_EQ(j.at("nvme").get<uint64_t>(), t.nvme) << what;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/strata_estimate_test_XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(EstimateCliTest, ModesMatchThePlanner) {
  const CommandResult run = RunStrata("estimate --model tiny --micro-batch 2 --dtype fp32 --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const json j = ParseOrFail(run);
  Result<GptShape> tiny = FindGptPreset("tiny");
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(j.at("params").get<uint64_t>(), TotalParams(*tiny));
  EXPECT_EQ(j.at("units").get<uint64_t>(), 2u);
  EXPECT_EQ(j.at("settings").at("compute_bytes").get<int>(), 4);
  EXPECT_EQ(j.at("settings").at("dtype").get<std::string>(), "fp32");

  const json& modes = j.at("modes");
  ASSERT_EQ(modes.size(), 5u);
  const Home kParams[] = {Home::kDevice, Home::kDevice, Home::kDevice, Home::kCpu, Home::kNvme};
  const Home kOptimizer[] = {Home::kDevice, Home::kCpu, Home::kNvme, Home::kCpu, Home::kNvme};
  for (size_t i = 0; i < modes.size(); ++i) {
    PlanInput in = GptPlanInput(*tiny, /*micro_batch=*/2, /*compute_bytes=*/4, 1'000'000'000,
                                kDefaultPersistence);
    in.params = kParams[i];
    in.optimizer = kOptimizer[i];
    const MemoryPlan plan = PlanMemory(in);
    const std::string name = modes[i].at("name").get<std::string>();
    ExpectTiers(modes[i].at("total"), plan.total, name);
    ExpectTiers(modes[i].at("padding"), plan.padding, name);
    EXPECT_EQ(modes[i].at("pinned_arena_bytes").get<uint64_t>(), plan.pinned_arena_bytes) << name;
    ASSERT_EQ(modes[i].at("items").size(), plan.items.size()) << name;
    for (size_t k = 0; k < plan.items.size(); ++k) {
      EXPECT_EQ(modes[i]["items"][k].at("name").get<std::string>(), plan.items[k].first);
      ExpectTiers(modes[i]["items"][k], plan.items[k].second, name + " " + plan.items[k].first);
    }
    EXPECT_GT(modes[i].at("deepspeed").at("gpu").get<uint64_t>(), 0u) << name;
  }
  // DeepSpeed leaves pinned buffers out; strata's optimizer-on-NVMe mode needs some.
  EXPECT_GT(modes[2].at("total").at("pinned").get<uint64_t>(), 0u);
  // fp32: parameters on NVMe beside the optimizer are its masters, no second copy: the same NVMe
  // bytes as the optimizer alone there, up to the extents' padding (a page per unit or sub-group).
  const uint64_t nvme_both = modes[4].at("total").at("nvme").get<uint64_t>();
  const uint64_t nvme_optimizer = modes[2].at("total").at("nvme").get<uint64_t>();
  EXPECT_GT(nvme_optimizer, 0u);
  EXPECT_LE(nvme_both, nvme_optimizer + 64 * 4096);
  EXPECT_GE(nvme_both + 64 * 4096, nvme_optimizer);
}

TEST(EstimateCliTest, ParamsAndLargestLayer) {
  const CommandResult run = RunStrata("estimate --params 1.3e9 --largest-layer 50M --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const json j = ParseOrFail(run);
  EXPECT_EQ(j.at("units").get<uint64_t>(), 26u);
  EXPECT_EQ(j.at("unit_params").get<uint64_t>(), 50'000'000u);
  EXPECT_EQ(j.at("resident_params").get<uint64_t>(), 0u);
  EXPECT_TRUE(j.at("model").is_null());
  const DeepSpeedEstimate ds = DeepSpeedZero3Estimate(1'300'000'000, 50'000'000, true, true);
  EXPECT_EQ(j.at("modes")[4].at("deepspeed").at("cpu").get<uint64_t>(), ds.cpu);
}

TEST(EstimateCliTest, ConfigSettingsReachThePlanAndTheFitCheck) {
  TempDir dir;
  const std::string config = dir.path() + "/ds.json";
  std::ofstream(config) << R"({
    "train_micro_batch_size_per_gpu": 3,
    "bf16": {"enabled": true},
    "optimizer": {"type": "Lion", "params": {"lr": 1e-4}},
    "zero_optimization": {
      "stage": 3,
      "sub_group_size": "3e4",
      "offload_param": {"device": "nvme", "nvme_path": ")" +
                               dir.path() + R"(", "buffer_count": 3},
      "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                               dir.path() + R"(",
                            "pipeline_read": false, "pipeline_write": false}
    }
  })";
  const CommandResult run = RunStrata("estimate --model tiny --config " + config + " --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const json j = ParseOrFail(run);
  Result<GptShape> tiny = FindGptPreset("tiny");
  ASSERT_TRUE(tiny.ok());
  PlanInput in = GptPlanInput(*tiny, 3, 2, /*sub_group_size=*/30000, kDefaultPersistence);
  in.params = Home::kNvme;
  in.optimizer = Home::kNvme;
  in.state_bytes = 8;
  in.param_buffer_count = 3;
  in.pipeline = false;
  in.io_align = j.at("settings").at("io_align").get<uint64_t>();
  EXPECT_GE(in.io_align, 4096u);
  const MemoryPlan plan = PlanMemory(in);

  EXPECT_EQ(j.at("settings").at("dtype").get<std::string>(), "bf16");
  EXPECT_EQ(j.at("settings").at("state_bytes").get<int>(), 8);
  EXPECT_EQ(j.at("settings").at("micro_batch").get<int>(), 3);
  EXPECT_FALSE(j.at("settings").at("pipeline").get<bool>());
  const json& c = j.at("config");
  EXPECT_EQ(c.at("offload_param").get<std::string>(), "nvme");
  EXPECT_EQ(c.at("offload_optimizer").get<std::string>(), "nvme");
  EXPECT_FALSE(c.at("nvme_path_assumed").get<bool>());
  ExpectTiers(c.at("plan").at("total"), plan.total, "config plan");
  EXPECT_EQ(c.at("plan").at("sub_groups").get<uint64_t>(), plan.sub_groups);
  const json& fit = c.at("fit");
  // A tiny model fits any machine these tests run on.
  EXPECT_TRUE(fit.at("fits").get<bool>()) << fit.dump();
  ASSERT_EQ(fit.at("disks").size(), 1u);  // params and optimizer share the filesystem
  EXPECT_EQ(fit["disks"][0].at("need").get<uint64_t>(), plan.total.nvme);
  EXPECT_GT(fit["disks"][0].at("free").get<uint64_t>(), 0u);
}

// bf16.bf16_optimizer_states: Adam's two moments in bf16, 4 + 2 + 2 B of state per element; fp32
// runs plan one copy of the offloaded units' parameters (their masters).
TEST(EstimateCliTest, Bf16MomentsAndFp32MastersShrinkTheOptimizerState) {
  TempDir dir;
  const std::string config = dir.path() + "/ds.json";
  auto write = [&](const std::string& precision) {
    std::ofstream(config) << R"({
      "train_micro_batch_size_per_gpu": 1, )" +
                                 precision + R"(
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
      "zero_optimization": {"stage": 3,
        "offload_param": {"device": "nvme", "nvme_path": ")" +
                                 dir.path() + R"("},
        "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                                 dir.path() + R"("}}
    })";
  };
  auto state_nvme = [&](const json& j) {
    for (const json& item : j.at("config").at("plan").at("items")) {
      if (item.at("name") == "optimizer.state") return item.at("nvme").get<uint64_t>();
    }
    ADD_FAILURE() << "no optimizer.state item";
    return uint64_t{0};
  };
  write(R"("bf16": {"enabled": true, "bf16_optimizer_states": true},)");
  CommandResult run = RunStrata("estimate --model 125M --config " + config + " --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const json bf16_moments = ParseOrFail(run);
  EXPECT_EQ(bf16_moments.at("settings").at("state_bytes").get<int>(), 8);
  write(R"("bf16": {"enabled": true},)");
  run = RunStrata("estimate --model 125M --config " + config + " --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const json bf16 = ParseOrFail(run);
  EXPECT_EQ(bf16.at("settings").at("state_bytes").get<int>(), 12);
  write("");
  run = RunStrata("estimate --model 125M --config " + config + " --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const json fp32 = ParseOrFail(run);
  // 125M: the units are most of the parameters; their state drops from 12 to 8 B per element
  // in both cases (bf16 moments; fp32 masters in the parameter blocks).
  EXPECT_LT(state_nvme(bf16_moments), state_nvme(bf16) * 3 / 4 + (1u << 20));
  EXPECT_GT(state_nvme(bf16_moments), state_nvme(bf16) / 2);
  EXPECT_LT(state_nvme(fp32), state_nvme(bf16) * 8 / 10);
}

TEST(EstimateCliTest, OversizedConfigDoesNotFitAndNamesAKey) {
  TempDir dir;
  const std::string config = dir.path() + "/ds.json";
  std::ofstream(config)
      << R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})";
  const CommandResult run = RunStrata("estimate --model 13B --config " + config + " --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const json j = ParseOrFail(run);
  const json& c = j.at("config");
  // No offload: about 16 B per parameter of device memory (fp32 here), far over any one device.
  EXPECT_FALSE(c.at("fit").at("fits").get<bool>());
  EXPECT_FALSE(c.at("fit").at("problems").empty());
  ASSERT_TRUE(c.contains("suggestion"));
  if (!c.at("suggestion").is_null()) {
    EXPECT_NE(c.at("suggestion").get<std::string>().find("offload_"), std::string::npos);
  }
}

// --nproc N: the plan of one rank, which keeps 1/N of the partitioned state (its slices of the
// offloaded units, its sub-groups), against the library's RankLayout.
TEST(EstimateCliTest, RanksKeepTheirShareOfThePartitionedState) {
  std::vector<json> plans;
  for (int n : {1, 2, 4}) {
    const CommandResult run =
        RunStrata("estimate --model 125M --dtype fp32 --nproc " + std::to_string(n) + " --json");
    ASSERT_EQ(run.exit_code, 0) << run.out;
    const json j = json::parse(run.out);
    EXPECT_EQ(j["settings"]["ranks"], n);
    for (const json& mode : j["modes"]) {
      if (mode["name"] == "params+optimizer nvme") {
        plans.push_back(mode);
      }
    }
  }
  ASSERT_EQ(plans.size(), 3u);
  const double one = plans[0]["total"]["nvme"].get<double>();
  ASSERT_GT(one, 0);
  // Padding aside, NVMe holds 1/N per rank.
  EXPECT_NEAR(plans[1]["total"]["nvme"].get<double>() / one, 0.5, 0.01);
  EXPECT_NEAR(plans[2]["total"]["nvme"].get<double>() / one, 0.25, 0.01);
  EXPECT_LT(plans[2]["pinned_arena_bytes"].get<double>(),
            plans[0]["pinned_arena_bytes"].get<double>());
  EXPECT_EQ(RunStrata("estimate --model 125M --nproc 0 --json").exit_code, 2);
}

TEST(EstimateCliTest, BadInputIsExitCode2) {
  EXPECT_EQ(RunStrata("estimate --model nosuch --json").exit_code, 2);
  EXPECT_EQ(RunStrata("estimate --json").exit_code, 2);
  EXPECT_EQ(RunStrata("estimate --model tiny --params 1e9 --largest-layer 1e6").exit_code, 2);
  EXPECT_EQ(RunStrata("estimate --params 1e6 --largest-layer 1e9").exit_code, 2);
  TempDir dir;
  const std::string config = dir.path() + "/bad.json";
  std::ofstream(config) << R"({"zero_optimization": {"offload_param": {"device": "disk"}}})";
  EXPECT_EQ(RunStrata("estimate --model tiny --config " + config).exit_code, 2);
  std::ofstream(config) << "{ not json";
  EXPECT_EQ(RunStrata("estimate --model tiny --config " + config).exit_code, 2);
  // Validated by runtime/config/config.h: an unknown key is refused.
  std::ofstream(config) << R"({"train_micro_batch_size_per_gpu": 1, "zero_optimizaton": {}})";
  EXPECT_EQ(RunStrata("estimate --model tiny --config " + config).exit_code, 2);
}

TEST(EstimateCliTest, HumanOutputHasEveryMode) {
  const CommandResult run = RunStrata("estimate --model small");
  ASSERT_EQ(run.exit_code, 0);
  for (const char* mode : {"no offload", "optimizer cpu", "optimizer nvme", "params+optimizer cpu",
                           "params+optimizer nvme", "DeepSpeed"}) {
    EXPECT_NE(run.out.find(mode), std::string::npos) << mode << "\n" << run.out;
  }
}

// The config.json of meta-llama/Llama-3.2-1B as published (keys strata does not read included).
constexpr const char* kLlama32_1bConfig = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// Runs strata with stdout and stderr together (the error message is on stderr).
strata::testing::CliRun RunStrataAll(const std::string& args) {
  return strata::testing::Shell(std::string(STRATA_BINARY) + " " + args);
}

TEST(EstimateCliTest, GptModelSaysItsFamily) {
  const CommandResult run = RunStrata("estimate --model tiny --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const json j = ParseOrFail(run);
  EXPECT_EQ(j.at("model").at("family").get<std::string>(), "gpt");
  EXPECT_EQ(j.at("model").at("seq_len").get<int>(), 64);  // the preset's own
  // --seq-len builds the GPT as `strata train --seq-len` does: the position embedding follows.
  const CommandResult longer = RunStrata("estimate --model tiny --seq-len 128 --json");
  ASSERT_EQ(longer.exit_code, 0) << longer.out;
  const json k = ParseOrFail(longer);
  Result<GptShape> tiny = FindGptPreset("tiny");
  ASSERT_TRUE(tiny.ok());
  tiny->seq_len = 128;
  EXPECT_EQ(k.at("model").at("seq_len").get<int>(), 128);
  EXPECT_EQ(k.at("params").get<uint64_t>(), TotalParams(*tiny));
  EXPECT_EQ(k.at("activations").at("working").get<uint64_t>(),
            GptActivationBytes(*tiny, 1, 2).working);
}

TEST(EstimateCliTest, LlamaPresetMatchesThePlanner) {
  const CommandResult run = RunStrata("estimate --model llama-3.1-8b --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const json j = ParseOrFail(run);
  EXPECT_EQ(j.at("params").get<uint64_t>(), 8030261248u);
  EXPECT_EQ(j.at("units").get<uint64_t>(), 32u);
  Result<LlamaShape> shape = FindLlamaPreset("llama-3.1-8b");
  ASSERT_TRUE(shape.ok());
  // A layer's two RMSNorm weights (4096 elements each, under the persistence threshold) stay
  // resident, as the engine keeps them.
  EXPECT_EQ(j.at("unit_params").get<uint64_t>(), LlamaLayerParams(*shape) - 2 * 4096);
  EXPECT_EQ(j.at("resident_params").get<uint64_t>(), LlamaResidentParams(*shape) + 32 * 2 * 4096);
  EXPECT_EQ(j.at("largest_layer").get<uint64_t>(), 128256u * 4096);  // the embedding / lm_head
  const json& m = j.at("model");
  EXPECT_EQ(m.at("name").get<std::string>(), "llama-3.1-8b");
  EXPECT_EQ(m.at("family").get<std::string>(), "llama");
  EXPECT_EQ(m.at("architecture").get<std::string>(), "LlamaForCausalLM");
  EXPECT_EQ(m.at("num_hidden_layers").get<int>(), 32);
  EXPECT_EQ(m.at("hidden_size").get<int>(), 4096);
  EXPECT_EQ(m.at("intermediate_size").get<int>(), 14336);
  EXPECT_EQ(m.at("num_attention_heads").get<int>(), 32);
  EXPECT_EQ(m.at("num_key_value_heads").get<int>(), 8);
  EXPECT_EQ(m.at("head_dim").get<int>(), 128);
  EXPECT_EQ(m.at("vocab_size").get<int>(), 128256);
  EXPECT_FALSE(m.at("tie_word_embeddings").get<bool>());
  // The default for Llama-family models, train's (runtime/plan/model_spec.h).
  EXPECT_EQ(m.at("seq_len").get<int>(), kDefaultLlamaSeqLen);

  // bf16 by default, micro-batch 1, DeepSpeed's default sub_group_size.
  const PlanInput base =
      LlamaPlanInput(*shape, 1, kDefaultLlamaSeqLen, 2, 1'000'000'000, kDefaultPersistence);
  EXPECT_EQ(j.at("activations").at("checkpoint").get<uint64_t>(), base.activation_checkpoint_bytes);
  EXPECT_EQ(j.at("activations").at("working").get<uint64_t>(), base.activation_working_bytes);
  const json& modes = j.at("modes");
  ASSERT_EQ(modes.size(), 5u);
  // Offloaded parameters: the plan of params+optimizer nvme, as PlanMemory makes it.
  PlanInput in = base;
  in.params = in.optimizer = Home::kNvme;
  ExpectTiers(modes[4].at("total"), PlanMemory(in).total, "params+optimizer nvme");
  const DeepSpeedEstimate ds = DeepSpeedZero3Estimate(8030261248u, 128256u * 4096, true, true);
  EXPECT_EQ(modes[4].at("deepspeed").at("gpu").get<uint64_t>(), ds.gpu);

  // --seq-len sizes the activations only (rotary positions have no parameters).
  const CommandResult longer = RunStrata("estimate --model llama-3.1-8b --seq-len 4096 --json");
  ASSERT_EQ(longer.exit_code, 0) << longer.out;
  const json k = ParseOrFail(longer);
  EXPECT_EQ(k.at("params").get<uint64_t>(), 8030261248u);
  EXPECT_EQ(k.at("model").at("seq_len").get<int>(), 4096);
  EXPECT_EQ(k.at("activations").at("checkpoint").get<uint64_t>(),
            (4096 / kDefaultLlamaSeqLen) * base.activation_checkpoint_bytes);
}

// mixtral-mini (llama_shape.h): hidden 512, 8 heads of 64, 2 kv heads, 8 experts of 1792, top-2,
// 8 layers, vocab 4096. Under the default persistence threshold (1e5 elements) k_proj and v_proj
// (128 x 512), the router (8 x 512) and the norms stay resident; a unit is q_proj and o_proj
// (512 x 512 each) and the experts (3 x 1792 x 512 each): whole layers hold both, --page-experts
// makes each its own unit.
constexpr uint64_t kMiniAttention = 2 * 512 * 512;
constexpr uint64_t kMiniExpert = 3 * 1792 * 512;

json EstimateJson(const std::string& args) {
  const CommandResult run = RunStrata("estimate --model mixtral-mini --json " + args);
  EXPECT_EQ(run.exit_code, 0) << args << ": " << run.out;
  return ParseOrFail(run);
}

const json& ModeNamed(const json& j, const std::string& name) {
  for (const json& m : j.at("modes")) {
    if (m.at("name").get<std::string>() == name) return m;
  }
  ADD_FAILURE() << "no mode " << name;
  return j;
}

TEST(EstimateCliTest, PageExpertsPlansPerExpertUnitsWithADeviceWindowOfTheLargest) {
  const json whole = EstimateJson("--seq-len 1");
  const json paged = EstimateJson("--seq-len 1 --page-experts");
  EXPECT_FALSE(whole.at("page_experts").get<bool>());
  EXPECT_TRUE(paged.at("page_experts").get<bool>());
  EXPECT_EQ(whole.at("params").get<uint64_t>(), paged.at("params").get<uint64_t>());
  EXPECT_EQ(whole.at("units").get<uint64_t>(), 8u);
  EXPECT_EQ(whole.at("largest_unit_params").get<uint64_t>(), kMiniAttention + 8 * kMiniExpert);
  EXPECT_EQ(paged.at("units").get<uint64_t>(), 8u * (1 + 8));  // attention and 8 experts a layer
  EXPECT_EQ(paged.at("largest_unit_params").get<uint64_t>(), kMiniExpert);
  EXPECT_EQ(paged.at("resident_params").get<uint64_t>(),
            whole.at("resident_params").get<uint64_t>());
  // The device window holds two of the largest unit (bf16): an expert, not a layer.
  for (const std::string mode : {"params+optimizer cpu", "params+optimizer nvme"}) {
    const json& w = ModeNamed(whole, mode);
    const json& p = ModeNamed(paged, mode);
    EXPECT_EQ(p.at("largest_unit").get<uint64_t>(), kMiniExpert) << mode;
    uint64_t window = 0;
    for (const json& item : p.at("items")) {
      if (item.at("name") == "params.device_window") window = item.at("device").get<uint64_t>();
    }
    EXPECT_EQ(window, 2 * AlignUp(kMiniExpert * 2, 4096)) << mode;
    EXPECT_LT(p.at("total").at("device").get<uint64_t>(),
              w.at("total").at("device").get<uint64_t>())
        << mode;
  }
  // The plan is the library's for the paged shape (the engine partitions it so:
  // tests/runtime/models/moe_test.cc).
  LlamaShape shape = *FindLlamaPreset("mixtral-mini");
  shape.page_experts = true;
  PlanInput in = LlamaPlanInput(shape, 1, 1, 2, 1'000'000'000, kDefaultPersistence);
  in.params = in.optimizer = Home::kNvme;
  ExpectTiers(ModeNamed(paged, "params+optimizer nvme").at("total"), PlanMemory(in).total,
              "paged params+optimizer nvme");

  // Not a mixture of experts: refused, naming the flag and the model.
  const strata::testing::CliRun dense =
      strata::testing::Strata("estimate --model llama-tiny --page-experts");
  EXPECT_EQ(dense.rc, 2) << dense.out;
  EXPECT_NE(dense.out.find("--page-experts needs a mixture of experts"), std::string::npos)
      << dense.out;
  EXPECT_NE(dense.out.find("llama-tiny has no experts"), std::string::npos) << dense.out;
}

TEST(EstimateCliTest, NvmeBytesPerStepFollowTheActiveExperts) {
  // bf16 (estimate's default), Adam: per element, parameters 2 B read for forward and for
  // backward; gradient 4 B written; state 12 B and gradient 4 B read, state 12 B and the 16-bit
  // parameters 2 B written by the step. An expert no token reaches is stepped on a zero gradient:
  // its state and parameters move as any other's, but it is not read for the forward and backward
  // and has no gradient to write or read. Every block here is a multiple of 4 KiB (no padding).
  const double expert_read = kMiniExpert * (2 * 2 + 4);
  const double expert_written = kMiniExpert * 4;
  for (const int seq : {1, 4}) {
    const json whole = EstimateJson("--seq-len " + std::to_string(seq));
    const json paged = EstimateJson("--seq-len " + std::to_string(seq) + " --page-experts");
    for (const json* j : {&whole, &paged}) {
      const json& t = j->at("nvme_per_step");
      EXPECT_EQ(t.at("mode").get<std::string>(), "params+optimizer nvme");
      EXPECT_EQ(t.at("tokens_per_step").get<uint64_t>(), static_cast<uint64_t>(seq));
      // The planned layout's figure is the matching row of the comparison.
      const json& row =
          t.at("experts").at(j->at("page_experts").get<bool>() ? "page_experts" : "whole_layers");
      EXPECT_EQ(t.at("read"), row.at("read"));
      EXPECT_EQ(t.at("written"), row.at("written"));
      EXPECT_EQ(ModeNamed(*j, "params+optimizer nvme").at("nvme_per_step").at("read"),
                t.at("read"));
    }
    const json& e = paged.at("nvme_per_step").at("experts");
    EXPECT_EQ(whole.at("nvme_per_step").at("experts"), e);  // both figures, either way planned
    // Uniform routing: an expert misses one token with probability 1 - 2/8.
    const double p = 1 - std::pow(0.75, seq);
    EXPECT_DOUBLE_EQ(e.at("hit_probability_step").get<double>(), p);
    EXPECT_DOUBLE_EQ(e.at("active_per_layer").get<double>(), 8 * p);
    const double w_read = e.at("whole_layers").at("read").get<double>();
    const double p_read = e.at("page_experts").at("read").get<double>();
    const double w_written = e.at("whole_layers").at("written").get<double>();
    const double p_written = e.at("page_experts").at("written").get<double>();
    // Paged, the experts no token reaches (1 - p of the 64) are not read for the passes and have
    // no gradient; the optimizer steps them all.
    EXPECT_NEAR(w_read - p_read, (1 - p) * 64 * expert_read, 2) << "seq " << seq;
    EXPECT_NEAR(w_written - p_written, (1 - p) * 64 * expert_written, 2) << "seq " << seq;
    // The whole layers' figure is the library's (no drift between the command and the plan).
    LlamaShape shape = *FindLlamaPreset("mixtral-mini");
    PlanInput in = LlamaPlanInput(shape, 1, seq, 2, 1'000'000'000, kDefaultPersistence);
    in.params = in.optimizer = Home::kNvme;
    // (A mixture of experts: every unit's use counted, as routed experts are.)
    const StepTraffic t =
        NvmeTrafficPerStep(in, 1, std::vector<UnitUse>(in.layout.unit_numel.size()));
    EXPECT_EQ(e.at("whole_layers").at("read").get<uint64_t>(),
              static_cast<uint64_t>(std::llround(t.read())));

    // The text says the same figures.
    const CommandResult text =
        RunStrata("estimate --model mixtral-mini --seq-len " + std::to_string(seq));
    ASSERT_EQ(text.exit_code, 0) << text.out;
    EXPECT_NE(
        text.out.find("--page-experts would read " +
                      FormatBytes(e.at("page_experts").at("read").get<uint64_t>()) + " and write " +
                      FormatBytes(e.at("page_experts").at("written").get<uint64_t>())),
        std::string::npos)
        << text.out;
    EXPECT_NE(
        text.out.find("read " + FormatBytes(whole.at("nvme_per_step").at("read").get<uint64_t>()) +
                      ", written " +
                      FormatBytes(whole.at("nvme_per_step").at("written").get<uint64_t>())),
        std::string::npos)
        << text.out;
  }
  // Enough tokens that every expert is routed: the same bytes either way (no padding differs).
  const json many = EstimateJson("--seq-len 512 --page-experts").at("nvme_per_step");
  EXPECT_EQ(many.at("experts").at("hit_probability_step").get<double>(), 1.0);
  EXPECT_EQ(many.at("experts").at("page_experts").at("read"),
            many.at("experts").at("whole_layers").at("read"));
  EXPECT_EQ(many.at("experts").at("page_experts").at("written"),
            many.at("experts").at("whole_layers").at("written"));

  // Tokens per step: micro-batch x seq-len x accumulation (the optimizer updates an expert some
  // micro-batch reached); a micro-batch's gathers see micro-batch x seq-len.
  const json acc = EstimateJson("--seq-len 1 --micro-batch 2 --grad-accum 3 --page-experts");
  const json& t = acc.at("nvme_per_step");
  EXPECT_EQ(t.at("tokens_per_micro_batch").get<uint64_t>(), 2u);
  EXPECT_EQ(t.at("tokens_per_step").get<uint64_t>(), 6u);
  EXPECT_EQ(t.at("accumulation").get<int>(), 3);
  EXPECT_DOUBLE_EQ(t.at("experts").at("hit_probability_micro_batch").get<double>(),
                   1 - std::pow(0.75, 2));
  EXPECT_DOUBLE_EQ(t.at("experts").at("hit_probability_step").get<double>(), 1 - std::pow(0.75, 6));
  // Paged, an expert is read by each micro-batch it runs in: 3 x p(2 tokens) gathers, where whole
  // layers read every layer in each of the 3.
  const double p2 = 1 - std::pow(0.75, 2);
  EXPECT_NEAR(t.at("experts").at("whole_layers").at("params_read").get<double>() -
                  t.at("experts").at("page_experts").at("params_read").get<double>(),
              3 * (1 - p2) * 64 * 2 * 2 * kMiniExpert, 2);
  // What train refuses (ranks route differently; paged gathers are collectives), estimate too.
  const strata::testing::CliRun ranks =
      strata::testing::Strata("estimate --model mixtral-mini --page-experts --nproc 2");
  EXPECT_EQ(ranks.rc, 2) << ranks.out;
  EXPECT_NE(ranks.out.find("--page-experts runs on one rank only"), std::string::npos) << ranks.out;
  // A dense model has no comparison.
  EXPECT_FALSE(RunStrata("estimate --model llama-tiny --json").out.find("\"experts\"") !=
               std::string::npos);
}

TEST(EstimateCliTest, HuggingFaceDirectory) {
  TempDir dir;
  std::ofstream(dir.path() + "/config.json") << kLlama32_1bConfig;
  const CommandResult run = RunStrata("estimate --model " + dir.path() + "/ --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const json j = ParseOrFail(run);
  EXPECT_EQ(j.at("params").get<uint64_t>(), 1235814400u);
  EXPECT_EQ(j.at("units").get<uint64_t>(), 16u);
  // Tied: one vocab x hidden embedding and the final norm stay resident, and each layer's two
  // norms (under the persistence threshold).
  EXPECT_EQ(j.at("resident_params").get<uint64_t>(), 128256u * 2048 + 2048 + 16u * 2 * 2048);
  const json& m = j.at("model");
  // Named as train names it: the directory's last part.
  const std::string name = std::filesystem::path(dir.path()).filename().string();
  EXPECT_EQ(m.at("name").get<std::string>(), name);
  EXPECT_EQ(m.at("family").get<std::string>(), "llama");
  EXPECT_TRUE(m.at("tie_word_embeddings").get<bool>());
  EXPECT_EQ(m.at("head_dim").get<int>(), 64);
  // The same as the preset of that name.
  const CommandResult preset = RunStrata("estimate --model llama-3.2-1b --json");
  ASSERT_EQ(preset.exit_code, 0) << preset.out;
  EXPECT_EQ(ParseOrFail(preset).at("modes"), j.at("modes"));

  const CommandResult text = RunStrata("estimate --model " + dir.path());
  ASSERT_EQ(text.exit_code, 0);
  EXPECT_NE(text.out.find(name + " (LlamaForCausalLM: 16 layers"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("tied embeddings; seq " + std::to_string(kDefaultLlamaSeqLen)),
            std::string::npos)
      << text.out;
}

TEST(EstimateCliTest, BadDirectoryIsExitCode2NamingTheFile) {
  TempDir dir;
  const std::string config = dir.path() + "/config.json";
  // No config.json.
  strata::testing::CliRun run = RunStrataAll("estimate --model " + dir.path() + " --json");
  EXPECT_EQ(run.rc, 2) << run.out;
  EXPECT_NE(run.out.find(config), std::string::npos) << run.out;
  // Not JSON.
  std::ofstream(config) << "{ \"architectures\": [";
  run = RunStrataAll("estimate --model " + dir.path() + " --json");
  EXPECT_EQ(run.rc, 2) << run.out;
  EXPECT_NE(run.out.find(config), std::string::npos) << run.out;
  // An architecture strata does not build.
  std::ofstream(config) << R"({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
                               "hidden_size": 512, "num_hidden_layers": 6})";
  run = RunStrataAll("estimate --model " + dir.path() + " --json");
  EXPECT_EQ(run.rc, 2) << run.out;
  EXPECT_NE(run.out.find(config), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("GPTNeoXForCausalLM"), std::string::npos) << run.out;
  // A file, not a directory.
  run = RunStrataAll("estimate --model " + config);
  EXPECT_EQ(run.rc, 2) << run.out;
}

TEST(EstimateCliTest, UnknownModelListsBothFamilies) {
  const strata::testing::CliRun run = RunStrataAll("estimate --model nosuch-7b --json");
  EXPECT_EQ(run.rc, 2) << run.out;
  for (const GptShape& s : GptPresets()) {
    EXPECT_NE(run.out.find(s.name), std::string::npos) << s.name << "\n" << run.out;
  }
  for (const LlamaShape& s : LlamaPresets()) {
    EXPECT_NE(run.out.find(s.name), std::string::npos) << s.name << "\n" << run.out;
  }
  // --seq-len needs a model.
  EXPECT_EQ(RunStrata("estimate --params 1e9 --largest-layer 1e7 --seq-len 512").exit_code, 2);
  EXPECT_EQ(RunStrata("estimate --model llama-tiny --seq-len 0").exit_code, 2);
}

TEST(EstimateCliTest, QwenWithANvmeConfigReportsAPlan) {
  TempDir dir;
  const std::string config = dir.path() + "/ds.json";
  std::ofstream(config) << R"({
    "train_micro_batch_size_per_gpu": 2,
    "bf16": {"enabled": true},
    "zero_optimization": {
      "stage": 3,
      "offload_param": {"device": "nvme", "nvme_path": ")" +
                               dir.path() + R"("},
      "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                               dir.path() + R"("}
    }
  })";
  const CommandResult run =
      RunStrata("estimate --model qwen2.5-7b --seq-len 1024 --config " + config + " --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const json j = ParseOrFail(run);
  Result<LlamaShape> qwen = FindLlamaPreset("qwen2.5-7b");
  ASSERT_TRUE(qwen.ok());
  EXPECT_EQ(j.at("params").get<uint64_t>(), LlamaTotalParams(*qwen));
  EXPECT_EQ(j.at("units").get<uint64_t>(), 28u);
  EXPECT_EQ(j.at("model").at("architecture").get<std::string>(), "Qwen2ForCausalLM");
  EXPECT_EQ(j.at("settings").at("micro_batch").get<int>(), 2);
  PlanInput in = LlamaPlanInput(*qwen, 2, 1024, 2, 1'000'000'000, kDefaultPersistence);
  in.params = in.optimizer = Home::kNvme;
  in.io_align = j.at("settings").at("io_align").get<uint64_t>();
  const MemoryPlan plan = PlanMemory(in);
  const json& c = j.at("config");
  EXPECT_EQ(c.at("offload_param").get<std::string>(), "nvme");
  EXPECT_EQ(c.at("offload_optimizer").get<std::string>(), "nvme");
  ExpectTiers(c.at("plan").at("total"), plan.total, "config plan");
  // Parameters, optimizer state and gradients of ~7.6 B parameters on NVMe.
  EXPECT_GT(c.at("plan").at("total").at("nvme").get<uint64_t>(), 7'000'000'000u * 16);
  const json& fit = c.at("fit");
  EXPECT_TRUE(fit.at("fits").is_boolean());
  ASSERT_EQ(fit.at("disks").size(), 1u);
  EXPECT_EQ(fit["disks"][0].at("need").get<uint64_t>(), plan.total.nvme);
}

TEST(ReportCliTest, JsonHasEverySection) {
  TempDir dir;
  const CommandResult run = RunStrata("report --path " + dir.path() + " --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const json j = ParseOrFail(run);
  const std::string isa = j.at("cpu").at("isa").get<std::string>();
  EXPECT_TRUE(isa == "scalar" || isa == "avx2" || isa == "avx512") << isa;
  EXPECT_GE(j.at("cpu").at("affinity_count").get<size_t>(), 1u);
  EXPECT_GT(j.at("memory").at("total").get<uint64_t>(), 0u);
  EXPECT_EQ(j.at("io").at("path").get<std::string>(), dir.path());
  bool posix_ok = false;
  for (const json& b : j.at("io").at("backends")) {
    if (b.at("name") == "posix") posix_ok = b.at("available").get<bool>();
    if (!b.at("available").get<bool>()) {
      EXPECT_FALSE(b.at("error").get<std::string>().empty());
    }
  }
  EXPECT_TRUE(posix_ok) << j.at("io").dump();
  const json& cuda = j.at("cuda");
  EXPECT_TRUE(cuda.contains("gpu_target_built"));
  if (cuda.at("devices").empty()) {
    EXPECT_FALSE(cuda.at("reason").get<std::string>().empty());
  }
  EXPECT_TRUE(j.at("nccl").at("found").is_boolean());
  // Whether ranks can run on GPUs: the build's NCCL communicator.
  EXPECT_EQ(j.at("nccl").at("communicator").get<bool>(), static_cast<bool>(STRATA_HAVE_NCCL));
  EXPECT_TRUE(j.at("torch").at("built").is_boolean());
}

// `strata report` lists every environment variable strata reads (base/env.h), with the value this
// process sees: a set one shows its value, an unset one null and what unset means.
TEST(ReportCliTest, ListsEveryEnvironmentVariableWithItsValue) {
  TempDir dir;
  const CommandResult run =
      RunStrata("env STRATA_CPU_ISA=scalar STRATA_LOG_LEVEL= " + std::string(STRATA_BINARY) +
                " report --path " + dir.path() + " --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const json j = ParseOrFail(run);
  std::map<std::string, json> by_name;
  for (const json& v : j.at("environment")) by_name[v.at("name").get<std::string>()] = v;
  for (const char* name : {"STRATA_LOG_LEVEL", "STRATA_IO_BACKEND", "STRATA_CPU_ISA",
                           "STRATA_IO_FAULTS", "STRATA_SENTENCEPIECE_SHIM", "RANK"}) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_FALSE(by_name[name].at("meaning").get<std::string>().empty()) << name;
    EXPECT_FALSE(by_name[name].at("default").get<std::string>().empty()) << name;
  }
  EXPECT_EQ(by_name["STRATA_CPU_ISA"].at("value"), "scalar");
  EXPECT_EQ(j.at("cpu").at("isa"), "scalar");  // the variable took effect
  EXPECT_TRUE(by_name["STRATA_IO_FAULTS"].at("value").is_null());
  EXPECT_TRUE(by_name["STRATA_IO_FAULTS"].at("test_only").get<bool>());
}

}  // namespace
}  // namespace strata::runtime
