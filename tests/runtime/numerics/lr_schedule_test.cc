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

}  // namespace
}  // namespace strata::runtime
