// HasInfOrNan and SumOfSquares: every ISA, every gradient dtype, odd sizes, unaligned pointers,
// bad values in the first, middle, last and partial-vector positions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cpu_optimizer/optimizer.h"
#include "tests/cpu_optimizer/test_util.h"

namespace strata::cpu_optimizer {
namespace {

using testing::Slab;
using testing::StoreAs;

std::vector<Isa> AllIsas() { return {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}; }

class ReductionTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!IsaSupported(GetParam())) GTEST_SKIP() << "this CPU lacks " << IsaName(GetParam());
  }
};

TEST_P(ReductionTest, FindsInfAndNanAnywhere) {
  const float inf = std::numeric_limits<float>::infinity();
  const float bad_values[] = {inf, -inf, std::numeric_limits<float>::quiet_NaN()};
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (size_t n : {size_t{1}, size_t{15}, size_t{17}, size_t{1000003}}) {
      Slab g(n, DTypeBytes(dtype), 1);
      // Large finite values (fp16 max, float max) are not overflow.
      const float big = dtype == DType::kFloat16 ? 65504.0f : 3e38f;
      for (size_t i = 0; i < n; ++i) StoreAs(g.data(), dtype, i, i % 3 ? -big : 0.25f);
      for (int threads : {1, 2}) {
        Result<bool> clean = HasInfOrNan(g.data(), dtype, n, threads, GetParam());
        ASSERT_TRUE(clean.ok());
        EXPECT_FALSE(*clean) << DTypeName(dtype) << " n=" << n;
      }
      std::vector<size_t> positions = {0, n / 2, n - 1};
      if (n > 16) positions.push_back(n - 16 - 1);    // in the last full vector
      if (n > 70000) positions.push_back(65536 + 3);  // in the second chunk
      for (size_t pos : positions) {
        for (float bad : bad_values) {
          StoreAs(g.data(), dtype, pos, bad);
          Result<bool> found = HasInfOrNan(g.data(), dtype, n, 2, GetParam());
          ASSERT_TRUE(found.ok());
          EXPECT_TRUE(*found) << DTypeName(dtype) << " n=" << n << " pos=" << pos << " " << bad;
          StoreAs(g.data(), dtype, pos, 1.0f);
        }
      }
    }
  }
}

TEST_P(ReductionTest, SumOfSquaresMatchesLongDoubleReference) {
  // Lane and chunk partial sums change the summation order against the long double reference; in
  // double that costs at most ~n * 2^-53 relative (terms are all positive), far below 1e-12 here.
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (size_t n : {size_t{1}, size_t{15}, size_t{17}, size_t{1000003}}) {
      Slab g(n, DTypeBytes(dtype), 3);
      long double ref = 0;
      for (size_t i = 0; i < n; ++i) {
        StoreAs(g.data(), dtype, i, normal(rng));
        const long double x = testing::LoadAs(g.data(), dtype, i);
        ref += x * x;
      }
      Result<double> one = SumOfSquares(g.data(), dtype, n, 1, GetParam());
      Result<double> two = SumOfSquares(g.data(), dtype, n, 2, GetParam());
      ASSERT_TRUE(one.ok() && two.ok());
      EXPECT_NEAR(*one, static_cast<double>(ref), 1e-12 * static_cast<double>(ref))
          << DTypeName(dtype) << " n=" << n;
      EXPECT_EQ(*one, *two) << "thread count changed the sum";
    }
  }
}

TEST_P(ReductionTest, SumOfSquaresPropagatesInf) {
  std::vector<float> g(100, 1.0f);
  g[99] = std::numeric_limits<float>::infinity();
  Result<double> s = SumOfSquares(g.data(), DType::kFloat32, g.size(), 1, GetParam());
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(std::isinf(*s));
}

INSTANTIATE_TEST_SUITE_P(Isas, ReductionTest, ::testing::ValuesIn(AllIsas()),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(IsaName(info.param));
                         });

TEST(Reductions, EmptyAndNull) {
  Result<bool> e = HasInfOrNan(nullptr, DType::kFloat32, 0);
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE(*e);
  EXPECT_FALSE(HasInfOrNan(nullptr, DType::kFloat32, 5).ok());
  EXPECT_FALSE(SumOfSquares(nullptr, DType::kFloat16, 5).ok());
}

}  // namespace
}  // namespace strata::cpu_optimizer
