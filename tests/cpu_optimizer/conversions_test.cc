// fp16 and bf16 conversions: all 65,536 bit patterns of each, through the scalar reference and
// through every vector ISA's own load/store code (the code the kernels use), plus rounding of
// floats checked against an independent definition of round-to-nearest-even.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cpu_optimizer/convert.h"
#include "cpu_optimizer/internal/kernel_table.h"
#include "tests/cpu_optimizer/test_util.h"

namespace strata::cpu_optimizer {
namespace {

using testing::Bits;
using testing::FromBits;

bool HalfIsNan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool Bf16IsNan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// The value of a finite half, computed independently in double.
double HalfValue(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return (h & 0x8000) ? -mag : mag;
}

TEST(Fp16, AllPatternsConvertExactlyAndRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto half = static_cast<uint16_t>(h);
    const float f = HalfToFloat(half);
    if (HalfIsNan(half)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      // Quiet bit set, sign and payload kept.
      ASSERT_EQ(FloatToHalf(f), half | 0x200) << std::hex << h;
    } else if ((half & 0x7fff) == 0x7c00) {
      ASSERT_TRUE(std::isinf(f) && std::signbit(f) == ((h & 0x8000) != 0)) << std::hex << h;
      ASSERT_EQ(FloatToHalf(f), half);
    } else {
      ASSERT_EQ(static_cast<double>(f), HalfValue(half)) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
      ASSERT_EQ(FloatToHalf(f), half) << std::hex << h;
    }
  }
}

TEST(Bf16, AllPatternsConvertExactlyAndRoundTrip) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto bf = static_cast<uint16_t>(b);
    const float f = Bf16ToFloat(bf);
    ASSERT_EQ(Bits(f), b << 16);
    if (Bf16IsNan(bf)) {
      ASSERT_EQ(FloatToBf16(f), bf | 0x40) << std::hex << b;  // NaN kept NaN, quiet
    } else {
      ASSERT_EQ(FloatToBf16(f), bf) << std::hex << b;
    }
  }
}

// Round-to-nearest-even checked by definition: no other half is closer, and on a tie the chosen
// one has an even mantissa. Values at or beyond 65520 must give inf.
void CheckHalfRounding(float f) {
  const uint16_t h = FloatToHalf(f);
  if (std::isnan(f)) {
    ASSERT_TRUE(HalfIsNan(h));
    return;
  }
  if (std::fabs(f) >= 65520.0f) {
    ASSERT_EQ(h & 0x7fff, 0x7c00) << f;
    return;
  }
  ASSERT_NE(h & 0x7c00, 0x7c00) << f;
  const double x = f, got = HalfValue(h);
  const double err = std::fabs(x - got);
  const uint16_t mag = h & 0x7fff;
  for (int d : {-1, 1}) {
    const int other = mag + d;
    if (other < 0 || other >= 0x7c00) continue;
    const double alt = (x < 0 ? -1 : 1) * HalfValue(static_cast<uint16_t>(other));
    const double alt_err = std::fabs(x - alt);
    ASSERT_LE(err, alt_err) << f;
    if (err == alt_err) {
      ASSERT_EQ(mag & 1, 0) << "tie not to even: " << f;
    }
  }
  if (f != 0) {
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << f;
  }
}

void CheckBf16Rounding(float f) {
  const uint16_t b = FloatToBf16(f);
  if (std::isnan(f)) {
    ASSERT_TRUE(Bf16IsNan(b));
    return;
  }
  const double x = f, got = Bf16ToFloat(b);
  if (std::isinf(got)) {
    // Overflow: only when f is past the midpoint between the largest bf16 and 2^128.
    ASSERT_GE(std::fabs(x), std::ldexp(255.5, 120)) << f;
    return;
  }
  const double err = std::fabs(x - got);
  for (int d : {-1, 1}) {
    const int other = (b & 0x7fff) + d;
    if (other < 0 || other >= 0x7f80) continue;
    const double alt = (x < 0 ? -1.0 : 1.0) * Bf16ToFloat(static_cast<uint16_t>(other));
    ASSERT_LE(err, std::fabs(x - alt)) << f;
    if (err == std::fabs(x - alt)) {
      ASSERT_EQ(b & 1, 0) << "tie not to even: " << f;
    }
  }
}

std::vector<float> RoundingCases() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          65504.0f,
                          65519.99f,
                          65520.0f,
                          -65520.0f,
                          65536.0f,
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(),
                          5.96e-8f,
                          2.98e-8f,
                          2.99e-8f,
                          6.1e-5f,
                          6.09e-5f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          FromBits(0x7f800001),
                          FromBits(0xffc12345),
                          FromBits(0x3f808000),
                          FromBits(0x3f818000),
                          FromBits(0x3f800fff),
                          FromBits(0x3f801000),
                          FromBits(0x3f803000),
                          FromBits(0x7f7f8000),
                          FromBits(0x7f7fffff),
                          FromBits(0x33000000),
                          FromBits(0x33000001),
                          FromBits(0x387fe000)};
  // Every tie and near-tie around each half and bf16 value, plus random bit patterns.
  for (uint32_t h = 0; h < 0x7c00; h += 7) {
    const uint32_t fb = Bits(HalfToFloat(static_cast<uint16_t>(h)));
    for (uint32_t d : {0x0fffu, 0x1000u, 0x1001u}) v.push_back(FromBits(fb + d));
  }
  for (uint32_t b = 0; b < 0x7f80; b += 5) {
    for (uint32_t d : {0x7fffu, 0x8000u, 0x8001u}) v.push_back(FromBits((b << 16) + d));
  }
  std::mt19937 rng(42);
  for (int i = 0; i < 200000; ++i) v.push_back(FromBits(rng()));
  for (size_t i = 0, n = v.size(); i < n; ++i) v.push_back(-v[i]);
  return v;
}

TEST(Fp16, FloatRoundingIsNearestEven) {
  for (float f : RoundingCases()) ASSERT_NO_FATAL_FAILURE(CheckHalfRounding(f));
}

TEST(Bf16, FloatRoundingIsNearestEven) {
  for (float f : RoundingCases()) ASSERT_NO_FATAL_FAILURE(CheckBf16Rounding(f));
}

class VectorConversionTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!IsaSupported(GetParam())) GTEST_SKIP() << "this CPU lacks " << IsaName(GetParam());
  }
  const internal::KernelTable& table() { return internal::TableFor(GetParam()); }
};

TEST_P(VectorConversionTest, AllHalfAndBf16PatternsMatchScalar) {
  std::vector<uint16_t> all(65536 + 3);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  // From offset 1 so loads are unaligned and the last vector is partial.
  std::vector<float> f(all.size());
  std::vector<uint16_t> back(all.size());
  table().f16_to_f32(all.data() + 1, f.data() + 1, all.size() - 1);
  table().f32_to_f16(f.data() + 1, back.data() + 1, all.size() - 1);
  for (size_t i = 1; i < all.size(); ++i) {
    ASSERT_EQ(Bits(f[i]), Bits(HalfToFloat(all[i]))) << std::hex << all[i];
    ASSERT_EQ(back[i], FloatToHalf(f[i])) << std::hex << all[i];
  }
  table().bf16_to_f32(all.data() + 1, f.data() + 1, all.size() - 1);
  table().f32_to_bf16(f.data() + 1, back.data() + 1, all.size() - 1);
  for (size_t i = 1; i < all.size(); ++i) {
    ASSERT_EQ(Bits(f[i]), Bits(Bf16ToFloat(all[i]))) << std::hex << all[i];
    ASSERT_EQ(back[i], FloatToBf16(f[i])) << std::hex << all[i];
  }
}

TEST_P(VectorConversionTest, FloatRoundingMatchesScalar) {
  // Also confirms that the scalar reference rounds exactly like F16C's VCVTPS2PH.
  const std::vector<float> v = RoundingCases();
  std::vector<uint16_t> h(v.size()), b(v.size());
  table().f32_to_f16(v.data(), h.data(), v.size());
  table().f32_to_bf16(v.data(), b.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(h[i], FloatToHalf(v[i])) << std::hex << Bits(v[i]);
    ASSERT_EQ(b[i], FloatToBf16(v[i])) << std::hex << Bits(v[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, VectorConversionTest, ::testing::ValuesIn(testing::VectorIsas()),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(IsaName(info.param));
                         });

}  // namespace
}  // namespace strata::cpu_optimizer
