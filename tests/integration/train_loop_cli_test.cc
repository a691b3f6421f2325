// `strata train`'s run loop as Hugging Face Trainer users expect it, through the binary:
// evaluation during training (--eval-data, --eval-every N|epoch, --eval-max-batches) equal to
// `strata eval` on the same checkpoint, --epochs (the step count derived from the data and the
// global batch), --save-every epoch, --save-total-limit, and --save-best (the checkpoint with the
// lowest eval loss kept whatever the limit prunes, across a resume), and the flags' refusals.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/testing/cli_run.h"

namespace {

using strata::testing::CliRun;
using strata::testing::ReadFileOrEmpty;
using strata::testing::Strata;

nlohmann::json ReadJson(const std::string& path) {
  return nlohmann::json::parse(ReadFileOrEmpty(path), nullptr, /*allow_exceptions=*/false);
}

// The checkpoint tags in a --save directory ("step-N"), sorted by step.
std::vector<int> SavedSteps(const std::string& dir) {
  std::vector<int> steps;
  if (!std::filesystem::exists(dir)) return steps;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step-", 0) == 0) steps.push_back(std::stoi(name.substr(5)));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

class TrainLoopCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-loop-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream train(dir_ + "/train.txt");
    for (int i = 0; i < 300; ++i)
      train << "The quick brown fox " << i << " jumps over the lazy dog.\n";
    train.close();
    // Epoch tests read a shorter text (fewer steps per epoch).
    std::ofstream small(dir_ + "/small.txt");
    for (int i = 0; i < 60; ++i)
      small << "The quick brown fox " << i << " jumps over the lazy dog.\n";
    small.close();
    small_bytes_ = std::filesystem::file_size(dir_ + "/small.txt");
    std::ofstream eval(dir_ + "/eval.txt");
    for (int i = 0; i < 60; ++i) eval << "A lazy dog " << i << " sleeps in the sun.\n";
    // A large learning rate, so that the eval loss on a different text goes up and down.
    std::ofstream cfg(dir_ + "/ds.json");
    cfg << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": "auto",
      "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 0.03}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100,
        "offload_param": {"device": "nvme", "nvme_path": ")"
        << dir_ << R"(/nvme"},
        "offload_optimizer": {"device": "nvme", "nvme_path": ")"
        << dir_ << R"(/nvme"}}})";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Common(const std::string& data = "train.txt") const {
    return "train --model tiny --config " + dir_ + "/ds.json --data " + dir_ + "/" + data +
           " --threads 1 --quiet";
  }
  // The tiny GPT preset reads windows of 64 + 1 bytes: an epoch of small.txt is this many samples.
  uint64_t WindowsPerEpoch() const { return small_bytes_ / 65; }

  std::string dir_;
  uint64_t small_bytes_ = 0;
};

TEST_F(TrainLoopCliTest, EvalDuringTrainingEqualsStrataEvalOnTheCheckpoint) {
  CliRun run = Strata(Common() + " --steps 5 --eval-data " + dir_ + "/eval.txt --eval-every 2 " +
                      "--save " + dir_ + "/ck");
  ASSERT_EQ(run.rc, 0) << run.out;
  const nlohmann::json t = ReadJson(dir_ + "/ck/step-5/trainer.json");
  ASSERT_TRUE(t.contains("eval")) << t;
  EXPECT_EQ(t["eval"]["step"], 5);
  const double during = t["eval"]["loss"].get<double>();
  EXPECT_NEAR(t["eval"]["perplexity"].get<double>(), std::exp(during), 1e-9 * std::exp(during));

  // The same weights evaluated by `strata eval` (its own process, no offload): the same loss.
  CliRun eval = Strata("eval --model tiny --resume " + dir_ + "/ck --data " + dir_ +
                       "/eval.txt --seq-len 64 --micro-batch 2 --threads 1 --json");
  ASSERT_EQ(eval.rc, 0) << eval.out;
  const nlohmann::json e =
      nlohmann::json::parse(eval.out.substr(eval.out.find('{')), nullptr, false);
  ASSERT_TRUE(e.is_object()) << eval.out;
  EXPECT_DOUBLE_EQ(e["loss"].get<double>(), during);

  // --eval-max-batches limits what is read: a different (partial) loss.
  CliRun limited = Strata(Common() + " --steps 5 --eval-data " + dir_ +
                          "/eval.txt --eval-max-batches 1 --save " + dir_ + "/ck1");
  ASSERT_EQ(limited.rc, 0) << limited.out;
  const nlohmann::json t1 = ReadJson(dir_ + "/ck1/step-5/trainer.json");
  CliRun eval1 = Strata("eval --model tiny --resume " + dir_ + "/ck1 --data " + dir_ +
                        "/eval.txt --seq-len 64 --micro-batch 2 --max-batches 1 --threads 1 "
                        "--json");
  ASSERT_EQ(eval1.rc, 0) << eval1.out;
  const nlohmann::json e1 =
      nlohmann::json::parse(eval1.out.substr(eval1.out.find('{')), nullptr, false);
  EXPECT_DOUBLE_EQ(e1["loss"].get<double>(), t1["eval"]["loss"].get<double>());
  EXPECT_NE(t1["eval"]["loss"].get<double>(), during);
}

TEST_F(TrainLoopCliTest, SaveBestKeepsTheLowestEvalLossWhateverTheLimitPrunes) {
  const std::string eval = " --eval-data " + dir_ + "/eval.txt --eval-every 1 --eval-max-batches 4";
  const int steps = 10;
  // Reference: every step saved and kept, so each checkpoint records that step's eval loss.
  CliRun all = Strata(Common() + " --steps " + std::to_string(steps) + eval +
                      " --save-every 1 --save-total-limit 100 --save " + dir_ + "/all");
  ASSERT_EQ(all.rc, 0) << all.out;
  ASSERT_EQ(SavedSteps(dir_ + "/all").size(), static_cast<size_t>(steps));
  int best_step = 0;
  double best_loss = std::numeric_limits<double>::infinity();
  std::vector<int> improved;  // the steps --save-best saves at (and the last)
  for (int step = 1; step <= steps; ++step) {
    const nlohmann::json t = ReadJson(dir_ + "/all/step-" + std::to_string(step) + "/trainer.json");
    ASSERT_EQ(t["eval"]["step"], step) << t;
    const double loss = t["eval"]["loss"].get<double>();
    if (loss < best_loss) {  // strictly lower, as HF's Trainer: the first of equal losses
      best_loss = loss;
      best_step = step;
      improved.push_back(step);
    }
  }
  // This data and learning rate make the eval loss rise at the end: the best is not the last.
  ASSERT_LT(best_step, steps) << "the eval loss fell at every step: the test shows nothing";
  improved.push_back(steps);

  for (int limit : {1, 3}) {
    SCOPED_TRACE("--save-total-limit " + std::to_string(limit));
    const std::string ck = dir_ + "/best" + std::to_string(limit);
    CliRun run =
        Strata(Common() + " --steps " + std::to_string(steps) + eval +
               " --save-best --save-total-limit " + std::to_string(limit) + " --save " + ck);
    ASSERT_EQ(run.rc, 0) << run.out;
    EXPECT_NE(run.out.find("best checkpoint: " + ck + "/step-" + std::to_string(best_step)),
              std::string::npos)
        << run.out;
    // The best and the newest of the others, the best counting towards the limit (HF's Trainer;
    // a limit of 1 still keeps the newest, to resume from).
    std::set<int> expected = {best_step};
    const size_t others = limit > 1 ? limit - 1 : 1;
    for (auto it = improved.rbegin(); it != improved.rend() && expected.size() < others + 1; ++it) {
      expected.insert(*it);
    }
    const std::vector<int> saved = SavedSteps(ck);
    EXPECT_EQ(std::set<int>(saved.begin(), saved.end()), expected);
    const nlohmann::json t = ReadJson(ck + "/step-" + std::to_string(steps) + "/trainer.json");
    EXPECT_EQ(t["best"]["step"], best_step) << t;
    EXPECT_EQ(t["best"]["tag"], "step-" + std::to_string(best_step)) << t;
    EXPECT_DOUBLE_EQ(t["best"]["eval_loss"].get<double>(), best_loss);
  }

  // Resumed after the best step, the run keeps comparing against it: a later, worse evaluation
  // does not replace it, and it is not pruned.
  const std::string ck = dir_ + "/resumed";
  CliRun first = Strata(Common() + " --steps " + std::to_string(best_step + 1) + eval +
                        " --save-best --save-total-limit 1 --save " + ck);
  ASSERT_EQ(first.rc, 0) << first.out;
  CliRun second = Strata(Common() + " --steps " + std::to_string(steps) + eval +
                         " --save-best --save-total-limit 1 --save " + ck + " --resume " + ck);
  ASSERT_EQ(second.rc, 0) << second.out;
  const nlohmann::json t = ReadJson(ck + "/step-" + std::to_string(steps) + "/trainer.json");
  EXPECT_EQ(t["best"]["step"], best_step) << t;
  EXPECT_EQ(SavedSteps(ck), (std::vector<int>{best_step, steps}));
}

TEST_F(TrainLoopCliTest, SaveTotalLimitKeepsTheNewest) {
  CliRun run =
      Strata(Common() + " --steps 6 --save-every 1 --save-total-limit 3 --save " + dir_ + "/ck");
  ASSERT_EQ(run.rc, 0) << run.out;
  EXPECT_EQ(SavedSteps(dir_ + "/ck"), (std::vector<int>{4, 5, 6}));
  CliRun one =
      Strata(Common() + " --steps 4 --save-every 1 --save-total-limit 1 --save " + dir_ + "/ck1");
  ASSERT_EQ(one.rc, 0) << one.out;
  EXPECT_EQ(SavedSteps(dir_ + "/ck1"), (std::vector<int>{4}));
}

TEST_F(TrainLoopCliTest, EpochsDeriveTheStepsFromTheDataAndTheGlobalBatch) {
  const uint64_t windows = WindowsPerEpoch();
  const uint64_t global_batch = 2 * 2;  // micro-batch 2 x accumulation 2
  const uint64_t steps = (2 * windows + global_batch - 1) / global_batch;
  CliRun run = Strata(Common("small.txt") + " --grad-accum 2 --epochs 2 --save " + dir_ + "/ck");
  ASSERT_EQ(run.rc, 0) << run.out;
  EXPECT_NE(run.out.find("-> " + std::to_string(steps) + " steps"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find(std::to_string(windows) + " samples"), std::string::npos) << run.out;
  const nlohmann::json t = ReadJson(dir_ + "/ck/step-" + std::to_string(steps) + "/trainer.json");
  ASSERT_TRUE(t.is_object()) << run.out;
  // Every sample of both epochs was consumed (the last step's spare rows from the third).
  EXPECT_EQ(t["samples"].get<uint64_t>(), steps * global_batch);
  EXPECT_GE(t["samples"].get<uint64_t>(), 2 * windows);
  EXPECT_LT(t["samples"].get<uint64_t>(), 2 * windows + global_batch);

  // The same run as --steps: the same losses ("auto" total_num_steps follows the derived count).
  const std::string with_epochs = ReadFileOrEmpty(dir_ + "/ck/model.safetensors");
  CliRun by_steps = Strata(Common("small.txt") + " --grad-accum 2 --steps " +
                           std::to_string(steps) + " --save " + dir_ + "/ck2");
  ASSERT_EQ(by_steps.rc, 0) << by_steps.out;
  EXPECT_FALSE(with_epochs.empty());
  EXPECT_EQ(ReadFileOrEmpty(dir_ + "/ck2/model.safetensors"), with_epochs);
}

TEST_F(TrainLoopCliTest, EveryEpochSavesAndEvaluatesWhenAnEpochCompletes) {
  // Micro-batch 2 x accumulation 3 = 6 samples per step, so epochs end inside steps.
  const uint64_t windows = WindowsPerEpoch();
  const uint64_t global_batch = 6;
  const uint64_t steps = (3 * windows + global_batch - 1) / global_batch;
  CliRun run =
      Strata(Common("small.txt") + " --grad-accum 3 --epochs 3 --save-every epoch --eval-every " +
             "epoch --eval-data " + dir_ + "/eval.txt --eval-max-batches 2 " +
             "--save-total-limit 100 --save " + dir_ + "/ck");
  ASSERT_EQ(run.rc, 0) << run.out;
  std::vector<int> expected;
  for (uint64_t s = 1; s <= steps; ++s) {
    if ((s * global_batch) / windows > ((s - 1) * global_batch) / windows || s == steps) {
      expected.push_back(static_cast<int>(s));
    }
  }
  EXPECT_EQ(SavedSteps(dir_ + "/ck"), expected);
  for (int s : expected) {
    const nlohmann::json t = ReadJson(dir_ + "/ck/step-" + std::to_string(s) + "/trainer.json");
    EXPECT_EQ(t["eval"]["step"], s) << t;
  }
}

// An evaluation that cannot be computed (here: its only batch holds no completion token of the
// SFT eval records) is said and skipped; training goes on and saves. Later evaluations that can
// be computed are recorded.
TEST_F(TrainLoopCliTest, AnEvaluationThatFailsIsSkippedNotFatal) {
  std::ofstream records(dir_ + "/eval.jsonl");
  auto ids = [](int n, int base) {
    std::string out = "[";
    for (int i = 0; i < n; ++i) out += (i ? "," : "") + std::to_string(base + i % 50);
    return out + "]";
  };
  // Micro-batch 2: the first batch is two records whose prompts fill the window (truncated at
  // 64 + 1 tokens, no completion left); the rest have completions.
  for (int r = 0; r < 2; ++r) {
    records << R"({"prompt_ids": )" << ids(80, 40) << R"(, "completion_ids": )" << ids(5, 60)
            << "}\n";
  }
  for (int r = 0; r < 4; ++r) {
    records << R"({"prompt_ids": )" << ids(10, 40) << R"(, "completion_ids": )" << ids(8, 70)
            << "}\n";
  }
  records.close();
  CliRun one = Strata(Common() + " --steps 3 --eval-data " + dir_ +
                      "/eval.jsonl --eval-max-batches 1 --save " + dir_ + "/ck");
  EXPECT_EQ(one.rc, 0) << one.out;
  EXPECT_NE(one.out.find("training goes on without it"), std::string::npos) << one.out;
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/ck/step-3")) << one.out;
  CliRun all =
      Strata(Common() + " --steps 3 --eval-data " + dir_ + "/eval.jsonl --save " + dir_ + "/ck2");
  ASSERT_EQ(all.rc, 0) << all.out;
  EXPECT_EQ(all.out.find("training goes on without it"), std::string::npos) << all.out;
  EXPECT_EQ(ReadJson(dir_ + "/ck2/step-3/trainer.json")["eval"]["step"], 3);
}

TEST_F(TrainLoopCliTest, InconsistentFlagsAreRefused) {
  struct Case {
    std::string flags;
    std::string message;
  };
  const std::string eval = " --eval-data " + dir_ + "/eval.txt";
  for (const Case& c : std::vector<Case>{
           {"--save-best" + eval, "--save-best"},
           {"--save-best --save " + dir_ + "/ck", "--save-best"},
           {"--eval-every 3", "--eval-every 3 without --eval-data"},
           {"--eval-max-batches 2", "--eval-max-batches without --eval-data"},
           {"--steps 3 --epochs 2", "--epochs"},
           {"--save-every epo --save " + dir_ + "/ck", "epo"},
           {"--eval-every 0" + eval, "--eval-every"},
           {"--save-total-limit 0 --save " + dir_ + "/ck", "--save-total-limit"},
           {"--epochs 1 --resume " + dir_ + "/nothing", "--resume"},
       }) {
    CliRun run = Strata(Common() + " " + c.flags);
    EXPECT_EQ(run.rc, 2) << c.flags << "\n" << run.out;
    EXPECT_NE(run.out.find(c.message), std::string::npos) << c.flags << "\n" << run.out;
  }
  // Resumed at the end of its epochs: nothing to train, said with the derived count.
  CliRun done = Strata(Common() + " --epochs 0.05 --save " + dir_ + "/ck");
  ASSERT_EQ(done.rc, 0) << done.out;
  CliRun again = Strata(Common() + " --epochs 0.05 --resume " + dir_ + "/ck");
  EXPECT_EQ(again.rc, 2) << again.out;
  EXPECT_NE(again.out.find("steps of --epochs"), std::string::npos) << again.out;
}

}  // namespace
