// The host-RAM tier through the binary (memory_plan.h SplitHostCache): the tiny preset with
// parameters and optimizer on NVMe, trained at four host budgets that split its blocks between
// RAM and NVMe (all on NVMe: --host-memory 0; the gradient accumulators in RAM; those, the
// parameters and about half the optimizer state; everything), each budget taken from `strata
// estimate`'s own plan: the process's reserve, the host-emulated device's memory and the arena,
// plus the blocks.
// Every split trains the no-offload run's losses bitwise, allocates the arena estimate predicts,
// and from its second step writes and reads exactly the NVMe bytes the plan predicts for its split
// (the first step's optimizer writes finish in the second: the deferred step; the plan counts the
// blocks still in memory when used again, step_traffic.h, which the first step has not had a
// step before it to leave; with half the state in RAM it reads at most the plan's). A checkpoint
// saved under one split resumes under another exactly, a flipped bit in a block the tier leaves on
// NVMe is still caught by its checksum, and a budget above the machine's memory is refused naming
// both.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/testing/cli_run.h"
#include "tests/testing/temp_dir.h"

namespace {

using strata::testing::CliRun;
using strata::testing::JsonLines;
using strata::testing::Strata;

#define EXPECT_HAS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "missing: " << (part) << "\nin:\n" << (text)

class HostCacheCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    dir_ = tmp_.path();
    std::filesystem::create_directories(dir_ + "/nvme");
    std::ofstream data(dir_ + "/data.txt");
    for (int i = 0; i < 400; ++i) {
      data << "The quick brown fox " << i << " jumps over the lazy dog.\n";
    }
    // Two micro-batches per step: the gradient accumulators are read back once per step too.
    const std::string common = R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
        "sub_group_size": 20000)";
    std::ofstream(dir_ + "/none.json") << common << "}}";
    std::ofstream(dir_ + "/nvme.json")
        << common << R"(, "offload_param": {"device": "nvme", "nvme_path": ")" << dir_
        << R"(/nvme", "buffer_count": 2},
        "offload_optimizer": {"device": "nvme", "nvme_path": ")"
        << dir_ << R"(/nvme"}}})";
  }

  std::string Train(const std::string& config, const std::string& flags, int steps) const {
    return "train --model tiny --steps " + std::to_string(steps) + " --threads 1 --quiet --data " +
           dir_ + "/data.txt --device-memory 64M --config " + dir_ + "/" + config + " " + flags;
  }
  std::vector<nlohmann::json> TrainLog(const std::string& config, const std::string& flags,
                                       int steps = 3) {
    const std::string log = dir_ + "/" + std::to_string(logs_++) + ".jsonl";
    CliRun r = Strata(Train(config, "--log-json " + log + " " + flags, steps));
    EXPECT_EQ(r.rc, 0) << r.out;
    return JsonLines(log);
  }
  nlohmann::json Estimate(const std::string& flags) const {
    CliRun r = Strata("estimate --model tiny --json --device-memory 64M --config " + dir_ +
                      "/nvme.json " + flags);
    EXPECT_EQ(r.rc, 0) << r.out;
    if (r.rc != 0) return nlohmann::json::object();
    return nlohmann::json::parse(r.out.substr(r.out.find('{')));
  }
  // What a host budget holds beside the pinned memory, by an estimate with a budget (here,
  // without a GPU: the process's 512 MiB and the emulated device's 64 MiB).
  uint64_t Beside() const {
    const nlohmann::json e = Estimate("--host-memory 4G");
    if (!e.contains("config")) return 0;
    const nlohmann::json& beside = e["config"]["host_cache"]["beside"];
    EXPECT_EQ(beside["process"].get<uint64_t>(), 512u << 20);
    EXPECT_EQ(beside["emulated_device"].get<uint64_t>(), 64u << 20);
    return beside["process"].get<uint64_t>() + beside["emulated_device"].get<uint64_t>();
  }
  // The NVMe bytes of plan item `name` in an estimate's configured plan.
  static uint64_t NvmeOf(const nlohmann::json& estimate, const std::string& name) {
    for (const auto& item : estimate["config"]["plan"]["items"]) {
      if (item["name"] == name) return item["nvme"].get<uint64_t>();
    }
    ADD_FAILURE() << "no plan item " << name;
    return 0;
  }

  strata::testing::TempDir tmp_{"strata-host-cache-test"};
  std::string dir_;
  int logs_ = 0;
};

TEST_F(HostCacheCliTest, EverySplitTrainsExactlyAndMovesThePredictedBytes) {
  const nlohmann::json base = Estimate("--host-memory 0");
  ASSERT_TRUE(base.contains("config"));
  const uint64_t arena = base["config"]["plan"]["pinned_arena_bytes"].get<uint64_t>() + Beside();
  const uint64_t grads = NvmeOf(base, "optimizer.grads_fp32");
  const uint64_t state = NvmeOf(base, "optimizer.state");
  const uint64_t params = NvmeOf(base, "params.units");
  ASSERT_GT(grads, 0u);
  ASSERT_GT(state, 0u);
  ASSERT_GT(params, 0u);
  EXPECT_EQ(base["config"]["host_cache"]["bytes"].get<uint64_t>(), 0u);

  const std::vector<nlohmann::json> reference = TrainLog("none.json", "", 4);
  ASSERT_EQ(reference.size(), 4u);
  struct Split {
    std::string name;
    uint64_t budget;  // 0: no tier
    uint64_t cached_grads, cached_params;
    bool some_state, all_state;
  } splits[] = {
      {"nvme", 0, 0, 0, false, false},
      {"grads", arena + grads, grads, 0, false, false},
      {"half_state", arena + grads + params + state / 2, grads, params, true, false},
      {"all", arena + grads + state + params, grads, params, true, true},
  };
  for (const Split& s : splits) {
    SCOPED_TRACE(s.name);
    const std::string flag = "--host-memory " + std::to_string(s.budget);
    const nlohmann::json e = Estimate(flag);
    ASSERT_TRUE(e.contains("config"));
    const nlohmann::json& cache = e["config"]["host_cache"];
    EXPECT_EQ(cache["grads"].get<uint64_t>(), s.cached_grads);
    EXPECT_EQ(cache["params"].get<uint64_t>(), s.cached_params);
    EXPECT_EQ(cache["state"].get<uint64_t>() > 0, s.some_state);
    EXPECT_EQ(cache["state"].get<uint64_t>() == state, s.all_state);
    const uint64_t planned_arena = e["config"]["plan"]["pinned_arena_bytes"].get<uint64_t>();
    if (s.budget != 0) {
      EXPECT_LE(planned_arena, s.budget);
    }
    const double written = e["nvme_per_step"]["written"].get<double>();
    const double read = e["nvme_per_step"]["read"].get<double>();

    const std::vector<nlohmann::json> log = TrainLog("nvme.json", flag);
    ASSERT_EQ(log.size(), 3u);
    for (size_t i = 0; i < log.size(); ++i) {
      SCOPED_TRACE("step " + std::to_string(i + 1));
      // Few ulps: the reference runs without offload, whose torch::optim sqrt is MKL's (README
      // "Exactness").
      EXPECT_NEAR(log[i]["loss"].get<double>(), reference[i]["loss"].get<double>(),
                  1e-5 * std::abs(reference[i]["loss"].get<double>()));
      EXPECT_EQ(log[i]["pinned_capacity_bytes"].get<uint64_t>(), planned_arena);
      EXPECT_EQ(log[i]["host_cache_bytes"].get<uint64_t>(), cache["bytes"].get<uint64_t>());
      EXPECT_EQ(log[i]["host_budget_bytes"].get<uint64_t>(), s.budget);
      EXPECT_EQ(log[i]["plan_nvme_written_bytes"].get<double>(), written);
      EXPECT_EQ(log[i]["plan_nvme_read_bytes"].get<double>(), read);
      if (i > 0) {
        EXPECT_EQ(log[i]["nvme_written_bytes"].get<double>(), written);
        // Half the state in RAM leaves as few state blocks on NVMe as the state pool has slots:
        // some stay pinned from one step to the next, which the plan does not count (it reads
        // less).
        if (s.some_state && !s.all_state) {
          EXPECT_LE(log[i]["nvme_read_bytes"].get<double>(), read);
        } else {
          EXPECT_EQ(log[i]["nvme_read_bytes"].get<double>(), read);
        }
      }
    }
    if (s.all_state) {  // nothing left on NVMe: no traffic at all
      EXPECT_EQ(written, 0);
      EXPECT_EQ(read, 0);
    } else {
      EXPECT_GT(written, 0);
    }
  }

  // A checkpoint saved with everything in RAM resumes with everything on NVMe (another machine,
  // another budget) and continues the unbroken run exactly; the budget here comes from the config
  // key instead of the flag.
  {
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir_ + "/nvme.json"));
    cfg["strata"] = {{"host_memory", std::to_string(splits[3].budget)}};
    std::ofstream(dir_ + "/all.json") << cfg.dump();
  }
  const std::vector<nlohmann::json> first = TrainLog("all.json", "--save " + dir_ + "/ck", 2);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_GT(first[0]["host_cache_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(first[1]["nvme_written_bytes"].get<double>(), 0);
  const std::vector<nlohmann::json> resumed =
      TrainLog("nvme.json", "--host-memory 0 --resume " + dir_ + "/ck", 4);
  ASSERT_EQ(resumed.size(), 2u);
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(resumed[i]["step"], reference[i + 2]["step"]);
    EXPECT_NEAR(resumed[i]["loss"].get<double>(), reference[i + 2]["loss"].get<double>(),
                1e-5 * std::abs(reference[i + 2]["loss"].get<double>()));
    EXPECT_EQ(resumed[i]["host_cache_bytes"].get<uint64_t>(), 0u);
    EXPECT_GT(resumed[i]["nvme_written_bytes"].get<double>(), 0);
  }
}

// Half the optimizer state in RAM, a bit flipped in a write to optimizer.swp (the state blocks
// the tier leaves on NVMe; the gradients are all in RAM): the read of that block fails the run
// naming the file, as without the tier. Write 7 is one of step 2's (the tiny preset leaves 3
// state blocks on NVMe at this budget: 3 written at set-up, 3 in step 1), read back in step 3.
TEST_F(HostCacheCliTest, AFlippedBitInABlockLeftOnNvmeIsCaught) {
  const nlohmann::json base = Estimate("--host-memory 0");
  ASSERT_TRUE(base.contains("config"));
  const uint64_t budget = base["config"]["plan"]["pinned_arena_bytes"].get<uint64_t>() + Beside() +
                          NvmeOf(base, "optimizer.grads_fp32") + NvmeOf(base, "params.units") +
                          NvmeOf(base, "optimizer.state") / 2;
  CliRun r = strata::testing::Shell(
      "STRATA_IO_FAULTS=flip:write@optimizer:7 " + std::string(STRATA_BINARY) + " " +
      Train("nvme.json", "--host-memory " + std::to_string(budget), 3));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_HAS(r.out, "checksum mismatch: ");
  EXPECT_HAS(r.out, "/optimizer.swp offset ");
  EXPECT_HAS(r.out, "(block state/");
  EXPECT_EQ(r.out.find("done after"), std::string::npos) << r.out;
  // A budget above the machine's memory: refused before anything is built, naming both.
  r = Strata(Train("nvme.json", "--host-memory 1000T", 1));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_HAS(r.out, "--host-memory 1000.00 TiB is more than this machine's ");
  EXPECT_HAS(r.out, "of memory");
  // A config key that is neither "auto" nor a size: refused naming the key.
  {
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir_ + "/nvme.json"));
    cfg["strata"] = {{"host_memory", "lots"}};
    std::ofstream(dir_ + "/bad.json") << cfg.dump();
  }
  r = Strata(Train("bad.json", "", 1));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_HAS(r.out, "strata.host_memory");
  // The default is auto: estimate and train size the tier from this machine's memory (whatever
  // it is here); with room for the whole tiny model, nothing moves to or from NVMe. (The suite
  // sets STRATA_HOST_MEMORY=0 for the tests of the NVMe path.)
  ASSERT_EQ(unsetenv("STRATA_HOST_MEMORY"), 0);
  const nlohmann::json automatic = Estimate("");
  ASSERT_TRUE(automatic.contains("config"));
  const nlohmann::json& cache = automatic["config"]["host_cache"];
  const uint64_t auto_budget = cache["budget"].get<uint64_t>();
  const uint64_t beside = cache["beside"]["process"].get<uint64_t>() +
                          cache["beside"]["emulated_device"].get<uint64_t>();
  const uint64_t auto_arena = automatic["config"]["plan"]["pinned_arena_bytes"].get<uint64_t>();
  const uint64_t base_arena = base["config"]["plan"]["pinned_arena_bytes"].get<uint64_t>();
  EXPECT_LE(auto_arena + beside, std::max(auto_budget, base_arena + beside));
  if (auto_budget > beside + 2 * base_arena + 64 * 1024 * 1024) {  // room for the whole model
    EXPECT_EQ(automatic["nvme_per_step"]["written"].get<double>(), 0);
    const std::vector<nlohmann::json> log = TrainLog("nvme.json", "", 2);
    ASSERT_EQ(log.size(), 2u);
    EXPECT_EQ(log[1]["host_cache_bytes"].get<uint64_t>(), cache["bytes"].get<uint64_t>());
    // Memory available now, not when estimate ran: the same rule, about the same budget.
    EXPECT_NEAR(log[1]["host_budget_bytes"].get<double>(), static_cast<double>(auto_budget),
                0.1 * static_cast<double>(auto_budget));
    EXPECT_EQ(log[1]["nvme_written_bytes"].get<double>(), 0);
    EXPECT_EQ(log[1]["nvme_read_bytes"].get<double>(), 0);
  }
}

// The budget bounds the process's memory, not only its pinned memory: the 125M preset (2 GB of
// fp32 parameters, gradients and optimizer state, all offloaded to NVMe) at a budget that leaves
// a tier of a few hundred MiB beside the arena, the emulated device and the process. Peak RSS
// stays within 5 % of the budget (a tier sized from the budget less the arena alone would take
// ~1.1 GiB more and end ~2 GiB), and a budget below the run's need is refused naming the parts.
TEST_F(HostCacheCliTest, PeakRssStaysWithinTheBudget) {
  std::ofstream(dir_ + "/125m.json") << R"({"train_micro_batch_size_per_gpu": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "zero_optimization": {"stage": 3, "sub_group_size": 1e7,
      "offload_param": {"device": "nvme", "nvme_path": ")"
                                     << dir_ << R"(/nvme", "buffer_count": 2},
      "offload_optimizer": {"device": "nvme", "nvme_path": ")"
                                     << dir_ << R"(/nvme"}}})";
  const std::string run = "train --model 125M --seq-len 32 --steps 2 --threads 2 --quiet --data " +
                          dir_ + "/data.txt --device-memory 256M --config " + dir_ + "/125m.json";
  constexpr uint64_t kBudget = 1536ull << 20;
  const std::string log = dir_ + "/rss.jsonl";
  CliRun r = Strata(run + " --host-memory 1536M --log-json " + log);
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::vector<nlohmann::json> steps = JsonLines(log);
  ASSERT_EQ(steps.size(), 2u);
  const nlohmann::json& last = steps.back();
  EXPECT_EQ(last["host_budget_bytes"].get<uint64_t>(), kBudget);
  EXPECT_EQ(last["host_beside_bytes"].get<uint64_t>(), (512ull + 256) << 20);
  EXPECT_GT(last["host_cache_bytes"].get<uint64_t>(), 128ull << 20);  // the tier is used
  EXPECT_GT(last["nvme_written_bytes"].get<double>(), 0);             // and is not everything
  EXPECT_LE(last["peak_rss_bytes"].get<double>(), 1.05 * static_cast<double>(kBudget));
  r = Strata(run + " --host-memory 1G");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_HAS(r.out, "--host-memory 1.00 GiB: the run needs ");
  EXPECT_HAS(r.out, "the host-emulated device's memory 256.00 MiB (--device-memory sets it)");
  EXPECT_HAS(r.out, "the process's own 512.00 MiB");
}

}  // namespace
