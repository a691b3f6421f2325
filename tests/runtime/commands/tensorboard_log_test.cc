// `strata train --tensorboard`'s scalars of a step: Hugging Face's tags, strata's own, train/epoch
// only when the data has epochs, eval/* only after an evaluation; and the file they go to, decoded
// by tests/testing/tfevents_reader.h.
#include "runtime/commands/tensorboard_log.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tests/testing/cli_run.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tfevents_reader.h"

namespace strata::runtime {
namespace {

std::map<std::string, float> ByTag(const std::vector<metrics::Scalar>& scalars) {
  std::map<std::string, float> out;
  for (const metrics::Scalar& s : scalars) {
    EXPECT_EQ(out.count(s.tag), 0u) << s.tag << " twice";
    out[s.tag] = s.value;
  }
  return out;
}

StepReport Report() {
  StepReport r;
  r.step = 7;
  r.loss = 2.5;
  r.lr = 1e-4;
  r.grad_norm = 0.75;
  r.tokens_per_second = 1234.5;
  r.step_seconds = 0.25;
  r.nvme_read_bytes = uint64_t{3} << 30;
  r.nvme_written_bytes = uint64_t{5} << 20;
  return r;
}

TEST(TensorBoardLogTest, TrainTagsEveryStep) {
  const std::map<std::string, float> s = ByTag(TensorBoardScalars(Report()));
  const std::map<std::string, float> want = {{"train/loss", 2.5f},
                                             {"train/learning_rate", 1e-4f},
                                             {"train/grad_norm", 0.75f},
                                             {"train/tokens_per_second", 1234.5f},
                                             {"train/step_seconds", 0.25f},
                                             {"train/nvme_read_bytes", 3221225472.0f},
                                             {"train/nvme_written_bytes", 5242880.0f}};
  EXPECT_EQ(s, want);  // no train/epoch (no epochs), no eval/*
}

TEST(TensorBoardLogTest, EpochAndEvalWhenPresent) {
  StepReport r = Report();
  r.epoch = 1.5;
  r.eval = EvalReport{.loss = 3.0, .perplexity = std::exp(3.0)};
  const std::map<std::string, float> s = ByTag(TensorBoardScalars(r));
  EXPECT_EQ(s.size(), 10u);
  EXPECT_EQ(s.at("train/epoch"), 1.5f);
  EXPECT_EQ(s.at("eval/loss"), 3.0f);
  EXPECT_EQ(s.at("eval/perplexity"), static_cast<float>(std::exp(3.0)));
  EXPECT_EQ(s.at("train/loss"), 2.5f);
}

TEST(TensorBoardLogTest, WritesTheStepToANewFile) {
  testing::TempDir dir("strata-tb-log");
  ASSERT_TRUE(dir.ok());
  Result<std::unique_ptr<TensorBoardLog>> log = TensorBoardLog::Open(dir.File("runs/x"));
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  StepReport r = Report();
  r.eval = EvalReport{.loss = 3.0, .perplexity = std::exp(3.0)};
  ASSERT_TRUE((*log)->Write(r).ok());
  ASSERT_TRUE((*log)->Close().ok());
  std::vector<testing::TfEvent> events;
  ASSERT_EQ(testing::ReadTfEvents(testing::ReadFileOrEmpty((*log)->path()), &events), "");
  ASSERT_EQ(events.size(), 1u + 9u);
  std::map<std::string, float> seen;
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_EQ(events[i].step, 7);
    ASSERT_EQ(events[i].values.size(), 1u);
    seen[events[i].values[0].tag] = events[i].values[0].simple_value;
  }
  EXPECT_EQ(seen, ByTag(TensorBoardScalars(r)));

  Result<std::unique_ptr<TensorBoardLog>> bad = TensorBoardLog::Open("/proc/strata-tb-log-test");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--tensorboard /proc/strata-tb-log-test"),
            std::string::npos)
      << bad.status().ToString();
}

}  // namespace
}  // namespace strata::runtime
