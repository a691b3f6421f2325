// Byte sizes as people write them, and as strata prints them.
//
// ParseBytes accepts what DeepSpeed configs, ds_io and fio accept:
//   "4096", "4K", "4k", "4KB", "4KiB", "1M", "1.5G", "2T"   (K/M/G/T are powers of 1024)
//   "1e9", "5e8", "1.5e9"                                    (plain numbers, so decimal)
// Whitespace around the text is allowed; negatives, fractions of a byte, and overflow are errors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace strata {

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;
inline constexpr uint64_t kGiB = 1024 * kMiB;
inline constexpr uint64_t kTiB = 1024 * kGiB;

Result<uint64_t> ParseBytes(std::string_view text);

// "512 B", "4.00 KiB", "1.50 GiB": binary units, three significant decimals.
std::string FormatBytes(uint64_t bytes);

// Decimal bandwidth for people: "2.31 GB/s" (GB = 1e9 bytes).
std::string FormatGbps(double bytes_per_second);

// Rounds `value` up to a multiple of `alignment`. REQUIRES: alignment > 0.
constexpr uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}
constexpr bool IsAligned(uint64_t value, uint64_t alignment) { return value % alignment == 0; }

}  // namespace strata
