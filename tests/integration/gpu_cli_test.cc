// `strata train` / `strata eval` with --device, through the binary.
//   - Everywhere: --device host is today's emulated device, auto falls back to it where no GPU is
//     visible and says so, cuda without a GPU exits non-zero naming the CUDA error and the way out,
//     and a malformed spec exits 2.
//   - Where a GPU is visible (label gpu; skipped with the reason elsewhere): in fp32 every offload
//     mode gives the no-offload losses on the GPU (within 1e-5 relative over 4 steps), the GPU's
//     first loss is the host's (1e-4), bf16 modes agree with each other (1e-3), and eval gives the
//     host's loss.
//   - Ranks on GPUs (--nproc 2; builds with Gloo, else ranks are refused as such): a build without
//     NCCL, or a machine with fewer GPUs than ranks,
//     refuses --device cuda naming why and trains --device auto on the host with the host's
//     losses; where two GPUs are visible
//     and the build has NCCL (tests named TwoGpus, which scripts/gpu-check.sh lets skip on its
//     one-GPU machines), 2 ranks give 1 rank's losses in every offload mode.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
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
using strata::testing::Shell;
using strata::testing::TempDir;

const std::string kStrata = STRATA_BINARY;

class GpuCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    // Token ids below 256 as uint16 (llama-tiny's vocabulary is larger).
    std::vector<uint16_t> ids(20000);
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<uint16_t>((i * 7919 + i / 13) % 251);
    std::ofstream(dir_.path() + "/data.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(ids.data()),
               static_cast<std::streamsize>(ids.size() * sizeof(uint16_t)));
  }

  // A config for `mode` (none, optimizer_cpu, all_nvme) in `precision` (fp32, bf16), with
  // micro-batches of `micro` rows and 2 accumulation steps.
  std::string Config(const std::string& mode, const std::string& precision, int micro = 2) {
    nlohmann::json c = {{"train_micro_batch_size_per_gpu", micro},
                        {"gradient_accumulation_steps", 2},
                        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}};
    if (precision == "bf16") c["bf16"] = {{"enabled", true}};
    const std::string nvme = dir_.path() + "/nvme";
    if (mode == "optimizer_cpu") {
      c["zero_optimization"] = {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}};
    } else if (mode == "all_nvme") {
      c["zero_optimization"] = {{"stage", 3},
                                {"stage3_param_persistence_threshold", 100},
                                {"offload_param", {{"device", "nvme"}, {"nvme_path", nvme}}},
                                {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", nvme}}}};
    }
    const std::string path =
        dir_.path() + "/" + mode + "-" + precision + "-" + std::to_string(micro) + ".json";
    std::ofstream(path) << c.dump();
    return path;
  }

  // Losses of `steps` steps of llama-tiny on `device`, or an empty vector (the run's output in
  // *out).
  // `extra`: more flags (--nproc, --micro-batch).
  std::vector<double> Losses(const std::string& device, const std::string& config, int steps,
                             std::string* out, const std::string& extra = "") {
    const std::string log = dir_.path() + "/log.jsonl";
    std::filesystem::remove(log);
    const CliRun r =
        Shell(kStrata + " train --quiet --model llama-tiny --seq-len 32 --data " + dir_.path() +
              "/data.bin --steps " + std::to_string(steps) + " --device " + device + " --config " +
              config + " --log-json " + log + " " + extra);
    *out = r.out;
    std::vector<double> losses;
    if (r.rc != 0) return losses;
    for (const nlohmann::json& j : JsonLines(log)) losses.push_back(j.at("loss").get<double>());
    return losses;
  }

  // Skips the test unless `strata` opens cuda:0 (`gpu`) here.
  bool HaveGpu(const std::string& gpu = "cuda") {
    std::string out;
    const std::vector<double> l = Losses(gpu, Config("none", "fp32"), 1, &out);
    if (!l.empty()) return true;
    const size_t at = out.rfind("--device " + gpu);
    no_gpu_reason_ = at == std::string::npos ? out : out.substr(at);
    return false;
  }

  TempDir dir_{"strata-gpu-cli"};
  std::string no_gpu_reason_;
};

TEST_F(GpuCliTest, DeviceFlagsAreCheckedAndAutoSaysWhatItChose) {
  std::string out;
  const std::vector<double> host = Losses("host", Config("all_nvme", "fp32"), 2, &out);
  ASSERT_EQ(host.size(), 2u) << out;
  const std::vector<double> autod = Losses("auto", Config("all_nvme", "fp32"), 2, &out);
  ASSERT_EQ(autod.size(), 2u) << out;
  EXPECT_NE(out.find("device auto: using "), std::string::npos) << out;
  if (out.find("device auto: using host") != std::string::npos) {
    EXPECT_EQ(autod, host);  // the same emulated device, the same numbers
  }

  const CliRun bad = Shell(kStrata + " train --steps 1 --device gpu0");
  EXPECT_EQ(bad.rc, 2) << bad.out;
  EXPECT_NE(bad.out.find("gpu0 is not a device: auto, host, cuda or cuda:N"), std::string::npos)
      << bad.out;
  const CliRun eval_bad = Shell(kStrata + " eval --model llama-tiny --data " + dir_.path() +
                                "/data.bin --device cuda:-1");
  EXPECT_EQ(eval_bad.rc, 2) << eval_bad.out;

  if (!HaveGpu()) {
    // No GPU here: --device cuda is an error naming the CUDA error and the way out, not a
    // silent fallback (a GPU machine training on the emulation would look like a hang).
    EXPECT_NE(no_gpu_reason_.find("no usable GPU"), std::string::npos) << no_gpu_reason_;
    EXPECT_NE(no_gpu_reason_.find("--device auto or host"), std::string::npos) << no_gpu_reason_;
  }
}

TEST_F(GpuCliTest, OffloadModesOnTheGpuGiveTheNoOffloadLossesAndTheHostsFirstLoss) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU: " << no_gpu_reason_;
  std::string out;
  const std::vector<double> none = Losses("cuda", Config("none", "fp32"), 4, &out);
  ASSERT_EQ(none.size(), 4u) << out;
  EXPECT_NE(out.find("device cuda:0 ("), std::string::npos) << out;
  for (const std::string mode : {"optimizer_cpu", "all_nvme"}) {
    const std::vector<double> l = Losses("cuda", Config(mode, "fp32"), 4, &out);
    ASSERT_EQ(l.size(), 4u) << mode << "\n" << out;
    for (size_t i = 0; i < l.size(); ++i) {
      EXPECT_LE(std::abs(l[i] - none[i]) / std::abs(none[i]), 1e-5)
          << mode << " step " << i + 1 << ": " << l[i] << " vs " << none[i];
    }
  }
  const std::vector<double> host = Losses("host", Config("none", "fp32"), 1, &out);
  ASSERT_EQ(host.size(), 1u) << out;
  EXPECT_LE(std::abs(host[0] - none[0]) / std::abs(host[0]), 1e-4) << host[0] << " vs " << none[0];

  std::vector<double> bf16_first;
  for (const std::string mode : {"none", "optimizer_cpu", "all_nvme"}) {
    const std::vector<double> l = Losses("cuda", Config(mode, "bf16"), 3, &out);
    ASSERT_EQ(l.size(), 3u) << mode << " bf16\n" << out;
    if (bf16_first.empty()) {
      bf16_first = l;
      continue;
    }
    for (size_t i = 0; i < l.size(); ++i) {
      EXPECT_LE(std::abs(l[i] - bf16_first[i]) / std::abs(bf16_first[i]), 1e-3)
          << mode << " bf16 step " << i + 1;
    }
  }
}

TEST_F(GpuCliTest, EvalOnTheGpuGivesTheHostsLoss) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU: " << no_gpu_reason_;
  double loss[2] = {0, 0};
  int i = 0;
  for (const std::string device : {"host", "cuda"}) {
    const CliRun r =
        Shell(kStrata + " eval --json --model llama-tiny --seq-len 32 --data " + dir_.path() +
              "/data.bin --device " + device + " --config " + Config("all_nvme", "fp32"));
    ASSERT_EQ(r.rc, 0) << device << "\n" << r.out;
    const size_t start = r.out.find("{\n");
    ASSERT_NE(start, std::string::npos) << r.out;
    loss[i++] = nlohmann::json::parse(r.out.substr(start)).at("loss").get<double>();
  }
  EXPECT_LE(std::abs(loss[0] - loss[1]) / loss[0], 1e-4) << loss[0] << " vs " << loss[1];
}

// 2 ranks of micro-batch 1 and 1 rank of micro-batch 2 train the same global batch (2 rows x 2
// accumulation steps; rank r takes row r of each micro-batch pair).
TEST_F(GpuCliTest, RanksOnGpusNeedNcclAndAGpuEachElseAutoUsesTheHost) {
  std::string out;
  const std::string config = Config("all_nvme", "fp32", 1);
  const std::string two = "--nproc 2";
  const bool two_gpus = STRATA_HAVE_NCCL && HaveGpu("cuda:1");
  const std::string why = STRATA_HAVE_NCCL
                              ? "2 ranks on this machine (LOCAL_WORLD_SIZE) need 2 GPUs, one each"
                              : "ranks on GPUs need c10d's ProcessGroupNCCL, which this build "
                                "does not have";
  const std::vector<double> host = Losses("host", config, 2, &out, two);
  if (!STRATA_HAVE_GLOO) {  // a libtorch without Gloo's headers: no ranks at all, said so
    EXPECT_TRUE(host.empty()) << out;
    EXPECT_NE(out.find("needs strata built with libtorch and Gloo"), std::string::npos) << out;
    return;
  }
  ASSERT_EQ(host.size(), 2u) << out;
  const std::vector<double> autod = Losses("auto", config, 2, &out, two);
  ASSERT_EQ(autod.size(), 2u) << out;
  if (two_gpus) {
    EXPECT_NE(out.find("(nccl on cuda:1)"), std::string::npos) << out;
    return;  // TwoGpusGiveOneGpusLosses checks the numbers
  }
  EXPECT_NE(out.find("device auto: 2 ranks train on the host-emulated device: " + why),
            std::string::npos)
      << out;
  EXPECT_EQ(autod, host);  // the same emulated device, the same numbers
  const std::vector<double> refused = Losses("cuda", config, 2, &out, two);
  EXPECT_TRUE(refused.empty()) << out;
  EXPECT_NE(out.find("--device cuda with 2 ranks: " + why), std::string::npos) << out;
}

TEST_F(GpuCliTest, TwoGpusGiveOneGpusLosses) {
  if (!STRATA_HAVE_NCCL) GTEST_SKIP() << "this build has no NCCL (libtorch without CUDA)";
  if (!HaveGpu("cuda:1")) GTEST_SKIP() << "needs two GPUs: " << no_gpu_reason_;
  for (const std::string mode : {"none", "optimizer_cpu", "all_nvme"}) {
    std::string out;
    const std::vector<double> one = Losses("cuda", Config(mode, "fp32"), 4, &out);
    ASSERT_EQ(one.size(), 4u) << mode << "\n" << out;
    const std::vector<double> two = Losses("cuda", Config(mode, "fp32", 1), 4, &out, "--nproc 2");
    ASSERT_EQ(two.size(), 4u) << mode << "\n" << out;
    EXPECT_NE(out.find("(nccl on cuda:1)"), std::string::npos) << out;
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_LE(std::abs(two[i] - one[i]) / std::abs(one[i]), 1e-5)
          << mode << " step " << i + 1 << ": " << two[i] << " vs " << one[i];
    }
  }
}

}  // namespace
