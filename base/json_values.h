// Reading typed values out of DeepSpeed-style JSON: shared by runtime/config and the LR schedules.
//
// Messages name the key path and what was expected ("zero_optimization.stage: expected an
// integer 0..3, got \"three\""); the caller prepends the source. Integers accept JSON integers,
// integral floats (1e9) and numeric strings ("5e8"); floats accept numbers and numeric strings;
// booleans accept only true/false.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

#include "base/status.h"

namespace strata {

bool IsAuto(const nlohmann::json& value);

Result<int64_t> JsonInt(const nlohmann::json& value, std::string_view path, int64_t min,
                        int64_t max);
Result<double> JsonDouble(const nlohmann::json& value, std::string_view path, double min,
                          double max);
Result<bool> JsonBool(const nlohmann::json& value, std::string_view path);
Result<std::string> JsonString(const nlohmann::json& value, std::string_view path);

// InvalidArgument "<path>.<key>: unknown key (did you mean "<nearest>"?)" for the first key of
// `object` in neither `known` nor `ignored`.
Status CheckKeys(const nlohmann::json& object, std::string_view path,
                 std::span<const std::string_view> known,
                 std::span<const std::string_view> ignored = {});

// "a.b" from ("a", "b"); just "b" when path is empty.
std::string JoinPath(std::string_view path, std::string_view key);

// Levenshtein distance (exposed for tests).
size_t EditDistance(std::string_view a, std::string_view b);
// ` (did you mean "x"?)` for the nearest candidate, or "" when none is close.
std::string DidYouMean(std::string_view key, std::span<const std::string_view> candidates);

}  // namespace strata
