// ClipMultiplier (runtime/engine/numerics/clipping.h): DeepSpeed's gradient-clipping rule.
#include "runtime/engine/numerics/clipping.h"

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

}  // namespace
}  // namespace strata::runtime
