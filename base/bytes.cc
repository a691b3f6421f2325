#include "base/bytes.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace strata {

Result<uint64_t> ParseBytes(std::string_view text) {
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  std::string quoted(1, '\'');
  quoted.append(text);
  quoted.push_back('\'');
  if (s.empty()) return InvalidArgumentError("empty byte size " + quoted);
  if (s.front() == '-' || s.front() == '+') {
    return InvalidArgumentError("byte size " + quoted + " must be a non-negative number");
  }

  // Split into the numeric part and the unit suffix.
  size_t i = 0;
  bool seen_digit = false;
  while (i < s.size()) {
    const char c = s[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.') {
    } else if ((c == 'e' || c == 'E') && seen_digit && i + 1 < s.size() &&
               (std::isdigit(static_cast<unsigned char>(s[i + 1])) || s[i + 1] == '+')) {
      ++i;  // exponent sign or first digit
    } else {
      break;
    }
    ++i;
  }
  std::string number(s.substr(0, i));
  std::string unit(s.substr(i));
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.erase(0, 1);
  if (!seen_digit) return InvalidArgumentError("byte size " + quoted + " has no number");

  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(value)) {
    return InvalidArgumentError("byte size " + quoted + " is not a number");
  }

  uint64_t multiplier = 1;
  std::string u;
  for (char c : unit) u += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (u.empty() || u == "B")
    multiplier = 1;
  else if (u == "K" || u == "KB" || u == "KIB")
    multiplier = kKiB;
  else if (u == "M" || u == "MB" || u == "MIB")
    multiplier = kMiB;
  else if (u == "G" || u == "GB" || u == "GIB")
    multiplier = kGiB;
  else if (u == "T" || u == "TB" || u == "TIB")
    multiplier = kTiB;
  else {
    return InvalidArgumentError("byte size " + quoted + " has unknown unit '" + unit +
                                "' (use B, K, M, G or T)");
  }

  const double bytes = value * static_cast<double>(multiplier);
  if (bytes >= static_cast<double>(std::numeric_limits<uint64_t>::max())) {
    return InvalidArgumentError("byte size " + quoted + " is too large");
  }
  if (bytes != std::floor(bytes)) {
    return InvalidArgumentError("byte size " + quoted + " is not a whole number of bytes");
  }
  return static_cast<uint64_t>(bytes);
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < kKiB) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (v >= 1024.0 && unit < 4) {
    v /= 1024.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[unit]);
  return buf;
}

std::string FormatGbps(double bytes_per_second) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GB/s", bytes_per_second / 1e9);
  return buf;
}

}  // namespace strata
