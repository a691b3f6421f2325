// Scalar conversions between the element types of base/dtype.h (the one DType; this header
// re-exports it for the optimizer's users). These scalar functions define the conversion
// semantics; every vectorized kernel (AVX-512, AVX2+F16C) produces bit-identical results, which
// tests/cpu_optimizer checks over all 65,536 16-bit patterns and over random and edge-case floats.
//
// fp16 (IEEE binary16), float -> half: round to nearest, ties to even; values >= 65520 in
//   magnitude become inf; results below the normal range become subnormal (or zero) by the same
//   rounding; NaN stays NaN with the quiet bit set and the top 9 payload bits kept (what F16C's
//   VCVTPS2PH does). half -> float is exact (a signalling NaN comes back quiet, as VCVTPH2PS does).
// bf16 (upper 16 bits of a float), float -> bf16: round to nearest, ties to even (overflow rounds
//   to inf); NaN stays NaN: sign and top payload bits kept, quiet bit set (what AVX512_BF16's
//   VCVTNEPS2BF16 does). bf16 -> float is exact (a shift).
//
// All functions are pure and thread-safe.
#pragma once

#include <cstdint>

#include "base/dtype.h"

namespace strata::cpu_optimizer {

float HalfToFloat(uint16_t half);
uint16_t FloatToHalf(float value);
float Bf16ToFloat(uint16_t bf16);
uint16_t FloatToBf16(float value);

}  // namespace strata::cpu_optimizer
