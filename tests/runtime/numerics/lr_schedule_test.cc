#include "runtime/numerics/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "runtime/config/config.h"

namespace strata::runtime {
namespace {

std::unique_ptr<LrSchedule> Make(const std::string& type, nlohmann::json params,
                                 double optimizer_lr = 1e-3, bool has_betas = true) {
  SchedulerConfig c{type, std::move(params)};
  auto s = MakeLrSchedule(c, optimizer_lr, has_betas);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

std::string Error(const std::string& type, nlohmann::json params) {
  SchedulerConfig c{type, std::move(params)};
  auto s = MakeLrSchedule(c, 1e-3);
  EXPECT_FALSE(s.ok());
  return s.ok() ? "" : std::string(s.status().message());
}

TEST(LrScheduleTest, WarmupLrLog) {
  auto s =
      Make("WarmupLR", {{"warmup_min_lr", 0}, {"warmup_max_lr", 0.01}, {"warmup_num_steps", 10}});
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->name(), "WarmupLR");
  EXPECT_DOUBLE_EQ(s->LearningRate(0), 0.0);                           // constructor value (min)
  EXPECT_DOUBLE_EQ(s->LearningRate(1), 0.0);                           // log(1) = 0
  EXPECT_NEAR(s->LearningRate(2), 0.01 * 0.30102999566398120, 1e-15);  // log(2)/log(10)
  EXPECT_NEAR(s->LearningRate(5), 0.01 * 0.69897000433601886, 1e-15);  // log(5)/log(10)
  EXPECT_DOUBLE_EQ(s->LearningRate(10), 0.01);
  EXPECT_DOUBLE_EQ(s->LearningRate(11), 0.01);
  EXPECT_DOUBLE_EQ(s->LearningRate(100000), 0.01);
}

TEST(LrScheduleTest, WarmupLrLinearAndOptimizerLrDefault) {
  auto s = Make("WarmupLR",
                {{"warmup_min_lr", 0.001}, {"warmup_num_steps", 10}, {"warmup_type", "linear"}},
                /*optimizer_lr=*/0.011);
  ASSERT_NE(s, nullptr);
  EXPECT_DOUBLE_EQ(s->LearningRate(0), 0.001);
  EXPECT_DOUBLE_EQ(s->LearningRate(1), 0.001);
  EXPECT_NEAR(s->LearningRate(6), 0.001 + 0.01 * 0.5, 1e-15);
  EXPECT_NEAR(s->LearningRate(11), 0.011, 1e-15);
  EXPECT_NEAR(s->LearningRate(500), 0.011, 1e-15);
  // Default warmup_num_steps 1000, default max = optimizer lr.
  auto d = Make("WarmupLR", nlohmann::json::object(), 0.5);
  EXPECT_DOUBLE_EQ(d->LearningRate(0), 0.0);
  EXPECT_NEAR(d->LearningRate(1001), 0.5, 1e-15);
}

TEST(LrScheduleTest, WarmupDecayLr) {
  auto s = Make("WarmupDecayLR", {{"warmup_max_lr", 0.01},
                                  {"warmup_num_steps", 10},
                                  {"warmup_type", "linear"},
                                  {"total_num_steps", 20}});
  ASSERT_NE(s, nullptr);
  EXPECT_DOUBLE_EQ(s->LearningRate(0), 0.0);
  EXPECT_NEAR(s->LearningRate(6), 0.005, 1e-15);
  EXPECT_NEAR(s->LearningRate(11), 0.01, 1e-15);   // i = 10: (20-10)/10
  EXPECT_NEAR(s->LearningRate(16), 0.005, 1e-15);  // i = 15: 5/10
  EXPECT_DOUBLE_EQ(s->LearningRate(21), 0.0);
  EXPECT_DOUBLE_EQ(s->LearningRate(40), 0.0);  // clamped at 0
  // WarmupDecayLR's own default warmup_max_lr is 0.001 (not the optimizer's lr).
  auto d = Make("WarmupDecayLR", {{"total_num_steps", 5000}}, 0.5);
  EXPECT_NEAR(d->LearningRate(1001), 0.001, 1e-15);
}

TEST(LrScheduleTest, WarmupCosineLr) {
  auto s = Make("WarmupCosineLR",
                {{"total_num_steps", 20}, {"warmup_num_steps", 10}, {"warmup_type", "linear"}},
                /*optimizer_lr=*/0.1);
  ASSERT_NE(s, nullptr);
  EXPECT_DOUBLE_EQ(s->LearningRate(0), 0.0);  // DeepSpeed's constructor writes 0
  EXPECT_DOUBLE_EQ(s->LearningRate(1), 0.0);  // warmup_min_ratio 0
  EXPECT_NEAR(s->LearningRate(6), 0.05, 1e-15);
  // i = 10: progress 1/10: ratio = 1e-4 + (1 - 1e-4) * (1 + cos(0.1 pi)) / 2
  EXPECT_NEAR(s->LearningRate(11), 0.1 * (1e-4 + 0.9999 * 0.97552825814757677), 1e-15);
  EXPECT_NEAR(s->LearningRate(15), 0.1 * (1e-4 + 0.9999 * 0.5), 1e-15);  // progress 0.5
  EXPECT_NEAR(s->LearningRate(20), 0.1 * 1e-4, 1e-15);                   // end
  EXPECT_NEAR(s->LearningRate(100), 0.1 * 1e-4, 1e-15);                  // stays at the floor
}

TEST(LrScheduleTest, OneCycleCycleAndDecay) {
  auto s = Make("OneCycle", {{"cycle_min_lr", 0.01},
                             {"cycle_max_lr", 0.1},
                             {"cycle_first_step_size", 4},
                             {"decay_lr_rate", 0.5},
                             {"decay_step_size", 2}});
  ASSERT_NE(s, nullptr);
  EXPECT_DOUBLE_EQ(s->LearningRate(0), 0.01);
  EXPECT_NEAR(s->LearningRate(1), 0.01 + 0.09 * 0.25, 1e-15);
  EXPECT_NEAR(s->LearningRate(4), 0.1, 1e-15);          // peak
  EXPECT_NEAR(s->LearningRate(6), 0.055, 1e-15);        // half-way down
  EXPECT_NEAR(s->LearningRate(8), 0.01, 1e-15);         // end of cycle
  EXPECT_NEAR(s->LearningRate(10), 0.01 / 1.5, 1e-15);  // decay: 2 steps past, 1 interval
  EXPECT_NEAR(s->LearningRate(12), 0.01 / 2.0, 1e-15);
  // Momentum: (min_mom, 0.99) at construction, inverse to lr in the cycle, max after.
  EXPECT_EQ(s->Betas(0), std::make_pair(0.8, 0.99));
  EXPECT_NEAR(s->Betas(2)->first, 0.85, 1e-15);
  EXPECT_NEAR(s->Betas(4)->first, 0.8, 1e-15);
  EXPECT_EQ(s->Betas(20), std::make_pair(0.9, 0.99));  // decay_mom_rate 0: stays at max
}

TEST(LrScheduleTest, OneCycleStairsAndNoDecay) {
  auto s = Make("OneCycle", {{"cycle_min_lr", 0.01},
                             {"cycle_max_lr", 0.1},
                             {"cycle_first_step_size", 4},
                             {"cycle_first_stair_count", 2}});
  ASSERT_NE(s, nullptr);
  EXPECT_NEAR(s->LearningRate(1), 0.01, 1e-15);   // stair 0
  EXPECT_NEAR(s->LearningRate(2), 0.055, 1e-15);  // stair 1 of 2
  EXPECT_NEAR(s->LearningRate(3), 0.055, 1e-15);
  EXPECT_NEAR(s->LearningRate(4), 0.1, 1e-15);
  EXPECT_NEAR(s->LearningRate(5), 0.055, 1e-15);  // (8-5)*2/4 = 1.5 -> 1
  EXPECT_NEAR(s->LearningRate(50), 0.01, 1e-15);  // no decay configured
  // Adagrad (no betas): no momentum cycling.
  auto a = Make("OneCycle", {{"cycle_min_lr", 0.01}, {"cycle_max_lr", 0.1}}, 1e-3, false);
  EXPECT_FALSE(a->Betas(3).has_value());
}

TEST(LrScheduleTest, LrRangeTest) {
  auto c = Make("LRRangeTest", {{"lr_range_test_min_lr", 0.01},
                                {"lr_range_test_step_size", 10},
                                {"lr_range_test_step_rate", 2}});
  ASSERT_NE(c, nullptr);
  EXPECT_DOUBLE_EQ(c->LearningRate(0), 0.01);
  EXPECT_NEAR(c->LearningRate(5), 0.02, 1e-15);
  EXPECT_NEAR(c->LearningRate(10), 0.03, 1e-15);
  auto s = Make("LRRangeTest", {{"lr_range_test_min_lr", 0.01},
                                {"lr_range_test_step_size", 10},
                                {"lr_range_test_step_rate", 2},
                                {"lr_range_test_staircase", true}});
  EXPECT_DOUBLE_EQ(s->LearningRate(5), 0.01);
  EXPECT_DOUBLE_EQ(s->LearningRate(9), 0.01);
  EXPECT_NEAR(s->LearningRate(10), 0.03, 1e-15);
  EXPECT_NEAR(s->LearningRate(19), 0.03, 1e-15);
  EXPECT_NEAR(s->LearningRate(20), 0.05, 1e-15);
}

TEST(LrScheduleTest, Errors) {
  std::string e = Error("WarmupLR", {{"warmup_num_step", 10}});
  EXPECT_NE(e.find("scheduler.params.warmup_num_step: unknown key"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean \"warmup_num_steps\""), std::string::npos) << e;
  e = Error("WarmupLr", nlohmann::json::object());
  EXPECT_NE(e.find("did you mean \"WarmupLR\""), std::string::npos) << e;
  e = Error("WarmupDecayLR", nlohmann::json::object());
  EXPECT_NE(e.find("scheduler.params.total_num_steps: required"), std::string::npos) << e;
  e = Error("OneCycle", {{"cycle_max_lr", 0.1}});
  EXPECT_NE(e.find("cycle_min_lr: required"), std::string::npos) << e;
  e = Error("WarmupLR", {{"warmup_type", "cosine"}});
  EXPECT_NE(e.find("expected \"log\" or \"linear\""), std::string::npos) << e;
  e = Error("WarmupLR", {{"warmup_num_steps", -1}});
  EXPECT_NE(e.find("warmup_num_steps: expected an integer >= 0, got -1"), std::string::npos) << e;
  e = Error("LRRangeTest", {{"lr_range_test_step_size", "ten"}});
  EXPECT_NE(e.find("lr_range_test_step_size"), std::string::npos) << e;
}

// Hugging Face's schedules (transformers/optimization.py), each lambda written out here on its
// own: warmup k/w, then the decay over the remaining T - w steps. The step after k applied steps
// runs at base × lambda(k) (LambdaLR stepped after each optimizer step).
double Warmup(int64_t k, int64_t w) { return static_cast<double>(k) / static_cast<double>(w); }
double Remaining(int64_t k, int64_t w, int64_t t) {  // progress through the decay, in [0, 1+]
  return static_cast<double>(k - w) / static_cast<double>(t - w > 0 ? t - w : 1);
}
double LinearLambda(int64_t k, int64_t w, int64_t t) {
  if (k < w) return Warmup(k, w);
  const double left = static_cast<double>(t - k) / static_cast<double>(t - w > 0 ? t - w : 1);
  return left > 0 ? left : 0.0;
}
double CosineLambda(int64_t k, int64_t w, int64_t t, double floor_rate) {
  if (k < w) return Warmup(k, w);
  const double half_cosine = (1.0 + std::cos(std::numbers::pi * Remaining(k, w, t))) / 2.0;
  const double v = floor_rate + (1.0 - floor_rate) * half_cosine;
  return v > 0 ? v : 0.0;
}
double ConstantWithWarmupLambda(int64_t k, int64_t w) { return k < w ? Warmup(k, w) : 1.0; }

struct HfCase {
  int64_t warmup, total;
};
constexpr HfCase kHfCases[] = {{3, 12}, {0, 12}, {12, 12}, {1, 5}, {4, 5}};

std::unique_ptr<LrSchedule> MakeHf(const std::string& type, const HfCase& c, double lr,
                                   nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json p = {{"num_warmup_steps", c.warmup}, {"num_training_steps", c.total}};
  if (type == "constant") p = nlohmann::json::object();
  if (type == "constant_with_warmup") p.erase("num_training_steps");
  p.update(extra);
  return Make(type, p, lr);
}

TEST(LrScheduleTest, HuggingFaceLinearAtEveryStep) {
  const double lr = 2e-3;
  for (const HfCase& c : kHfCases) {
    auto s = MakeHf("linear", c, lr);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->name(), "linear");
    for (int64_t k = 0; k <= c.total + 2; ++k) {
      EXPECT_DOUBLE_EQ(s->LearningRate(k), lr * LinearLambda(k, c.warmup, c.total))
          << "warmup " << c.warmup << " total " << c.total << " k " << k;
    }
    // The boundaries themselves: 0 first (when warming up), the peak right after the warmup,
    // 0 at the end.
    if (c.warmup > 0) {
      EXPECT_EQ(s->LearningRate(0), 0.0);
    }
    if (c.warmup < c.total) {
      EXPECT_DOUBLE_EQ(s->LearningRate(c.warmup), lr);
    }
    EXPECT_EQ(s->LearningRate(c.total), 0.0);
  }
}

TEST(LrScheduleTest, HuggingFaceCosineAtEveryStep) {
  const double lr = 3e-4;
  for (const HfCase& c : kHfCases) {
    auto s = MakeHf("cosine", c, lr);
    ASSERT_NE(s, nullptr);
    for (int64_t k = 0; k <= c.total; ++k) {
      EXPECT_DOUBLE_EQ(s->LearningRate(k), lr * CosineLambda(k, c.warmup, c.total, 0.0))
          << "warmup " << c.warmup << " total " << c.total << " k " << k;
    }
    EXPECT_DOUBLE_EQ(s->LearningRate(c.warmup), lr);
  }
  // num_cycles 1: a whole wave, at 0 half way and back at the peak at the end.
  auto s =
      Make("cosine", {{"num_warmup_steps", 0}, {"num_training_steps", 8}, {"num_cycles", 1}}, 1.0);
  EXPECT_DOUBLE_EQ(s->LearningRate(4), 0.0);
  EXPECT_DOUBLE_EQ(s->LearningRate(8), 1.0);
}

TEST(LrScheduleTest, HuggingFaceCosineWithMinLrAtEveryStep) {
  const double lr = 1e-3;
  for (const HfCase& c : kHfCases) {
    auto by_rate = MakeHf("cosine_with_min_lr", c, lr, {{"min_lr_rate", 0.1}});
    auto by_lr = MakeHf("cosine_with_min_lr", c, lr, {{"min_lr", 2.5e-4}});
    ASSERT_NE(by_rate, nullptr);
    ASSERT_NE(by_lr, nullptr);
    for (int64_t k = 0; k <= c.total; ++k) {
      EXPECT_DOUBLE_EQ(by_rate->LearningRate(k), lr * CosineLambda(k, c.warmup, c.total, 0.1))
          << "warmup " << c.warmup << " total " << c.total << " k " << k;
      EXPECT_DOUBLE_EQ(by_lr->LearningRate(k), lr * CosineLambda(k, c.warmup, c.total, 0.25))
          << "warmup " << c.warmup << " total " << c.total << " k " << k;
    }
    if (c.warmup < c.total) {  // ends at the minimum (warmup == total: the peak, no decay)
      EXPECT_DOUBLE_EQ(by_rate->LearningRate(c.total), 1e-4);
      EXPECT_DOUBLE_EQ(by_lr->LearningRate(c.total), 2.5e-4);
    }
  }
}

TEST(LrScheduleTest, HuggingFaceConstantsAtEveryStep) {
  const double lr = 5e-5;
  for (const HfCase& c : kHfCases) {
    auto with = MakeHf("constant_with_warmup", c, lr);
    auto constant = MakeHf("constant", c, lr);
    ASSERT_NE(with, nullptr);
    ASSERT_NE(constant, nullptr);
    for (int64_t k = 0; k <= c.total + 3; ++k) {
      EXPECT_DOUBLE_EQ(with->LearningRate(k), lr * ConstantWithWarmupLambda(k, c.warmup)) << k;
      EXPECT_EQ(constant->LearningRate(k), lr) << k;
    }
  }
}

TEST(LrScheduleTest, HuggingFaceErrors) {
  std::string e = Error("cosine_with_min_lr", {{"num_warmup_steps", 1}, {"num_training_steps", 4}});
  EXPECT_NE(e.find("exactly one of min_lr and min_lr_rate"), std::string::npos) << e;
  e = Error(
      "cosine_with_min_lr",
      {{"num_warmup_steps", 1}, {"num_training_steps", 4}, {"min_lr", 1e-5}, {"min_lr_rate", 0.1}});
  EXPECT_NE(e.find("exactly one of min_lr and min_lr_rate"), std::string::npos) << e;
  e = Error("linear", {{"num_warmup_steps", 1}});
  EXPECT_NE(e.find("scheduler.params.num_training_steps: required"), std::string::npos) << e;
  e = Error("cosine", {{"num_warmup_steps", 1}, {"num_training_steps", 4}, {"min_lr", 0.1}});
  EXPECT_NE(e.find("scheduler.params.min_lr: unknown key"), std::string::npos) << e;
  e = Error("constant", {{"num_warmup_steps", 1}});
  EXPECT_NE(e.find("num_warmup_steps: unknown key"), std::string::npos) << e;
  e = Error("cosin", nlohmann::json::object());
  EXPECT_NE(e.find("did you mean \"cosine\""), std::string::npos) << e;
}

TEST(LrScheduleTest, DescribeNamesTheSchedule) {
  SchedulerConfig c{"cosine", {{"num_warmup_steps", 10}, {"num_training_steps", 100}}};
  EXPECT_EQ(DescribeLrSchedule(c, 3e-4), "cosine, 10 warmup steps of 100, peak 0.0003");
  c.origin = "--lr-scheduler";
  EXPECT_EQ(DescribeLrSchedule(c, 3e-4),
            "cosine (--lr-scheduler), 10 warmup steps of 100, peak 0.0003");
  EXPECT_EQ(DescribeLrSchedule(std::nullopt, 5e-5), "constant 5e-05 (no scheduler)");
}

}  // namespace
}  // namespace strata::runtime
