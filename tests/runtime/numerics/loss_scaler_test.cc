#include "runtime/numerics/loss_scaler.h"

#include <gtest/gtest.h>

namespace strata::runtime {
namespace {

Fp16Config Dynamic(int power, int window, int hysteresis, bool consecutive = false,
                   double min_scale = 1) {
  Fp16Config c;
  c.enabled = true;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.consecutive_hysteresis = consecutive;
  c.min_loss_scale = min_scale;
  return c;
}

TEST(LossScalerTest, DefaultsAreDeepSpeeds) {
  Fp16Config c;
  c.enabled = true;
  auto s = LossScaler::Create(c);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->dynamic());
  EXPECT_EQ(s->scale(), 65536.0);
  EXPECT_EQ(s->state().hysteresis_left, 2);
  EXPECT_EQ(s->state().last_overflow_iteration, -1);
}

TEST(LossScalerTest, DisabledIsStaticOne) {
  auto s = LossScaler::Create(Fp16Config{});
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->dynamic());
  EXPECT_EQ(s->scale(), 1.0);
  EXPECT_TRUE(s->Update(true));  // overflow steps are still skipped
  EXPECT_EQ(s->scale(), 1.0);
}

TEST(LossScalerTest, StaticScaleNeverChanges) {
  Fp16Config c;
  c.enabled = true;
  c.loss_scale = 128;
  auto s = LossScaler::Create(c);
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->dynamic());
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(s->Update(false));
  EXPECT_TRUE(s->Update(true));
  EXPECT_EQ(s->scale(), 128.0);
}

TEST(LossScalerTest, GrowsAfterWindowOfCleanSteps) {
  // DeepSpeed: stable_interval = cur_iter - last_overflow_iter - 1 must be a positive multiple of
  // the window, so with last_overflow_iter = -1 the first growth happens on iteration `window`
  // (the window+1-th clean step), then every `window` steps.
  auto s = LossScaler::Create(Dynamic(4, 3, 2));
  ASSERT_TRUE(s.ok());
  std::vector<double> scales;
  for (int i = 0; i < 8; ++i) {
    EXPECT_FALSE(s->Update(false));
    scales.push_back(s->scale());
  }
  EXPECT_EQ(scales, (std::vector<double>{16, 16, 16, 32, 32, 32, 64, 64}));
}

TEST(LossScalerTest, BacksOffOnOverflowWithoutHysteresis) {
  auto s = LossScaler::Create(Dynamic(10, 1000, 1));
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->Update(true));
  EXPECT_EQ(s->scale(), 512.0);
  EXPECT_TRUE(s->Update(true));
  EXPECT_EQ(s->scale(), 256.0);
  EXPECT_EQ(s->state().last_overflow_iteration, 1);
  EXPECT_EQ(s->state().iteration, 2);
}

TEST(LossScalerTest, HysteresisDelaysBackOff) {
  auto s = LossScaler::Create(Dynamic(10, 1000, 3));
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->Update(true));
  EXPECT_EQ(s->scale(), 1024.0);
  EXPECT_EQ(s->state().hysteresis_left, 2);
  EXPECT_TRUE(s->Update(true));
  EXPECT_EQ(s->scale(), 1024.0);
  EXPECT_EQ(s->state().hysteresis_left, 1);
  EXPECT_TRUE(s->Update(true));
  EXPECT_EQ(s->scale(), 512.0);
  EXPECT_TRUE(s->Update(true));  // budget stays spent: every further overflow halves
  EXPECT_EQ(s->scale(), 256.0);
}

TEST(LossScalerTest, NonConsecutiveHysteresisRefillsOnlyOnGrowth) {
  auto s = LossScaler::Create(Dynamic(10, 2, 2));
  ASSERT_TRUE(s.ok());
  s->Update(true);   // iter 0: hysteresis 2 -> 1, scale kept
  s->Update(false);  // iter 1: stable 0
  EXPECT_EQ(s->state().hysteresis_left, 1);
  s->Update(true);  // iter 2: budget spent -> halve
  EXPECT_EQ(s->scale(), 512.0);
  s->Update(false);  // iter 3: stable 0
  s->Update(false);  // iter 4: stable 1
  s->Update(false);  // iter 5: stable 2 -> grow, refill
  EXPECT_EQ(s->scale(), 1024.0);
  EXPECT_EQ(s->state().hysteresis_left, 2);
  s->Update(true);  // refilled budget absorbs one overflow
  EXPECT_EQ(s->scale(), 1024.0);
}

TEST(LossScalerTest, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  auto s = LossScaler::Create(Dynamic(10, 1000, 2, /*consecutive=*/true));
  ASSERT_TRUE(s.ok());
  s->Update(true);
  EXPECT_EQ(s->state().hysteresis_left, 1);
  s->Update(false);
  EXPECT_EQ(s->state().hysteresis_left, 2);
  s->Update(true);  // absorbed again
  EXPECT_EQ(s->scale(), 1024.0);
  s->Update(true);  // two in a row: halve
  EXPECT_EQ(s->scale(), 512.0);
}

TEST(LossScalerTest, FloorsAtMinLossScale) {
  auto s = LossScaler::Create(Dynamic(3, 1000, 1, false, /*min_scale=*/2));
  ASSERT_TRUE(s.ok());
  s->Update(true);
  EXPECT_EQ(s->scale(), 4.0);
  s->Update(true);
  EXPECT_EQ(s->scale(), 2.0);
  EXPECT_FALSE(s->overflow_at_min_scale());
  EXPECT_TRUE(s->Update(true));
  EXPECT_EQ(s->scale(), 2.0);
  EXPECT_TRUE(s->overflow_at_min_scale());  // DeepSpeed would raise here
  s->Update(false);
  EXPECT_FALSE(s->overflow_at_min_scale());
}

TEST(LossScalerTest, NonPowerOfTwoFloorIsReachedExactly) {
  auto s = LossScaler::Create(Dynamic(2, 1000, 1, false, /*min_scale=*/3));
  ASSERT_TRUE(s.ok());
  s->Update(true);  // 4 / 2 = 2 < 3 -> 3
  EXPECT_EQ(s->scale(), 3.0);
}

TEST(LossScalerTest, RestoreContinuesExactly) {
  auto a = LossScaler::Create(Dynamic(8, 3, 2));
  ASSERT_TRUE(a.ok());
  const bool pattern[] = {false, true, false, false, true, true, false, false, false, false};
  for (bool o : pattern) a->Update(o);
  auto b = LossScaler::Create(Dynamic(8, 3, 2));
  ASSERT_TRUE(b.ok());
  b->Restore(a->state());
  for (int i = 0; i < 20; ++i) {
    const bool o = i % 7 == 3;
    a->Update(o);
    b->Update(o);
    EXPECT_EQ(a->scale(), b->scale());
    EXPECT_EQ(a->state().hysteresis_left, b->state().hysteresis_left);
  }
}

TEST(LossScalerTest, RejectsBadSettings) {
  Fp16Config c = Dynamic(16, 0, 2);
  auto s = LossScaler::Create(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("fp16.loss_scale_window"), std::string_view::npos);
  c = Dynamic(16, 10, 0);
  EXPECT_FALSE(LossScaler::Create(c).ok());
  c = Dynamic(16, 10, 2, false, 0);
  EXPECT_FALSE(LossScaler::Create(c).ok());
}

}  // namespace
}  // namespace strata::runtime
