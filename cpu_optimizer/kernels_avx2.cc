// AVX2 + FMA + F16C kernels: 8 floats per vector. Compiled with -mavx2 -mfma -mf16c (see
// CMakeLists.txt) and only called after IsaSupported(Isa::kAvx2). The last partial vector goes
// through a small stack buffer (AVX2 has no 16-bit masked loads).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu_optimizer/internal/kernels_impl.h"

namespace strata::cpu_optimizer::internal {
namespace {

struct Avx2Vec {
  using F = __m256;
  using H = __m128i;  // 8 x 16-bit
  struct D {
    __m256d lo, hi;
  };
  static constexpr size_t kWidth = 8;
  static constexpr bool kCanStream = true;

  static F Set1(float x) { return _mm256_set1_ps(x); }
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static F LoadN(const float* p, size_t n) {
    alignas(32) float tmp[8] = {};
    std::memcpy(tmp, p, n * sizeof(float));
    return _mm256_load_ps(tmp);
  }
  static void Store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static void StoreN(float* p, F x, size_t n) {
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, x);
    std::memcpy(p, tmp, n * sizeof(float));
  }
  static H LoadH(const uint16_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
  static H LoadHN(const uint16_t* p, size_t n) {
    alignas(16) uint16_t tmp[8] = {};
    std::memcpy(tmp, p, n * sizeof(uint16_t));
    return _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
  }
  static void StoreH(uint16_t* p, H h) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h); }
  static void StoreHN(uint16_t* p, H h, size_t n) {
    alignas(16) uint16_t tmp[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(tmp), h);
    std::memcpy(p, tmp, n * sizeof(uint16_t));
  }
  static void StreamH(uint16_t* p, H h) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), h); }
  static void StoreFence() { _mm_sfence(); }

  static F HalfToFloat(H h) { return _mm256_cvtph_ps(h); }
  static F Bf16ToFloat(H h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static H FloatToHalf(F x) {
    return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static H FloatToBf16(F x) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i upper = _mm256_srli_epi32(bits, 16);
    const __m256i lsb = _mm256_and_si256(upper, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i quiet_nan = _mm256_or_si256(upper, _mm256_set1_epi32(0x40));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  }

  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm256_div_ps(a, b); }
  static F Sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F Sign(F x) {
    const F zero = _mm256_setzero_ps();
    const F one = _mm256_set1_ps(1.0f);
    const F s = _mm256_sub_ps(_mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_GT_OQ), one),
                              _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_LT_OQ), one));
    return _mm256_blendv_ps(s, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  static bool AnyNan(F x) { return _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0; }

  static D DZero() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
  static D AccumulateSquares(D acc, F x) {
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    return {_mm256_fmadd_pd(lo, lo, acc.lo), _mm256_fmadd_pd(hi, hi, acc.hi)};
  }
  static double DSum(D acc) {
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, _mm256_add_pd(acc.lo, acc.hi));
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  }
};

}  // namespace

const KernelTable& Avx2Table() {
  static const KernelTable table = MakeKernelTable<Avx2Vec>(Isa::kAvx2);
  return table;
}

}  // namespace strata::cpu_optimizer::internal
