// Portable scalar kernels: one element per "vector". This is the test oracle for the AVX2 and
// AVX-512 kernels, and the fallback on CPUs without AVX2. Compiled with no -m flags; fp16/bf16
// conversions call the reference functions of dtype.cc.
#include <cstddef>
#include <cstdint>

#include "cpu_optimizer/convert.h"
#include "cpu_optimizer/internal/kernels_impl.h"

namespace strata::cpu_optimizer::internal {
namespace {

struct ScalarVec {
  using F = float;
  using H = uint16_t;
  using D = double;
  static constexpr size_t kWidth = 1;
  static constexpr bool kCanStream = false;

  static F Set1(float x) { return x; }
  static F Load(const float* p) { return *p; }
  static F LoadN(const float* p, size_t) { return *p; }
  static void Store(float* p, F x) { *p = x; }
  static void StoreN(float* p, F x, size_t) { *p = x; }
  static H LoadH(const uint16_t* p) { return *p; }
  static H LoadHN(const uint16_t* p, size_t) { return *p; }
  static void StoreH(uint16_t* p, H h) { *p = h; }
  static void StoreHN(uint16_t* p, H h, size_t) { *p = h; }
  static void StreamH(uint16_t* p, H h) { *p = h; }
  static void StoreFence() {}

  static F HalfToFloat(H h) { return cpu_optimizer::HalfToFloat(h); }
  static F Bf16ToFloat(H h) { return cpu_optimizer::Bf16ToFloat(h); }
  static H FloatToHalf(F x) { return cpu_optimizer::FloatToHalf(x); }
  static H FloatToBf16(F x) { return cpu_optimizer::FloatToBf16(x); }

  static F Add(F a, F b) { return a + b; }
  static F Mul(F a, F b) { return a * b; }
  static F Div(F a, F b) { return a / b; }
  static F Sqrt(F a) { return __builtin_sqrtf(a); }
  static F Fma(F a, F b, F c) { return __builtin_fmaf(a, b, c); }  // a*b + c, one rounding
  // torch.sign: +1, -1, +0 for either zero, NaN stays NaN.
  static F Sign(F x) {
    if (x != x) return x;
    return (x > 0.0f ? 1.0f : 0.0f) - (x < 0.0f ? 1.0f : 0.0f);
  }
  static bool AnyNan(F x) { return x != x; }

  static D DZero() { return 0.0; }
  static D AccumulateSquares(D acc, F x) {
    const double d = x;
    return __builtin_fma(d, d, acc);  // d*d is exact in double; one rounding, like the vectors
  }
  static double DSum(D acc) { return acc; }
};

}  // namespace

const KernelTable& ScalarTable() {
  static const KernelTable table = MakeKernelTable<ScalarVec>(Isa::kScalar);
  return table;
}

}  // namespace strata::cpu_optimizer::internal
