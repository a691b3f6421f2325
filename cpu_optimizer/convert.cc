// Scalar fp16/bf16 conversions (the reference semantics; see dtype.h). Integer arithmetic only,
// so the result never depends on the FPU's rounding mode or on DAZ/FTZ.
#include "cpu_optimizer/convert.h"

#include <cstring>

namespace strata::cpu_optimizer {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace

float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exp = (half >> 10) & 0x1fu;
  const uint32_t mant = half & 0x3ffu;
  if (exp == 0x1f) {  // inf or NaN; a NaN comes back quiet
    return BitsFloat(sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u));
  }
  if (exp == 0) {
    if (mant == 0) return BitsFloat(sign);
    // Subnormal: mant * 2^-24, exact in float.
    const float magnitude = static_cast<float>(mant) * BitsFloat(0x33800000u);  // 2^-24
    return BitsFloat(sign | FloatBits(magnitude));
  }
  return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t FloatToHalf(float value) {
  const uint32_t bits = FloatBits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: quiet, top payload bits kept
    return static_cast<uint16_t>(sign | 0x7c00u | 0x200u | ((abs & 0x7fffffu) >> 13));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  const uint32_t exp = abs >> 23;
  if (exp < 113) {                     // below 2^-14: a subnormal half (or zero)
    const uint32_t shift = 126 - exp;  // value = full_mantissa * 2^-shift in units of 2^-24
    if (shift > 24) return static_cast<uint16_t>(sign);
    const uint32_t full = (abs & 0x7fffffu) | 0x800000u;
    uint32_t q = full >> shift;
    const uint32_t rem = full & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t q = ((exp - 112) << 10) | ((abs & 0x7fffffu) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ++q;  // may carry into the exponent
  return static_cast<uint16_t>(sign | q);
}

float Bf16ToFloat(uint16_t bf16) { return BitsFloat(static_cast<uint32_t>(bf16) << 16); }

uint16_t FloatToBf16(float value) {
  const uint32_t bits = FloatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace strata::cpu_optimizer
