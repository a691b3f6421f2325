// Internal to runtime/config/: the one Parser whose sections are spread over three files, so that
// each stays readable on its own. Not for use outside this folder (config.h is the API).
//
//   config.cc             the walk over the top level, the shared typed readers, "auto", the batch
//                         keys, and the entry points;
//   zero_sections.cc      zero_optimization (offload_param, offload_optimizer, stage3_*) and aio;
//   training_sections.cc  fp16/bf16, optimizer and scheduler.
//
// A Parser is used once, by one thread: Parse() fills config_ section by section and returns it.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "base/json_values.h"
#include "base/status.h"
#include "runtime/config/config.h"

namespace strata::runtime::config_internal {

using nlohmann::json;

inline constexpr int64_t kIntMax = std::numeric_limits<int64_t>::max();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// The value of `key` in `object`; nullptr when absent or null (DeepSpeed reads null as "default").
const json* Find(const json& object, std::string_view key);

class Parser {
 public:
  explicit Parser(const ParseOptions& options) : options_(options) {}

  Result<Config> Parse(const json& root);

 private:
  // ---- Shared readers (config.cc) ----
  void Warn(std::string message);
  // Checks `object`'s keys against `known` and the ignored keys under `path`; warns for each
  // ignored key present.
  Status Keys(const json& object, std::string_view path, std::span<const std::string_view> known);
  Status NotAuto(const json& v, const std::string& path);
  // Typed keys: absent or null keeps *out (DeepSpeed's default); "auto" is refused.
  template <typename T>
  Status Int(const json& object, std::string_view path, std::string_view key, int64_t min,
             int64_t max, T* out) {
    const json* v = Find(object, key);
    if (v == nullptr) return Status::Ok();
    const std::string full = JoinPath(path, key);
    STRATA_RETURN_IF_ERROR(NotAuto(*v, full));
    STRATA_ASSIGN_OR_RETURN(int64_t value, JsonInt(*v, full, min, max));
    *out = static_cast<T>(value);
    return Status::Ok();
  }
  Status Double(const json& object, std::string_view path, std::string_view key, double min,
                double max, double* out);
  Status Bool(const json& object, std::string_view path, std::string_view key, bool* out);
  // Resolves "auto" from a caller-supplied value or refuses, saying what is needed.
  template <typename T>
  Result<T> Auto(const std::optional<T>& value, const std::string& path, std::string_view what) {
    if (!value) {
      return InvalidArgumentError(
          path + ": \"auto\" needs " + std::string(what) +
          " from the caller (ParseOptions::auto_values), and none was given;"
          " write a value instead");
    }
    return *value;
  }
  // An object section (absent/null: nullptr). Error if present and not an object.
  Result<const json*> Section(const json& parent, std::string_view path, std::string_view key);

  // ---- Batch keys (config.cc) ----
  // One batch key: nullopt when absent, null or an unresolvable "auto" on train_batch_size.
  Result<std::optional<int64_t>> BatchKey(const json& root, std::string_view key,
                                          const std::optional<int64_t>& auto_value,
                                          std::string_view what, bool derivable);
  Status ParseBatch(const json& root);

  // ---- zero_optimization and aio (zero_sections.cc) ----
  // int64 key with an "auto" rule derived from the model's hidden size.
  Status HiddenSizeAuto(const json& zero, std::string_view key, std::string_view alias, int64_t min,
                        int64_t* out, int64_t (*from_hidden)(int64_t), std::string_view rule);
  Status ParseZero(const json& root);
  Status ParseAio(const json& root);

  // ---- Precision, optimizer, scheduler (training_sections.cc) ----
  Result<bool> Enabled(const json& section, const std::string& path,
                       const std::optional<bool>& auto_value);
  Status ParsePrecision(const json& root);
  // An optimizer hyper-parameter: a number, or "auto" resolved from `auto_value`.
  Status OptDouble(const json& params, std::string_view key,
                   const std::optional<double>& auto_value, std::string_view what, double min,
                   double* out);
  Status ParseOptimizer(const json& root);
  Status ParseScheduler(const json& root);

  const ParseOptions& options_;
  Config config_;
};

}  // namespace strata::runtime::config_internal
