// Element types of the flat buffers the CPU optimizers read and write, and the scalar conversions
// between them. These scalar functions define the conversion semantics; every vectorized kernel
// (AVX-512, AVX2+F16C) produces bit-identical results, which tests/cpu_optimizer checks over all
// 65,536 16-bit patterns and over random and edge-case floats.
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

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace strata::cpu_optimizer {

enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16 };

// "fp32", "fp16", "bf16".
std::string_view DTypeName(DType dtype);
// Accepts "fp32"/"float32"/"float", "fp16"/"float16"/"half", "bf16"/"bfloat16".
Result<DType> ParseDType(std::string_view text);
// 4 or 2.
constexpr size_t DTypeSize(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

float HalfToFloat(uint16_t half);
uint16_t FloatToHalf(float value);
float Bf16ToFloat(uint16_t bf16);
uint16_t FloatToBf16(float value);

}  // namespace strata::cpu_optimizer
