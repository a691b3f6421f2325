// `strata bench step` and `strata bench tiers` through the binary, with --json: what they report
// adds up and agrees with the layout's arithmetic.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/testing/cli_run.h"
#include "tests/testing/temp_dir.h"

namespace {

using strata::testing::CliRun;
using strata::testing::Shell;

class BenchCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    dir_ = tmp_.path();
  }

  // Runs `strata ARGS --json` and parses the last line of its output (the JSON document).
  nlohmann::json RunJson(const std::string& args) {
    const CliRun r = Shell(std::string(STRATA_BINARY) + " " + args + " --json 2>/dev/null");
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.signal, 0);
    nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << r.out;
    return j;
  }

  strata::testing::TempDir tmp_{"strata-bench-cli-test"};
  std::string dir_;
};

// The configurations take turns step by step; the full run's bytes per phase add up to its totals,
// it writes exactly what the layout must write (each optimizer element's state and gradient once,
// the units' fp32 blocks being their masters) and reads no more than the layout reads with nothing
// cached: no block is read twice (a prefetch never evicts another prefetch; before that rule this
// run read 1.02-1.08x).
TEST_F(BenchCliTest, StepReportsBytesPerPhaseAgainstTheLayout) {
  const nlohmann::json j = RunJson(
      "bench step --layers 12 --width 64 --heads 4 --seq 16 --batch 2 "
      "--steps 2 --device-units 1 --trace '' --path " +
      dir_);
  ASSERT_TRUE(j.contains("nvme_bytes_per_step")) << j.dump();
  const auto& p = j["nvme_bytes_per_step"];
  const uint64_t read = j["nvme_read_bytes_per_step"].get<uint64_t>();
  const uint64_t written = j["nvme_write_bytes_per_step"].get<uint64_t>();
  EXPECT_EQ(p["forward_backward_read"].get<uint64_t>() + p["optimizer_read"].get<uint64_t>(), read);
  EXPECT_EQ(p["forward_backward_written"].get<uint64_t>() + p["optimizer_written"].get<uint64_t>(),
            written);
  // 16 B per optimizer element (a unit's master is its fp32 parameter block: no second copy is
  // written) and reads of 4 B per unit parameter twice more (layers x (12 d^2 + 13 d)).
  const uint64_t elements = j["optimizer_elements"].get<uint64_t>();
  const uint64_t unit_bytes = 12 * (12 * 64 * 64 + 13 * 64) * 4;
  EXPECT_EQ(j["layout_bytes_per_step"]["written"].get<uint64_t>(), 16 * elements);
  EXPECT_EQ(j["layout_bytes_per_step"]["read"].get<uint64_t>(), 16 * elements + 2 * unit_bytes);
  // Alignment padding of the swap extents is the only excess allowed on writes.
  EXPECT_GE(j["written_vs_layout"].get<double>(), 1.0);
  EXPECT_LE(j["written_vs_layout"].get<double>(), 1.02);
  EXPECT_GT(read, 0u);
  EXPECT_GE(j["read_vs_layout"].get<double>(), 0.5);
  EXPECT_LE(j["read_vs_layout"].get<double>(), 1.01);  // 1.0 plus the extents' 4 KiB padding
  // The plan for the split (no host-RAM tier here): the same writes to the byte.
  EXPECT_EQ(j["host_cache"]["bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["plan_bytes_per_step"]["written"].get<uint64_t>(), written);
  // A budget of what it holds beside the pinned memory (the process's reserve and the emulated
  // device), the arena and the gradients (one micro-batch: each written once per step): the tier
  // keeps every gradient accumulator, and the run writes exactly the rest.
  const uint64_t grads = j["plan_bytes_per_step"]["grads_written"].get<uint64_t>();
  ASSERT_GT(grads, 0u);
  const uint64_t beside = j["host_cache"]["beside"].get<uint64_t>();
  EXPECT_GT(beside, 512u << 20);
  const nlohmann::json tier = RunJson(
      "bench step --layers 12 --width 64 --heads 4 --seq 16 --batch 2 "
      "--steps 2 --device-units 1 --trace '' --host-memory " +
      std::to_string(beside + j["pinned_arena_bytes"].get<uint64_t>() + grads) + " --path " + dir_);
  ASSERT_TRUE(tier.contains("host_cache")) << tier.dump();
  EXPECT_EQ(tier["host_cache"]["grads"].get<uint64_t>(), grads);
  EXPECT_EQ(tier["plan_bytes_per_step"]["written"].get<uint64_t>(), written - grads);
  EXPECT_EQ(tier["nvme_write_bytes_per_step"].get<uint64_t>(), written - grads);
  // Every part was measured, in every timed round.
  EXPECT_GT(j["forward_backward"]["compute_alone_seconds"].get<double>(), 0);
  EXPECT_GT(j["forward_backward"]["io_alone_seconds"].get<double>(), 0);
  EXPECT_GT(j["optimizer"]["cpu_alone_seconds"].get<double>(), 0);
  EXPECT_GT(j["io_alone_nvme_bytes_per_step"]["optimizer_written"].get<uint64_t>(), 0u);
  // --device auto (the default) names what it ran on: a GPU where one opens, else the host.
  const std::string device = j.value("device", "");
  EXPECT_TRUE(device.rfind("host (", 0) == 0 || device.rfind("cuda:", 0) == 0) << device;
  const CliRun bad = Shell(std::string(STRATA_BINARY) + " bench step --device gpu0");
  EXPECT_EQ(bad.rc, 2) << bad.out;
  EXPECT_NE(bad.out.find("gpu0 is not a device"), std::string::npos) << bad.out;
}

// --model: a mixture of experts as whole layers and with --page-experts, side by side. The
// estimate's layout is the engine's, and the bytes each writes per step are what the estimate's
// model (runtime/plan/step_traffic.h) counts for the units its optimizer updated.
TEST_F(BenchCliTest, StepOnAMixtureOfExpertsWritesWhatTheEstimateCounts) {
  const nlohmann::json j = RunJson(
      "bench step --model mixtral-tiny --seq 2 --batch 1 --steps 3 --trace '' --path " + dir_);
  ASSERT_TRUE(j.contains("layouts")) << j.dump();
  ASSERT_EQ(j["layouts"].size(), 2u);
  EXPECT_EQ(j["tokens_per_step"].get<uint64_t>(), 2u);
  // mixtral-tiny: 4 experts, top-2: 1 - (1/2)^2 of them get one of 2 tokens.
  EXPECT_DOUBLE_EQ(j["expert_hit_probability"].get<double>(), 0.75);
  for (const auto& r : j["layouts"]) {
    const std::string name = r["name"].get<std::string>();
    EXPECT_TRUE(r["layout_matches_estimate"].get<bool>()) << name;
    EXPECT_EQ(r["nvme_write_bytes_per_step"].get<uint64_t>(),
              r["predicted_from_routed_units"]["written"].get<uint64_t>())
        << name;
    EXPECT_GT(r["step_seconds"].get<double>(), 0) << name;
  }
  const auto& whole = j["layouts"][0];
  const auto& paged = j["layouts"][1];
  EXPECT_FALSE(whole["page_experts"].get<bool>());
  EXPECT_EQ(whole["units"].get<uint64_t>(), 2u);
  EXPECT_TRUE(paged["page_experts"].get<bool>());
  EXPECT_EQ(paged["units"].get<uint64_t>(), 2u * (1 + 4));
  // 2 tokens reach 2 to 4 of a layer's experts.
  EXPECT_GE(paged["experts_routed_per_layer"].get<double>(), 2.0);
  EXPECT_LE(paged["experts_routed_per_layer"].get<double>(), 4.0);

  const nlohmann::json one = RunJson(
      "bench step --model mixtral-tiny --page-experts --seq 2 --batch 1 --steps 1 --trace '' "
      "--path " +
      dir_);
  ASSERT_EQ(one["layouts"].size(), 1u);
  EXPECT_TRUE(one["layouts"][0]["page_experts"].get<bool>());
  for (const char* args :
       {"bench step --page-experts", "bench step --model llama-tiny --page-experts"}) {
    const CliRun bad = Shell(std::string(STRATA_BINARY) + " " + args);
    EXPECT_EQ(bad.rc, 2) << args << ": " << bad.out;
    EXPECT_NE(bad.out.find("--page-experts"), std::string::npos) << bad.out;
  }
}

// The device copies are measured, the bytes arrive intact, and without a GPU auto is the host.
TEST_F(BenchCliTest, TiersMeasuresDeviceCopiesAndValidates) {
  const nlohmann::json j = RunJson("bench tiers --size 16M --block 1M --validate --path " + dir_);
  ASSERT_TRUE(j.contains("copy_to_device")) << j.dump();
  EXPECT_TRUE(j["validated"].get<bool>());
  EXPECT_EQ(j["copy_to_device"]["bytes"].get<uint64_t>(), 16u << 20);
  EXPECT_EQ(j["copy_from_device"]["bytes"].get<uint64_t>(), 16u << 20);
  EXPECT_GT(j["copy_to_device"]["gbps"].get<double>(), 0);
  EXPECT_EQ(j["fetch_from_nvme_bytes"].get<uint64_t>(), 16u << 20);
  EXPECT_FALSE(j["device"].get<std::string>().empty());
}

}  // namespace
