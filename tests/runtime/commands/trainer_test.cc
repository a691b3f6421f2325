// Trainer (runtime/commands/trainer.h): the step loop of `strata train` without its rendering.
// Runs the tiny preset with parameters and optimizer state on NVMe in a temporary directory.
#include "runtime/commands/trainer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "tests/testing/scoped_env.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    std::ofstream data(dir_ + "/data.txt");
    for (int i = 0; i < 400; ++i)
      data << "The quick brown fox " << i << " jumps over the lazy dog.\n";
    WriteConfig("ds.json", "", "");
  }
  // A ZeRO-3 config with both offloads on NVMe under dir_/nvme; `zero_extra` and `param_extra` are
  // spliced into zero_optimization and offload_param.
  void WriteConfig(const std::string& name, const std::string& zero_extra,
                   const std::string& param_extra) {
    std::ofstream(dir_ + "/" + name)
        << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100)"
        << zero_extra << R"(,
        "offload_param": {"device": "nvme", "nvme_path": ")"
        << dir_ << R"(/nvme")" << param_extra << R"(},
        "offload_optimizer": {"device": "nvme", "nvme_path": ")"
        << dir_ << R"(/nvme"}}})";
  }

  TrainerOptions Options(int64_t steps) const {
    TrainerOptions o;
    o.model = "tiny";
    o.config = dir_ + "/ds.json";
    o.data = dir_ + "/data.txt";
    o.steps = steps;
    o.threads = 1;
    return o;
  }

  std::vector<StepReport> RunAll(Trainer& t, RunSummary* summary,
                                 const std::atomic<bool>* stop = nullptr) {
    std::vector<StepReport> reports;
    Result<RunSummary> s = t.Run([&](const StepReport& r) { reports.push_back(r); }, stop);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) *summary = *s;
    return reports;
  }

  testing::TempDir tmp_{"strata-trainer-test"};
  const std::string dir_ = tmp_.path();
};

TEST_F(TrainerTest, ReportsEveryStep) {
  Result<std::unique_ptr<Trainer>> t = Trainer::Create(Options(3));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  RunSummary summary;
  const std::vector<StepReport> reports = RunAll(**t, &summary);
  ASSERT_EQ(reports.size(), 3u);
  for (size_t i = 0; i < reports.size(); ++i) {
    const StepReport& r = reports[i];
    EXPECT_EQ(r.step, static_cast<int64_t>(i) + 1);
    EXPECT_EQ(r.steps, 3);
    EXPECT_TRUE(std::isfinite(r.loss)) << r.loss;
    EXPECT_GT(r.loss, 0);
    EXPECT_TRUE(std::isfinite(r.grad_norm));
    EXPECT_GT(r.grad_norm, 0);
    EXPECT_EQ(r.tokens, 2.0 * 2 * 64);  // micro-batch x accumulation x the preset's seq_len
    EXPECT_GT(r.tokens_per_second, 0);
    EXPECT_GE(r.step_seconds, r.forward_seconds + r.backward_seconds);
    EXPECT_GT(r.nvme_written_bytes, 0u);  // state lives on NVMe: every step writes it back
    EXPECT_GT(r.pinned_capacity_bytes, 0u);
  }
  EXPECT_EQ(summary.step, 3);
  EXPECT_FALSE(summary.interrupted);
  EXPECT_EQ(summary.first_loss, reports[0].loss);
  EXPECT_NE(reports[0].loss, reports[2].loss);  // it trains
  EXPECT_EQ((*t)->step(), 3);
}

TEST_F(TrainerTest, StopFlagEndsTheRunBetweenSteps) {
  Result<std::unique_ptr<Trainer>> t = Trainer::Create(Options(50));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::atomic<bool> stop{false};
  int seen = 0;
  Result<RunSummary> s = (*t)->Run(
      [&](const StepReport& r) {
        ++seen;
        if (r.step == 2) stop.store(true);
      },
      &stop);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(seen, 2);
  EXPECT_EQ(s->step, 2);
  EXPECT_TRUE(s->interrupted);
}

TEST_F(TrainerTest, ResumedRunReportsTheSameLosses) {
  RunSummary summary;
  std::vector<StepReport> straight;
  {
    auto t = Trainer::Create(Options(4));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    straight = RunAll(**t, &summary);
  }
  TrainerOptions first = Options(2);
  first.save = dir_ + "/ckpt";
  {
    auto t = Trainer::Create(first);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    RunAll(**t, &summary);
    ASSERT_TRUE((*t)->Save().ok());
  }
  TrainerOptions second = Options(4);
  second.resume = dir_ + "/ckpt";
  auto t = Trainer::Create(second);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->step(), 2);
  const std::vector<StepReport> resumed = RunAll(**t, &summary);
  ASSERT_EQ(straight.size(), 4u);
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_EQ(resumed[0].step, 3);
  EXPECT_EQ(resumed[0].loss, straight[2].loss);  // bitwise
  EXPECT_EQ(resumed[1].loss, straight[3].loss);
}

TEST_F(TrainerTest, BadOptionsAreRefusedBeforeTraining) {
  TrainerOptions o = Options(-1);  // 0 is allowed: a model loaded for export or evaluation
  EXPECT_EQ(Trainer::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = Options(1);
  o.data = dir_ + "/missing.txt";
  EXPECT_EQ(Trainer::Create(o).status().code(), StatusCode::kNotFound);
  o = Options(1);
  o.trace = dir_ + "/trace.json";
  o.trace_steps = "3-x";
  EXPECT_EQ(Trainer::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.trace_steps = "4-2";
  EXPECT_EQ(Trainer::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = Options(1);
  o.model = "no-such-preset";
  EXPECT_FALSE(Trainer::Create(o).ok());
}

// An NVMe read that fails inside the model's forward (a unit's gather) comes out of Run as the
// I/O error it was, not as an exception or an internal error. With two pinned slots for four
// units and small sub-groups (a small pinned arena), the first forward reads parameters from NVMe.
TEST_F(TrainerTest, ForwardReadErrorKeepsItsCode) {
  WriteConfig("ds.json", R"(, "sub_group_size": 20000)", R"(, "buffer_count": 2)");
  TrainerOptions o = Options(2);
  o.model = "small";
  testing::ScopedEnv faults("STRATA_IO_FAULTS", "eio:read:1");
  Result<std::unique_ptr<Trainer>> t = Trainer::Create(o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  int steps = 0;
  Result<RunSummary> s = (*t)->Run([&](const StepReport&) { ++steps; }, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kIoError) << s.status().ToString();
  EXPECT_EQ(s.status().sys_errno(), 5);
  EXPECT_NE(s.status().message().find("[injected]"), std::string_view::npos);
  EXPECT_NE(s.status().message().find("param/"), std::string_view::npos);
  EXPECT_EQ(steps, 0);
}

}  // namespace
}  // namespace strata::runtime
