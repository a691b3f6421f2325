// scripts/gpu-check.sh --rehearse end to end: the one-shot GPU proof run through every step on the
// host-emulated device at tiny scale, so that on the GPU machine only CUDA itself is new. Checks
// that it exits 0 and that its JSON holds every section with sane values: finite losses, the same
// fp32 losses in every offload mode, tokens/s and step times above zero, the formulas stated, the
// GPU-only measurements marked "skipped: rehearsal".
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/testing/cli_run.h"
#include "tests/testing/temp_dir.h"

namespace {

using nlohmann::json;
using strata::testing::CliRun;
using strata::testing::ReadFileOrEmpty;
using strata::testing::Shell;
using strata::testing::TempDir;

bool Positive(const json& j, const char* key) {
  return j.contains(key) && j.at(key).is_number() && j.at(key).get<double>() > 0;
}

std::vector<double> Losses(const json& run) {
  std::vector<double> out;
  if (run.contains("losses") && run.at("losses").is_array()) {
    for (const json& l : run.at("losses")) out.push_back(l.is_number() ? l.get<double>() : NAN);
  }
  return out;
}

TEST(GpuCheckRehearsalTest, EveryStepRunsAndTheReportHoldsSaneValues) {
  TempDir dir("strata-gpu-check");
  ASSERT_TRUE(dir.ok());
  const std::string out = dir.path() + "/out";
  // The swap files go to the test's own directory, removed with it.
  const CliRun r = Shell("STRATA_CHECK_SCRATCH=" + dir.path() +
                         " bash " STRATA_SOURCE_DIR
                         "/scripts/gpu-check.sh --rehearse --build " STRATA_BUILD_DIR " --out " +
                         out);
  ASSERT_EQ(r.rc, 0) << r.out;
  const json j = json::parse(ReadFileOrEmpty(out + "/gpu-check.json"), nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_NE(ReadFileOrEmpty(out + "/gpu-check.txt").find("targets"), std::string::npos);

  EXPECT_EQ(j.value("schema", ""), "strata-gpu-check/1");
  EXPECT_EQ(j.value("mode", "").rfind("rehearsal", 0), 0u) << j.value("mode", "");
  EXPECT_TRUE(j.value("ok", false)) << j.at("failures").dump(1);
  EXPECT_TRUE(j.at("failures").empty()) << j.at("failures").dump(1);
  for (const char* key :
       {"host", "settings", "formulas", "steps", "build", "tests", "peaks", "model", "training",
        "tiny_runs", "exactness", "reference_pytorch", "disk", "transfers", "targets", "checks"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_NE(j.at("formulas").value("model_flops_per_token", "").find("6*N + 12*L*H*S"),
            std::string::npos);

  // Every step ran, except the bundle build (the rehearsal uses the existing build).
  for (const char* name : {"ctest_gpu", "ctest_device", "estimate_big", "estimate_tiny", "data",
                           "train_tiny_none", "train_tiny_cpu", "train_tiny_nvme", "first_host",
                           "first_device", "peaks", "train_big_none", "reference", "train_big_cpu",
                           "bench_io", "bench_tiers", "train_big_nvme"}) {
    ASSERT_TRUE(j.at("steps").contains(name)) << name;
    EXPECT_EQ(j.at("steps").at(name).value("status", ""), "ok") << j.at("steps").at(name).dump(1);
  }
  EXPECT_EQ(j.at("steps").at("build").value("error", "").rfind("skipped: rehearsal", 0), 0u);
  EXPECT_GT(j.at("tests").at("device_conformance").value("total", 0), 0);

  // The large model's three modes: every step logged, finite losses, throughput and FLOPs.
  const int64_t big_steps = j.at("settings").at("big_steps").get<int64_t>();
  ASSERT_GT(big_steps, 0);
  EXPECT_GT(j.at("model").at("big").value("params", 0), 0);
  for (const char* mode : {"none", "cpu", "nvme"}) {
    SCOPED_TRACE(mode);
    const json& t = j.at("training").at("modes").at(mode);
    EXPECT_EQ(t.value("steps_completed", 0), big_steps);
    const std::vector<double> losses = Losses(t);
    ASSERT_EQ(losses.size(), static_cast<size_t>(big_steps));
    for (double l : losses) EXPECT_TRUE(std::isfinite(l) && l > 0) << l;
    for (const char* key : {"tokens_per_second", "step_seconds", "forward_seconds",
                            "backward_seconds", "model_tflops", "mfu", "host_peak_rss_bytes"}) {
      EXPECT_TRUE(Positive(t, key)) << key << ": " << t.dump(1);
    }
  }
  const json& nvme = j.at("training").at("modes").at("nvme");
  EXPECT_TRUE(Positive(nvme, "nvme_read_bytes")) << nvme.dump(1);
  EXPECT_TRUE(Positive(nvme, "nvme_written_bytes")) << nvme.dump(1);

  // fp32: the same losses in every offload mode (the host device is deterministic: bitwise).
  const json& tiny = j.at("tiny_runs").at("modes");
  const std::vector<double> base = Losses(tiny.at("none"));
  ASSERT_EQ(base.size(), j.at("settings").at("tiny_steps").get<size_t>());
  for (const char* mode : {"cpu", "nvme"}) {
    const std::vector<double> other = Losses(tiny.at(mode));
    ASSERT_EQ(other.size(), base.size()) << mode;
    for (size_t i = 0; i < base.size(); ++i) {
      EXPECT_TRUE(std::isfinite(base[i]));
      EXPECT_EQ(other[i], base[i]) << mode << " step " << i + 1;
    }
  }
  for (const char* check : {"fp32_offload_modes", "host_vs_device", "bf16_offload_modes"}) {
    const json& e = j.at("exactness").at(check);
    EXPECT_TRUE(e.value("pass", false)) << check << ": " << e.dump(1);
  }
  EXPECT_TRUE(j.at("exactness").at("fp32_offload_modes").at("nvme").at("bitwise").get<bool>());

  // Plain PyTorch, the matmul peak, the disk and the device copies.
  const json& ref = j.at("reference_pytorch");
  EXPECT_TRUE(Positive(ref, "step_seconds_median")) << ref.dump(1);
  EXPECT_TRUE(Positive(ref, "tokens_per_second")) << ref.dump(1);
  EXPECT_FALSE(ref.value("implementation", "").empty());
  EXPECT_TRUE(ref.value("params_match_strata", false)) << ref.dump(1);
  EXPECT_TRUE(Positive(j.at("peaks").at("matmul"), "median_tflops"));
  EXPECT_TRUE(Positive(j.at("disk"), "read_gbps")) << j.at("disk").dump(1);
  EXPECT_TRUE(Positive(j.at("disk"), "write_gbps")) << j.at("disk").dump(1);
  EXPECT_TRUE(Positive(j.at("transfers"), "h2d_gbps")) << j.at("transfers").dump(1);
  EXPECT_TRUE(Positive(j.at("transfers"), "d2h_gbps")) << j.at("transfers").dump(1);
  EXPECT_EQ(j.at("transfers").value("memcpy_peak", ""), "skipped: rehearsal");

  // The targets are all there; those with a value have a verdict, the GPU-only ones none.
  std::vector<std::string> names;
  for (const json& t : j.at("targets")) {
    names.push_back(t.at("name").get<std::string>());
    EXPECT_EQ(t.at("value").is_null(), t.at("pass").is_null()) << t.dump();
  }
  EXPECT_EQ(names, (std::vector<std::string>{"mfu_optimizer_cpu_vs_no_offload",
                                             "nvme_step_vs_bound", "h2d_vs_memcpy_peak",
                                             "d2h_vs_memcpy_peak", "no_offload_step_vs_pytorch"}));
  for (const json& t : j.at("targets")) {
    const std::string name = t.at("name").get<std::string>();
    if (name.find("memcpy") != std::string::npos) {
      EXPECT_TRUE(t.at("pass").is_null()) << t.dump();
    } else {
      EXPECT_TRUE(t.at("value").is_number()) << t.dump();
    }
  }
}

// A step that breaks is recorded with its error, the script goes on and exits 1: here the build
// directory has no strata binary, so every strata step fails while the PyTorch ones still run.
TEST(GpuCheckRehearsalTest, ABrokenStepIsRecordedAndTheExitCodeIsOne) {
  TempDir dir("strata-gpu-check-broken");
  ASSERT_TRUE(dir.ok());
  const std::string out = dir.path() + "/out";
  const CliRun r = Shell("STRATA_CHECK_SCRATCH=" + dir.path() +
                         " bash " STRATA_SOURCE_DIR "/scripts/gpu-check.sh --rehearse --build " +
                         dir.path() + "/no-build --out " + out);
  EXPECT_EQ(r.rc, 1) << r.out;
  const json j = json::parse(ReadFileOrEmpty(out + "/gpu-check.json"), nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_FALSE(j.value("ok", true));
  const json& train = j.at("steps").at("train_big_none");
  EXPECT_EQ(train.value("status", ""), "failed");
  EXPECT_NE(train.value("error", "").find("no-build/tools/strata/strata"), std::string::npos)
      << train.dump(1);
  EXPECT_EQ(j.at("steps").at("peaks").value("status", ""), "ok");
  EXPECT_FALSE(j.at("failures").empty());
}

}  // namespace
