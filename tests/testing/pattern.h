// Deterministic byte patterns for round-trip tests.
//
// The bytes depend on both the position and the seed, so data written at the wrong offset, a
// stale buffer, or two buffers swapped all compare unequal (a constant fill would hide all three).
// Pure functions; any thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata::testing {

// Fills `n` bytes at `p` with the pattern for `seed`.
inline void FillPattern(void* p, size_t n, uint64_t seed) {
  auto* out = static_cast<std::byte*>(p);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;  // xorshift64: any seed, including 0, works
  for (size_t i = 0; i < n; ++i) {
    if (i % 8 == 0) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
    }
    out[i] = static_cast<std::byte>(x >> ((i % 8) * 8));
  }
}

// `n` bytes of the pattern for `seed`.
inline std::vector<std::byte> Pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  FillPattern(v.data(), n, seed);
  return v;
}

// Index of the first of the `n` bytes at `p` that differs from the pattern for `seed`, or -1.
inline int64_t FirstPatternMismatch(const void* p, size_t n, uint64_t seed) {
  const std::vector<std::byte> want = Pattern(n, seed);
  const auto* got = static_cast<const std::byte*>(p);
  const auto where = std::mismatch(want.begin(), want.end(), got).first;
  return where == want.end() ? -1 : where - want.begin();
}

}  // namespace strata::testing
