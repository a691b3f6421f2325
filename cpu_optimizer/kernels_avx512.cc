// AVX-512 (F/BW/VL/DQ) + FMA + F16C kernels: 16 floats per vector, masked loads and stores for the
// last partial vector. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c (see
// CMakeLists.txt) and only called after IsaSupported(Isa::kAvx512).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "cpu_optimizer/internal/kernels_impl.h"

namespace strata::cpu_optimizer::internal {
namespace {

struct Avx512Vec {
  using F = __m512;
  using H = __m256i;  // 16 x 16-bit
  struct D {
    __m512d lo, hi;
  };
  static constexpr size_t kWidth = 16;
  static constexpr bool kCanStream = true;

  static __mmask16 Mask(size_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static F LoadN(const float* p, size_t n) { return _mm512_maskz_loadu_ps(Mask(n), p); }
  static void Store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static void StoreN(float* p, F x, size_t n) { _mm512_mask_storeu_ps(p, Mask(n), x); }
  static H LoadH(const uint16_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static H LoadHN(const uint16_t* p, size_t n) { return _mm256_maskz_loadu_epi16(Mask(n), p); }
  static void StoreH(uint16_t* p, H h) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h); }
  static void StoreHN(uint16_t* p, H h, size_t n) { _mm256_mask_storeu_epi16(p, Mask(n), h); }
  static void StreamH(uint16_t* p, H h) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h); }
  static void StoreFence() { _mm_sfence(); }

  static F HalfToFloat(H h) { return _mm512_cvtph_ps(h); }
  static F Bf16ToFloat(H h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static H FloatToHalf(F x) {
    return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static H FloatToBf16(F x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i upper = _mm512_srli_epi32(bits, 16);
    const __m512i lsb = _mm512_and_si512(upper, _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i quiet_nan = _mm512_or_si512(upper, _mm512_set1_epi32(0x40));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet_nan));
  }

  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm512_div_ps(a, b); }
  static F Sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F Sign(F x) {
    const F zero = _mm512_setzero_ps();
    const F one = _mm512_set1_ps(1.0f);
    const F s = _mm512_sub_ps(_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, zero, _CMP_GT_OQ), one),
                              _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), one));
    return _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
  }
  static bool AnyNan(F x) { return _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) != 0; }

  static D DZero() { return {_mm512_setzero_pd(), _mm512_setzero_pd()}; }
  static D AccumulateSquares(D acc, F x) {
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d hi =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    return {_mm512_fmadd_pd(lo, lo, acc.lo), _mm512_fmadd_pd(hi, hi, acc.hi)};
  }
  static double DSum(D acc) {
    alignas(64) double lanes[8];
    _mm512_store_pd(lanes, _mm512_add_pd(acc.lo, acc.hi));
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
           ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  }
};

}  // namespace

const KernelTable& Avx512Table() {
  static const KernelTable table = MakeKernelTable<Avx512Vec>(Isa::kAvx512);
  return table;
}

}  // namespace strata::cpu_optimizer::internal
