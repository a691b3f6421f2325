// Non-finite numbers through `strata train`: a NaN in a gradient (the STRATA_NAN_GRADIENT test
// hook, runtime/engine/engine.h) or a loss that diverges to NaN stops the run with exit code 1 and
// one line naming the step (and, for gradients, the unit or parameter); the checkpoints written
// before are intact and resume to the same numbers as a run that never failed. fp16 keeps
// DeepSpeed's behaviour: an overflow skips the step and training goes on.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/cli_run.h"

namespace {

using strata::testing::CliRun;
using strata::testing::ReadFileOrEmpty;
using strata::testing::Shell;

CliRun Strata(const std::string& env, const std::string& args) {
  return Shell(env + " " + std::string(STRATA_BINARY) + " " + args);
}

// The losses of `--log-json` lines, by step.
std::vector<double> Losses(const std::string& log) {
  std::vector<double> out;
  std::istringstream lines(ReadFileOrEmpty(log));
  const std::regex loss(R"("loss":([-0-9.eE+naif]+))");
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, loss)) out.push_back(std::stod(m[1]));
  }
  return out;
}

class NonFiniteCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-nonfinite-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream data(dir_ + "/data.txt");
    for (int i = 0; i < 400; ++i) data << "The quick brown fox " << i << " jumps.\n";
    const std::string nvme = dir_ + "/nvme";
    std::ofstream(dir_ + "/nvme.json")
        << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100,
        "offload_param": {"device": "nvme", "nvme_path": ")"
        << nvme << R"("}, "offload_optimizer": {"device": "nvme", "nvme_path": ")" << nvme
        << R"("}}})";
    std::ofstream(dir_ + "/plain.json")
        << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Train(const std::string& config, const std::string& flags) const {
    const std::string lr = flags.find("--lr") == std::string::npos ? " --lr 1e-3" : "";
    return "train --model tiny --seq-len 16 --threads 1 --quiet" + lr + " --data " + dir_ +
           "/data.txt --config " + dir_ + "/" + config + " " + flags;
  }
  std::string dir_;
};

// One line "strata train: failed_precondition: ...", exit code 1, no signal, no "done".
void ExpectCleanStop(const CliRun& r, const std::string& says) {
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_EQ(r.signal, 0) << r.out;
  EXPECT_NE(r.out.find("strata train: failed_precondition: " + says), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("done after"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << r.out;
}

// With parameters and optimizer on NVMe (the check on the gradient pipeline's sums per unit) and
// without offload (libtorch's optimizer): the NaN at step 3 names step 3 and where it is, the
// checkpoints of steps 1 and 2 stay, and resuming from step 2 continues exactly as a run that
// never saw the NaN.
TEST_F(NonFiniteCliTest, NaNGradientStopsAndKeepsTheCheckpoints) {
  for (const std::string config : {"nvme.json", "plain.json"}) {
    SCOPED_TRACE(config);
    const std::string ck = dir_ + "/ck-" + config;
    CliRun r = Strata("STRATA_NAN_GRADIENT=blocks.1.fc2@3",
                      Train(config, "--steps 5 --save-every 1 --save " + ck));
    ExpectCleanStop(r, "step 3: the gradients are not finite");
    EXPECT_NE(r.out.find(config == "nvme.json" ? "in blocks.1)" : "in blocks.1.fc2."),
              std::string::npos)
        << r.out;
    EXPECT_EQ(ReadFileOrEmpty(ck + "/latest"), "step-2");
    EXPECT_FALSE(std::filesystem::exists(ck + "/step-3"));

    const std::string clean_log = dir_ + "/clean-" + config + ".jsonl";
    ASSERT_EQ(Strata("", Train(config, "--steps 4 --log-json " + clean_log)).rc, 0);
    const std::string resumed_log = dir_ + "/resumed-" + config + ".jsonl";
    CliRun resumed =
        Strata("", Train(config, "--steps 4 --resume " + ck + " --log-json " + resumed_log));
    ASSERT_EQ(resumed.rc, 0) << resumed.out;
    const std::vector<double> clean = Losses(clean_log), again = Losses(resumed_log);
    ASSERT_EQ(clean.size(), 4u);
    ASSERT_EQ(again.size(), 2u);
    EXPECT_EQ(again[0], clean[2]);
    EXPECT_EQ(again[1], clean[3]);
  }
}

// A learning rate that makes the model diverge: the loss becomes NaN, the run stops naming the
// step, and the checkpoint written before it is the latest.
TEST_F(NonFiniteCliTest, DivergingLossStopsBeforeTheStep) {
  const std::string ck = dir_ + "/ck";
  CliRun r = Strata("", Train("nvme.json",
                              "--steps 20 --save-every 1 --lr 1e30 --max-grad-norm 0 "
                              "--save " +
                                  ck));
  EXPECT_EQ(r.rc, 1) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.out, m,
      std::regex(
          R"(step (\d+): the (loss of micro-batch \d+ of 2 is (NaN|infinite)|gradients are not finite))")))
      << r.out;
  const int failed = std::stoi(m[1]);
  ASSERT_GE(failed, 2) << r.out;
  EXPECT_EQ(ReadFileOrEmpty(ck + "/latest"), "step-" + std::to_string(failed - 1));
  EXPECT_EQ(r.out.find("done after"), std::string::npos) << r.out;
}

// The guard is for fp32 and bf16: under fp16 the NaN gradient is an overflow, the step is skipped
// (DeepSpeed's loss scaling) and the run finishes.
TEST_F(NonFiniteCliTest, Fp16SkipsTheStepInstead) {
  const std::string log = dir_ + "/fp16.jsonl";
  CliRun r = Strata("STRATA_NAN_GRADIENT=blocks.1.fc2@2",
                    Train("nvme.json", "--steps 3 --fp16 --log-json " + log));
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find("not finite"), std::string::npos) << r.out;
  const std::string steps = ReadFileOrEmpty(log);
  // Step 2's record (keys in any order) says it was skipped; the others say they were not.
  std::istringstream lines(steps);
  int records = 0;
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, std::regex(R"("step":(\d+)[,}])"))) continue;
    ++records;
    const bool skipped = line.find(R"("skipped":true)") != std::string::npos;
    EXPECT_EQ(skipped, m[1] == "2") << line;
  }
  EXPECT_EQ(records, 3) << steps;
}

TEST_F(NonFiniteCliTest, ABadHookSpecIsRefused) {
  CliRun r = Strata("STRATA_NAN_GRADIENT=blocks.1", Train("nvme.json", "--steps 1"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("STRATA_NAN_GRADIENT=blocks.1: want PARAMETER@STEP"), std::string::npos)
      << r.out;
}

}  // namespace
