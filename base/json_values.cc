#include "base/json_values.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <vector>

namespace strata {
namespace {

std::string Show(const nlohmann::json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

std::string FormatNumber(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

std::string IntRange(int64_t min, int64_t max) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  if (min == kMin && max == kMax) return "an integer";
  if (max == kMax) return "an integer >= " + std::to_string(min);
  if (min == kMin) return "an integer <= " + std::to_string(max);
  return "an integer " + std::to_string(min) + ".." + std::to_string(max);
}

std::string DoubleRange(double min, double max) {
  const bool low = std::isfinite(min), high = std::isfinite(max);
  if (low && high) return "a number in [" + FormatNumber(min) + ", " + FormatNumber(max) + "]";
  if (low) return "a number >= " + FormatNumber(min);
  if (high) return "a number <= " + FormatNumber(max);
  return "a finite number";
}

// A JSON number or a numeric string ("1e9"); nullopt for anything else.
std::optional<double> AsNumber(const nlohmann::json& value) {
  if (value.is_number()) return value.get<double>();
  if (!value.is_string()) return std::nullopt;
  const std::string& text = value.get_ref<const std::string&>();
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || errno == ERANGE) return std::nullopt;
  return v;
}

}  // namespace

bool IsAuto(const nlohmann::json& value) {
  return value.is_string() && value.get_ref<const std::string&>() == "auto";
}

std::string JoinPath(std::string_view path, std::string_view key) {
  if (path.empty()) return std::string(key);
  std::string out(path);
  out += '.';
  out += key;
  return out;
}

Result<int64_t> JsonInt(const nlohmann::json& value, std::string_view path, int64_t min,
                        int64_t max) {
  auto fail = [&] {
    return InvalidArgumentError(std::string(path) + ": expected " + IntRange(min, max) + ", got " +
                                Show(value));
  };
  int64_t v = 0;
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() &&
        value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return fail();
    }
    v = value.get<int64_t>();
  } else {
    std::optional<double> d = AsNumber(value);
    // 2^63 is the first double past int64's range.
    if (!d || !std::isfinite(*d) || *d != std::trunc(*d) || *d >= 9223372036854775808.0 ||
        *d < -9223372036854775808.0) {
      return fail();
    }
    v = static_cast<int64_t>(*d);
  }
  if (v < min || v > max) return fail();
  return v;
}

Result<double> JsonDouble(const nlohmann::json& value, std::string_view path, double min,
                          double max) {
  std::optional<double> d = AsNumber(value);
  if (!d || !std::isfinite(*d) || *d < min || *d > max) {
    return InvalidArgumentError(std::string(path) + ": expected " + DoubleRange(min, max) +
                                ", got " + Show(value));
  }
  return *d;
}

Result<bool> JsonBool(const nlohmann::json& value, std::string_view path) {
  if (!value.is_boolean()) {
    return InvalidArgumentError(std::string(path) + ": expected true or false, got " + Show(value));
  }
  return value.get<bool>();
}

Result<std::string> JsonString(const nlohmann::json& value, std::string_view path) {
  if (!value.is_string()) {
    return InvalidArgumentError(std::string(path) + ": expected a string, got " + Show(value));
  }
  return value.get<std::string>();
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + cost});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string DidYouMean(std::string_view key, std::span<const std::string_view> candidates) {
  std::string_view best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (std::string_view candidate : candidates) {
    const size_t d = EditDistance(key, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  // Close enough to be a typo: at most a third of the longer name (and at least 2 edits allowed).
  const size_t limit = std::max<size_t>(2, std::max(key.size(), best.size()) / 3);
  if (best.empty() || best_distance > limit) return "";
  return " (did you mean \"" + std::string(best) + "\"?)";
}

Status CheckKeys(const nlohmann::json& object, std::string_view path,
                 std::span<const std::string_view> known,
                 std::span<const std::string_view> ignored) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string& key = it.key();
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    if (std::find(ignored.begin(), ignored.end(), key) != ignored.end()) continue;
    std::string hint = DidYouMean(key, known);
    if (hint.empty()) {
      hint = " (valid keys:";
      for (std::string_view k : known) hint += " " + std::string(k);
      hint += ")";
    }
    return InvalidArgumentError(JoinPath(path, key) + ": unknown key" + hint);
  }
  return Status::Ok();
}

}  // namespace strata
