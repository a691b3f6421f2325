// Helpers only the cpu_optimizer tests need: the ISAs to compare, unaligned views, element access
// by DType and bit comparisons. Helpers any test folder may use (temporary directories, byte
// patterns, environment) are in tests/testing/ (strata_testing).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cpu_optimizer/convert.h"
#include "cpu_optimizer/isa.h"

namespace strata::cpu_optimizer::testing {

// The vector ISAs checked against the scalar oracle.
inline std::vector<Isa> VectorIsas() { return {Isa::kAvx2, Isa::kAvx512}; }

inline uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
inline float FromBits(uint32_t u) { return std::bit_cast<float>(u); }

// A byte buffer holding `n` elements of `elem_size` bytes starting `offset_elems` elements past a
// 64-byte boundary (offset 1..3 makes every pointer unaligned for vectors).
class Slab {
 public:
  Slab(size_t n, size_t elem_size, size_t offset_elems)
      : storage_((n + offset_elems) * elem_size + 128), elem_size_(elem_size), n_(n) {
    uintptr_t base = reinterpret_cast<uintptr_t>(storage_.data());
    base = (base + 63) & ~uintptr_t{63};
    data_ = reinterpret_cast<uint8_t*>(base) + offset_elems * elem_size;
  }
  void* data() { return data_; }
  float* f32() { return reinterpret_cast<float*>(data_); }
  uint16_t* u16() { return reinterpret_cast<uint16_t*>(data_); }
  size_t bytes() const { return n_ * elem_size_; }

 private:
  std::vector<uint8_t> storage_;
  uint8_t* data_;
  size_t elem_size_, n_;
};

inline void StoreAs(void* base, DType dtype, size_t i, float x) {
  if (dtype == DType::kFloat32) {
    static_cast<float*>(base)[i] = x;
  } else if (dtype == DType::kFloat16) {
    static_cast<uint16_t*>(base)[i] = FloatToHalf(x);
  } else {
    static_cast<uint16_t*>(base)[i] = FloatToBf16(x);
  }
}

inline float LoadAs(const void* base, DType dtype, size_t i) {
  if (dtype == DType::kFloat32) return static_cast<const float*>(base)[i];
  if (dtype == DType::kFloat16) return HalfToFloat(static_cast<const uint16_t*>(base)[i]);
  return Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
}

// Index of the first element whose bits differ (a NaN matches any NaN: x86 NaN payload
// propagation depends on operand order, which the compiler may swap for commutative scalar ops),
// or -1 when all match.
inline long FirstMismatch(const void* a, const void* b, DType dtype, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = LoadAs(a, dtype, i), y = LoadAs(b, dtype, i);
    if (std::isnan(x) && std::isnan(y)) continue;
    if (dtype == DType::kFloat32
            ? Bits(x) != Bits(y)
            : static_cast<const uint16_t*>(a)[i] != static_cast<const uint16_t*>(b)[i]) {
      return static_cast<long>(i);
    }
  }
  return -1;
}

}  // namespace strata::cpu_optimizer::testing
