// Internal to runtime/config/: the one Parser whose sections are spread over three files, so that
// each stays readable on its own. Not for use outside this folder (config.h is the API).
//
//   config.cc             the walk over the top level, the shared typed readers, "auto", the batch
//                         keys, and the entry points;
//   zero_sections.cc      zero_optimization (offload_param, offload_optimizer, stage3_*), aio and
//                         strata (strata's own keys: swap_checksums, comms_timeout_seconds);
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
#include <utility>
#include <vector>

#include "base/json_values.h"
#include "base/status.h"
#include "runtime/config/config.h"

namespace strata::runtime::config_internal {

using nlohmann::json;

inline constexpr int64_t kIntMax = std::numeric_limits<int64_t>::max();
// Bounds of the batch keys: train_micro_batch_size_per_gpu and gradient_accumulation_steps (as the
// commands' --micro-batch/--grad-accum), and train_batch_size. The engine counts micro-batches in
// an int; a larger value used to be narrowed (2^31 accumulation steps trained nothing).
inline constexpr int64_t kMaxBatchFactor = int64_t{1} << 30;
inline constexpr int64_t kMaxTrainBatch = int64_t{1} << 40;
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// The value of `key` in `object`; nullptr when absent or null (DeepSpeed reads null as "default").
const json* Find(const json& object, std::string_view key);
// A number as a person reads it (ostream's default: 5e-05, 0.001, 1).
std::string Number(double v);

class Parser {
 public:
  explicit Parser(const ParseOptions& options) : options_(options) {}

  // Every problem is collected; the result is InvalidArgument listing all of them, one per line.
  Result<Config> Parse(const json& root);

 private:
  // ---- Shared readers (config.cc) ----
  // Records a problem and goes on (one pass reports them all).
  void Fail(const Status& status);
  void Fail(std::string message) { errors_.push_back(std::move(message)); }
  // Records `status` if it is an error; returns whether it was ok.
  bool Check(const Status& status);
  void Warn(std::string message);
  // Where a value HF's Trainer fills came from: "--lr" when the user gave the flag, else
  // "Hugging Face's default" (the command's TrainingArguments defaults) or "the caller".
  static std::string From(bool given, std::string_view flag) {
    if (given) return std::string(flag);
    return flag.empty() ? "the caller"
                        : "Hugging Face's default; " + std::string(flag) + " sets it";
  }
  // One line of Config::auto_resolved: `path: "auto" -> value (why)`.
  void Resolved(const std::string& path, const std::string& value, std::string_view why);
  // Checks `object`'s keys against `known` and the ignored keys under `path`: each unknown key is
  // a problem (with "did you mean"); each ignored key present gives a warning.
  void Keys(const json& object, std::string_view path, std::span<const std::string_view> known);
  // Typed keys: absent or null keeps *out (DeepSpeed's default); "auto" keeps it too, noted in
  // auto_resolved; a bad value is a problem and keeps the default. Return whether it was read.
  template <typename T>
  bool Int(const json& object, std::string_view path, std::string_view key, int64_t min,
           int64_t max, T* out) {
    const json* v = Find(object, key);
    if (v == nullptr) return true;
    const std::string full = JoinPath(path, key);
    if (IsAuto(*v)) {
      Resolved(full, std::to_string(*out), "DeepSpeed's default");
      return true;
    }
    Result<int64_t> value = JsonInt(*v, full, min, max);
    if (!Check(value.status())) return false;
    *out = static_cast<T>(*value);
    return true;
  }
  bool Double(const json& object, std::string_view path, std::string_view key, double min,
              double max, double* out);
  bool Bool(const json& object, std::string_view path, std::string_view key, bool* out);
  // A value Hugging Face's Trainer fills when "auto": the caller's value, or a problem naming
  // the flag that gives it (`flag`, e.g. "--lr").
  template <typename T>
  std::optional<T> Auto(const std::optional<T>& value, const std::string& path,
                        std::string_view what, std::string_view flag) {
    if (!value) {
      Fail(path + ": \"auto\" needs " + std::string(what) +
           (flag.empty() ? std::string(", which this command does not know")
                         : " (give " + std::string(flag) + ")") +
           "; or write a value");
    }
    return value;
  }
  // An explicit config value against one the user gave explicitly (HF's mismatch check).
  template <typename T>
  void Match(const std::string& path, const T& config_value, const std::optional<T>& given,
             std::string_view flag, const std::string& shown_config,
             const std::string& shown_given) {
    if (given && !(*given == config_value)) {
      Fail(path + ": the config says " + shown_config + ", " + std::string(flag) + " says " +
           shown_given + "; make them agree or write \"auto\" in the config");
    }
  }
  // An object section (absent/null: nullptr). A problem if present and not an object.
  const json* Section(const json& parent, std::string_view path, std::string_view key);

  // ---- Top level and batch keys (config.cc) ----
  void TopLevelKeys(const json& root);
  void GradientClipping(const json& root);
  // One batch key: nullopt when absent, null or an "auto" left to derive.
  std::optional<int64_t> BatchKey(const json& root, std::string_view key,
                                  const std::optional<int64_t>& auto_value,
                                  const std::optional<int64_t>& given, std::string_view what,
                                  std::string_view flag, bool derivable);
  void ParseBatch(const json& root);

  // ---- zero_optimization and aio (zero_sections.cc) ----
  // int64 key with an "auto" rule derived from the model's hidden size (null: DeepSpeed's default).
  void HiddenSizeAuto(const json& zero, std::string_view key, std::string_view alias, int64_t min,
                      int64_t* out, int64_t (*from_hidden)(int64_t), std::string_view rule);
  void DeprecatedOffload(const json& zero);
  void ParseZero(const json& root);
  void ParseAio(const json& root);
  void ParseStrata(const json& root);

  // ---- Precision, optimizer, scheduler (training_sections.cc) ----
  bool Enabled(const json& section, const std::string& path, const std::optional<bool>& auto_value,
               const std::optional<bool>& given, std::string_view flag);
  void ParsePrecision(const json& root);
  // An optimizer hyper-parameter: a number, or "auto" resolved from `auto_value`.
  void OptDouble(const json& params, std::string_view key, const std::optional<double>& auto_value,
                 const std::optional<double>& given, std::string_view what, std::string_view flag,
                 double min, double* out);
  void ParseOptimizer(const json& root);
  void ParseScheduler(const json& root);
  // No "scheduler" section: Hugging Face's schedule from strata.lr_scheduler (`section`, may be
  // null) and the flags, or none.
  void ParseHfScheduler(const json* section);
  // The warmup steps TrainingArguments.get_warmup_steps gives for (steps, ratio) over the run's
  // total; nullopt (a problem recorded, naming `who`) when the ratio needs an unknown total.
  std::optional<int64_t> WarmupSteps(const std::optional<int64_t>& steps,
                                     const std::optional<double>& ratio, const std::string& who);

  const ParseOptions& options_;
  Config config_;
  std::vector<std::string> errors_;
};

}  // namespace strata::runtime::config_internal
