// Hugging Face's learning-rate schedules from `strata train`'s flags (--lr-scheduler,
// --warmup-steps, --warmup-ratio, --min-lr-rate), through the binary: the "lr" of every --log-json
// record (the rate that step applied) equals the formula of transformers' get_scheduler, written
// out here; a flag that contradicts the config's scheduler section is refused naming both;
// --warmup-steps alone gives linear and says so; a run resumed mid-way without the flags continues
// the same schedule, step for step.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <string>
#include <vector>

#include "tests/testing/cli_run.h"

namespace {

using strata::testing::CliRun;
using strata::testing::JsonLines;
using strata::testing::Strata;

constexpr double kLr = 1e-3;
constexpr int kSteps = 12;
constexpr int kWarmup = 3;

// lambda(k) of each lr_scheduler_type, k = optimizer steps already applied (LambdaLR stepped
// after every optimizer step), for `warmup` warmup steps of `total`.
double Lambda(const std::string& type, int k, int warmup, int total, double min_rate = 0) {
  if (type == "constant") return 1.0;
  if (k < warmup) return static_cast<double>(k) / warmup;
  if (type == "constant_with_warmup") return 1.0;
  const double span = total > warmup ? total - warmup : 1;
  if (type == "linear") return std::max(0.0, (total - k) / span);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * ((k - warmup) / span)));
  return std::max(0.0, min_rate + (1.0 - min_rate) * cosine);  // cosine: min_rate 0
}

class ScheduleCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-schedule-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream data(dir_ + "/data.txt");
    for (int i = 0; i < 200; ++i) data << "The quick brown fox " << i << " jumps over the dog.\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A config with no scheduler section (as most Hugging Face users' configs), on the CPU.
  std::string PlainConfig(const std::string& scheduler = "") const {
    const std::string path = dir_ + "/ds" + std::to_string(configs_++) + ".json";
    std::ofstream(path) << R"({"train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},)"
                        << scheduler << R"( "zero_optimization": {"stage": 3}})";
    return path;
  }
  // `strata train` on the tiny GPT and the demo's config (no --config) unless `args` gives one.
  std::string Train(const std::string& args) const {
    return "train --model tiny --data " + dir_ + "/data.txt --threads 1 --quiet --seq-len 32 " +
           args;
  }
  // The "lr" of each --log-json record, in step order (checked to be steps first..first+n-1).
  std::vector<double> Rates(const std::string& log, int first, int n) const {
    std::vector<nlohmann::json> records = JsonLines(log);
    std::vector<double> out;
    EXPECT_EQ(records.size(), static_cast<size_t>(n)) << log;
    for (size_t i = 0; i < records.size(); ++i) {
      EXPECT_EQ(records[i].value("step", -1), first + static_cast<int>(i)) << records[i];
      out.push_back(records[i].value("lr", -1.0));
    }
    return out;
  }
  std::string dir_;
  mutable int configs_ = 0;
};

TEST_F(ScheduleCliTest, EachSchedulerMatchesItsFormulaAtEveryStep) {
  struct Case {
    std::string type, flags;
    int warmup;
    double min_rate;
  };
  const std::vector<Case> cases = {
      {"linear", "--warmup-steps 3", kWarmup, 0},
      {"cosine", "--warmup-steps 3", kWarmup, 0},
      {"constant", "--warmup-steps 3", 0, 0},  // constant ignores the warmup, as HF does
      {"constant_with_warmup", "--warmup-steps 3", kWarmup, 0},
      {"cosine_with_min_lr", "--warmup-steps 3 --min-lr-rate 0.1", kWarmup, 0.1},
      // ceil(0.2 × 12) = ceil(2.4000000000000004) = 3 warmup steps.
      {"cosine", "--warmup-ratio 0.2", 3, 0},
      // Warmup as long as the run: the last step still warms up.
      {"linear", "--warmup-steps 12", kSteps, 0},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.type + " " + c.flags);
    const std::string log = dir_ + "/run" + std::to_string(i) + ".jsonl";
    CliRun r = Strata(Train("--steps 12 --lr 1e-3 --lr-scheduler " + c.type + " " + c.flags +
                            " --log-json " + log));
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("lr schedule: " + c.type + " (--lr-scheduler)"), std::string::npos)
        << r.out;
    const std::vector<double> rates = Rates(log, 1, kSteps);
    for (size_t s = 0; s < rates.size(); ++s) {
      const int k = static_cast<int>(s);  // record s is step s + 1, after k = s applied steps
      EXPECT_DOUBLE_EQ(rates[s], kLr * Lambda(c.type, k, c.warmup, kSteps, c.min_rate))
          << "step " << k + 1;
    }
    // Not vacuous: the warmup starts at 0, peaks right after it, and the decays go down.
    ASSERT_EQ(rates.size(), static_cast<size_t>(kSteps));
    if (c.type != "constant") {
      EXPECT_EQ(rates[0], 0.0);
    }
    if (c.warmup == kWarmup) {
      EXPECT_DOUBLE_EQ(rates[kWarmup], kLr);
      const bool decays = c.type == "linear" || c.type.rfind("cosine", 0) == 0;
      if (decays) {
        EXPECT_LT(rates[kSteps - 1], rates[kWarmup + 1]);
      }
    }
  }
}

TEST_F(ScheduleCliTest, FlagAgainstTheConfigsSchedulerSectionIsRefused) {
  const std::string config =
      PlainConfig(R"( "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}},)");
  CliRun r = Strata(Train("--steps 3 --config " + config + " --lr-scheduler cosine"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("the config's WarmupLR section decides the schedule, and --lr-scheduler "
                       "cosine asks for Hugging Face's"),
            std::string::npos)
      << r.out;
  // The same section with --warmup-steps: its "auto" answered as before, no refusal.
  const std::string log = dir_ + "/warmuplr.jsonl";
  r = Strata(Train("--steps 3 --config " + config + " --warmup-steps 2 --log-json " + log));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("lr schedule: WarmupLR"), std::string::npos) << r.out;
  // cosine_with_min_lr without its minimum, and --min-lr for another schedule.
  r = Strata(Train("--steps 3 --lr-scheduler cosine_with_min_lr"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("cosine_with_min_lr needs --min-lr or --min-lr-rate"), std::string::npos)
      << r.out;
  r = Strata(Train("--steps 3 --lr-scheduler linear --min-lr 1e-5"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--min-lr: for --lr-scheduler cosine_with_min_lr only"), std::string::npos)
      << r.out;
}

TEST_F(ScheduleCliTest, WarmupStepsAloneIsLinearAndSaysSo) {
  const std::string log = dir_ + "/alone.jsonl";
  CliRun r = Strata(Train("--steps 12 --lr 1e-3 --config " + PlainConfig() +
                          " --warmup-steps 3 --log-json " + log));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("lr schedule: linear (Hugging Face's default lr_scheduler_type"),
            std::string::npos)
      << r.out;
  const std::vector<double> rates = Rates(log, 1, kSteps);
  for (size_t i = 0; i < rates.size(); ++i) {
    EXPECT_DOUBLE_EQ(rates[i], kLr * Lambda("linear", static_cast<int>(i), kWarmup, kSteps))
        << "step " << i + 1;
  }
  // And without any schedule flag: the optimizer's lr at every step, as before.
  const std::string plain = dir_ + "/plain.jsonl";
  r = Strata(Train("--steps 3 --lr 1e-3 --config " + PlainConfig() + " --log-json " + plain));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("lr schedule: constant 0.001 (no scheduler)"), std::string::npos) << r.out;
  for (double lr : Rates(plain, 1, 3)) EXPECT_EQ(lr, kLr);
  // `strata estimate` runs no steps: the same flags are accepted (the run sizes the schedule).
  for (const std::string flags :
       {"--warmup-steps 3", "--lr-scheduler cosine", "--warmup-ratio 0.1"}) {
    CliRun e = Strata("estimate --model tiny --config " + PlainConfig() + " " + flags);
    EXPECT_EQ(e.rc, 0) << flags << "\n" << e.out;
  }
}

TEST_F(ScheduleCliTest, ResumedMidRunWithoutTheFlagsContinuesTheSchedule) {
  const std::string flags = "--lr-scheduler cosine_with_min_lr --warmup-steps 3 --min-lr 2e-4";
  const std::string straight = dir_ + "/straight.jsonl";
  CliRun r = Strata(Train("--steps 12 --lr 1e-3 " + flags + " --save " + dir_ +
                          "/a --save-every 6 --log-json " + straight));
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::vector<double> want = Rates(straight, 1, kSteps);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  for (int k = 0; k < kSteps; ++k) {
    EXPECT_DOUBLE_EQ(want[k], kLr * Lambda("cosine", k, kWarmup, kSteps, 0.2)) << "step " << k + 1;
  }

  const std::string resumed = dir_ + "/resumed.jsonl";
  r = Strata(Train("--steps 12 --resume " + dir_ + "/a/step-6 --log-json " + resumed));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("lr schedule: cosine_with_min_lr (strata.lr_scheduler"), std::string::npos)
      << r.out;
  const std::vector<double> got = Rates(resumed, 7, kSteps - 6);
  ASSERT_EQ(got.size(), static_cast<size_t>(kSteps - 6));
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i], want[6 + i]) << "step " << 7 + i;
  }

  // Resumed with a schedule that contradicts the one it was trained with: refused, naming both.
  r = Strata(Train("--steps 12 --resume " + dir_ + "/a/step-6 --lr-scheduler linear"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("strata.lr_scheduler.type: the config says \"cosine_with_min_lr\", "
                       "--lr-scheduler says \"linear\""),
            std::string::npos)
      << r.out;
}

}  // namespace
