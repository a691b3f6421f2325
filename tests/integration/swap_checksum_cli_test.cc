// Checksummed swap blocks through the binary: `strata train` with parameters and optimizer on
// NVMe, and one bit flipped on its way into one swap file (STRATA_IO_FAULTS=flip:write@KIND:N,
// swap/fault_spec.h), for each kind of swap file: params.swp (the units' fp32 parameters, which
// are also the optimizer's masters), gradients.swp and optimizer.swp (the moments). With checksums
// on (the default) the run ends with one clean error naming the file, exit code 1, no "done", no
// swap files left, and the checkpoint saved before the corruption still resumes exactly. With
// "strata": {"swap_checksums": false} the same run never learns where its state went bad: it
// finishes with exit 0, or (a flipped exponent bit in a parameter or a master weight) trains on it
// until the loss turns NaN and the non-finite loss guard stops it, naming no swap file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/cli_run.h"

namespace {

using strata::testing::CliRun;
using strata::testing::JsonLines;
using strata::testing::ReadFileOrEmpty;
using strata::testing::Shell;

// Which write to flip. The small preset with sub_group_size 20000 has 4 parameter blocks and 169
// optimizer sub-groups; set-up writes each parameter block and each sub-group's state once, and
// every step writes each of them once more and each sub-group's gradients once. So each N below
// is a write of step 2, after the checkpoint of step 1 (--save-every 1) was committed:
//   params     4 (set-up) + 4 (step 1) + 1          = 9
//   gradients  169 (step 1) + 20                    = 189
//   optimizer  169 (set-up) + 169 (step 1) + 20     = 358
enum class Unchecked {
  kFinishes,  // the unchecked run finishes, trained on the corrupt block
  kNan,       // its loss turns NaN and the non-finite guard stops it
  kEither,    // either, depending on whether the corrupt copy is read back before it is
              // rewritten (params: the updated master stays pinned for the next forward, and
              // whether eviction drops it first depends on timing)
};
struct FlipCase {
  const char* kind;
  int write;
  Unchecked unchecked;
};

void PrintTo(const FlipCase& c, std::ostream* os) { *os << c.kind << " write " << c.write; }

class SwapChecksumCliTest : public ::testing::TestWithParam<FlipCase> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-swap-checksum-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream data(dir_ + "/data.txt");
    for (int i = 0; i < 400; ++i) {
      data << "The quick brown fox " << i << " jumps over the lazy dog.\n";
    }
    // Two pinned parameter buffers for four units and small sub-groups: every kind of block is
    // read back from NVMe within a step or two of being written. No device prefetch (a bucket of
    // one element): with it, the device would hold every unit of this model and each deferred
    // update would be copied there as it finishes (param_coordinator.h), so no parameter block
    // would ever be read back from NVMe after the first step (a flip there is never used: the
    // next update overwrites it).
    WriteConfig("on.json", "");
    WriteConfig("off.json", R"(, "strata": {"swap_checksums": false})");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void WriteConfig(const std::string& name, const std::string& extra) {
    std::ofstream(dir_ + "/" + name)
        << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100,
          "sub_group_size": 20000, "stage3_prefetch_bucket_size": 1,
          "offload_param": {"device": "nvme", "nvme_path": ")"
        << dir_ << R"(/nvme", "buffer_count": 2},
          "offload_optimizer": {"device": "nvme", "nvme_path": ")"
        << dir_ << R"(/nvme"}})" << extra << "}";
  }

  // `strata train` on the small preset with `config`, STRATA_IO_FAULTS=`faults` (none if empty).
  CliRun Train(const std::string& config, const std::string& faults, const std::string& args) {
    const std::string env = faults.empty() ? "" : "STRATA_IO_FAULTS=" + faults + " ";
    return Shell(env + STRATA_BINARY + " train --model small --config " + dir_ + "/" + config +
                 " --data " + dir_ + "/data.txt --threads 1 --quiet " + args);
  }

  std::string Flip() const {
    return "flip:write@" + std::string(GetParam().kind) + ":" + std::to_string(GetParam().write);
  }

  std::string dir_;
};

TEST_P(SwapChecksumCliTest, FlippedBitEndsTheRunNamingTheFileAndTheCheckpointResumes) {
  const std::string kind = GetParam().kind;
  const CliRun r = Train(
      "on.json", Flip(),
      "--steps 5 --save " + dir_ + "/ckpt --save-every 1 --log-json " + dir_ + "/steps.jsonl");
  EXPECT_EQ(r.rc, 1) << r.out;
  std::vector<std::string> errors;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("strata train:", 0) == 0) errors.push_back(line);
  }
  ASSERT_EQ(errors.size(), 1u) << r.out;
  const std::string& e = errors[0];
  EXPECT_EQ(e.rfind("strata train: data_loss: ", 0), 0u) << e;
  EXPECT_NE(e.find("checksum mismatch: " + dir_ + "/nvme/"), std::string::npos) << e;
  EXPECT_NE(e.find("/" + kind + ".swp offset "), std::string::npos) << e;
  EXPECT_NE(e.find(" stored "), std::string::npos) << e;
  for (const char* bad : {"done after", "terminate called", "Aborted", "core dumped"}) {
    EXPECT_EQ(r.out.find(bad), std::string::npos) << bad << " in:\n" << r.out;
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir_ + "/nvme")) << "swap files left behind";
  // It stopped at the corruption (in step 2 or 3, or in the save after step 2, which reads the
  // block back), and the last committed checkpoint is the one from before the flip.
  const size_t steps_done = JsonLines(dir_ + "/steps.jsonl").size();
  EXPECT_GE(steps_done, 1u);
  EXPECT_LE(steps_done, 2u);
  EXPECT_EQ(ReadFileOrEmpty(dir_ + "/ckpt/latest"), "step-1");

  // That checkpoint resumes, and its step 2 is the step 2 of a run that never saw a flip.
  const CliRun clean = Train("on.json", "", "--steps 2 --log-json " + dir_ + "/clean.jsonl");
  ASSERT_EQ(clean.rc, 0) << clean.out;
  const CliRun resumed = Train(
      "on.json", "", "--steps 2 --resume " + dir_ + "/ckpt --log-json " + dir_ + "/resumed.jsonl");
  ASSERT_EQ(resumed.rc, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
  const std::vector<nlohmann::json> a = JsonLines(dir_ + "/clean.jsonl");
  const std::vector<nlohmann::json> b = JsonLines(dir_ + "/resumed.jsonl");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0]["step"], 2);
  EXPECT_EQ(b[0]["loss"], a[1]["loss"]);
}

// The same flip with checksums off is not caught where it happens: the run trains on the corrupt
// block (and shows that the flip above really reached a block that is read back). At best a NaN
// loss stops it steps later, with nothing pointing at the swap file.
TEST_P(SwapChecksumCliTest, WithChecksumsOffTheSameFlipGoesUnnoticed) {
  const CliRun r = Train("off.json", Flip(), "--steps 4 --log-json " + dir_ + "/steps.jsonl");
  EXPECT_EQ(r.out.find("checksum mismatch"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(".swp"), std::string::npos) << r.out;
  const std::vector<nlohmann::json> steps = JsonLines(dir_ + "/steps.jsonl");
  if (GetParam().unchecked == Unchecked::kEither) {
    EXPECT_TRUE(r.rc == 0 || r.out.find("is NaN") != std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << r.out;
  } else if (GetParam().unchecked == Unchecked::kNan) {
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_NE(r.out.find("is NaN"), std::string::npos) << r.out;
    // Step 2 wrote the flipped block and ran on good state; the loss broke only later.
    ASSERT_GE(steps.size(), 2u);
    EXPECT_LT(steps.size(), 4u);
    EXPECT_TRUE(steps[1]["loss"].is_number()) << steps[1].dump();
  } else {
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("done after 4 steps"), std::string::npos) << r.out;
    EXPECT_EQ(steps.size(), 4u);
  }
}

INSTANTIATE_TEST_SUITE_P(EachSwapFile, SwapChecksumCliTest,
                         ::testing::Values(FlipCase{"params", 9, Unchecked::kEither},
                                           FlipCase{"gradients", 189, Unchecked::kFinishes},
                                           FlipCase{"optimizer", 358, Unchecked::kNan}),
                         [](const ::testing::TestParamInfo<FlipCase>& info) {
                           return std::string(info.param.kind);
                         });

}  // namespace
