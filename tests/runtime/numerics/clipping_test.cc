// ClipMultiplier and UnscaleAndClipMultiplier (runtime/numerics/clipping.h): DeepSpeed's
// gradient-clipping rule, without and with an fp16 loss scale.
#include "runtime/numerics/clipping.h"

#include <gtest/gtest.h>

namespace strata::runtime {
namespace {

// Usable where a constant is needed.
static_assert(ClipMultiplier(5.0, 0.0) == 1.0);
static_assert(ClipMultiplier(0.5, 1.0) == 1.0);

TEST(ClippingTest, OffWhenMaxNormIsNotPositive) {
  EXPECT_EQ(ClipMultiplier(1e30, 0.0), 1.0);
  EXPECT_EQ(ClipMultiplier(1e30, -1.0), 1.0);
  EXPECT_EQ(ClipMultiplier(0.0, 0.0), 1.0);
}

TEST(ClippingTest, NormsBelowMaxNormAreLeftAlone) {
  EXPECT_EQ(ClipMultiplier(0.0, 1.0), 1.0);
  EXPECT_EQ(ClipMultiplier(0.5, 1.0), 1.0);
  EXPECT_EQ(ClipMultiplier(0.999, 1.0), 1.0);
  EXPECT_EQ(ClipMultiplier(1.0, 2.0), 1.0);
}

TEST(ClippingTest, NormsAboveMaxNormAreScaledToIt) {
  EXPECT_DOUBLE_EQ(ClipMultiplier(10.0, 1.0), 1.0 / ((10.0 + 1e-6) / 1.0));
  EXPECT_DOUBLE_EQ(ClipMultiplier(4.0, 2.0), 2.0 / (4.0 + 1e-6));
  // The clipped norm is max_norm, less the 1e-6 guard.
  for (double norm : {1.5, 3.0, 1e3, 1e8}) {
    const double m = ClipMultiplier(norm, 1.0);
    EXPECT_LT(m, 1.0);
    EXPECT_NEAR(norm * m, 1.0, 1e-6) << norm;
    EXPECT_LT(norm * m, 1.0) << norm;
  }
  // At exactly max_norm the guard tips it over: a multiplier just below 1 (DeepSpeed does this).
  const double at = ClipMultiplier(1.0, 1.0);
  EXPECT_LT(at, 1.0);
  EXPECT_GT(at, 1.0 - 2e-6);
}

// fp16 (DeepSpeed's unscale_and_clip_grads): the multiplier takes scaled gradients to their
// clipped, unscaled values; the clip test runs on the unscaled norm.
TEST(ClippingTest, UnscaleAndClipUndoesTheLossScaleThenClips) {
  // No clipping: just 1/scale.
  EXPECT_EQ(UnscaleAndClipMultiplier(1e6, 1024.0, 0.0), 1.0 / 1024.0);
  // Unscaled norm 0.5 under max_norm 1: only unscaled (a scaled norm of 512 must not clip).
  EXPECT_EQ(UnscaleAndClipMultiplier(512.0, 1024.0, 1.0), 1.0 / 1024.0);
  // Unscaled norm 10 over max_norm 2: unscaled then scaled to the max norm.
  const double m = UnscaleAndClipMultiplier(10.0 * 4096, 4096.0, 2.0);
  EXPECT_DOUBLE_EQ(m, 1.0 / (((10.0 + 1e-6) / 2.0) * 4096.0));
  EXPECT_NEAR(10.0 * 4096 * m, 2.0, 1e-6);
  // Scale 1 is plain clipping, bitwise.
  for (double norm : {0.3, 1.0, 7.5, 1e5}) {
    EXPECT_EQ(UnscaleAndClipMultiplier(norm, 1.0, 1.0), ClipMultiplier(norm, 1.0)) << norm;
  }
}

}  // namespace
}  // namespace strata::runtime
