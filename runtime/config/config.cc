// Parsing the DeepSpeed JSON config: the walk over the top level, the typed readers every section
// uses, "auto", the batch keys, and the entry points. The sections themselves are in
// zero_sections.cc and training_sections.cc (internal_parser.h lists who holds what).
//
// Algorithm: the text is parsed once by nlohmann::json (its exceptions are caught here, at the
// boundary, and become InvalidArgument with the byte position). Then each section is walked with
// a table of its valid keys: a key in the table is read with a typed reader (base/
// json_values.h) that checks the type and range and writes the field, leaving DeepSpeed's default
// when the key is absent or null; a key listed in IgnoredKeys() gives a warning; any other key is
// an error suggesting the nearest valid key by edit distance. "auto" is resolved per key from
// ParseOptions::auto_values (the rules Hugging Face's integration uses). After the sections come
// the cross-key checks: stage vs. offload, nvme_path (created, must be writable), fp16 vs. bf16,
// batch-size derivation (tbs = mbs × gas × world), and the scheduler, built once by
// MakeLrSchedule so that its parameters are validated with its own rules. Every error is prefixed
// with the source name by ParseConfig.
#include "runtime/config/config.h"

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "base/json_values.h"
#include "runtime/config/internal_parser.h"

namespace strata::runtime {
namespace config_internal {
namespace {

// Accepted but ignored, as full key paths. Keep in sync with the README's config section.
constexpr std::string_view kIgnoredKeys[] = {
    // top level
    "activation_checkpointing",
    "amp",
    "checkpoint",
    "comms_logger",
    "communication_data_type",
    "csv_monitor",
    "data_types",
    "dump_state",
    "flops_profiler",
    "gradient_predivide_factor",
    "memory_breakdown",
    "prescale_gradients",
    "sparse_gradients",
    "tensorboard",
    "wandb",
    "comet",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
    // zero_optimization
    "zero_optimization.allgather_bucket_size",
    "zero_optimization.allgather_partitions",
    "zero_optimization.elastic_checkpoint",
    "zero_optimization.gather_16bit_weights_on_model_save",
    "zero_optimization.ignore_unused_parameters",
    "zero_optimization.load_from_fp32_weights",
    "zero_optimization.memory_efficient_linear",
    "zero_optimization.reduce_scatter",
    "zero_optimization.round_robin_gradients",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save",
    "zero_optimization.stage3_model_persistence_threshold",
    "zero_optimization.stage3_module_granularity_threshold",
    "zero_optimization.model_persistence_threshold",
    "zero_optimization.use_multi_rank_bucket_allreduce",
    "zero_optimization.zero_hpz_partition_size",
    "zero_optimization.zero_quantized_weights",
    "zero_optimization.zero_quantized_gradients",
    "zero_optimization.mics_shard_size",
    "zero_optimization.mics_hierarchical_params_gather",
    "zero_optimization.log_trace_cache_warnings",
    // others
    "aio.use_gds",
    "fp16.fp16_master_weights_and_grads",
    "bf16.immediate_grad_update",
    "optimizer.legacy_fusion",
    "optimizer.params.torch_adam",
};

constexpr std::string_view kTopKeys[] = {"zero_optimization",
                                         "aio",
                                         "fp16",
                                         "bf16",
                                         "bfloat16",
                                         "gradient_clipping",
                                         "train_batch_size",
                                         "train_micro_batch_size_per_gpu",
                                         "gradient_accumulation_steps",
                                         "optimizer",
                                         "scheduler",
                                         "wall_clock_breakdown",
                                         "steps_per_print"};

}  // namespace

const json* Find(const json& object, std::string_view key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

Result<Config> Parser::Parse(const json& root) {
  if (!root.is_object()) {
    return InvalidArgumentError("expected a JSON object at the top level, got " +
                                std::string(root.type_name()));
  }
  STRATA_RETURN_IF_ERROR(Keys(root, "", kTopKeys));
  STRATA_RETURN_IF_ERROR(ParseZero(root));
  STRATA_RETURN_IF_ERROR(ParseAio(root));
  STRATA_RETURN_IF_ERROR(ParsePrecision(root));
  if (const json* v = Find(root, "gradient_clipping")) {
    if (IsAuto(*v)) {
      STRATA_ASSIGN_OR_RETURN(config_.gradient_clipping,
                              Auto(options_.auto_values.gradient_clipping, "gradient_clipping",
                                   "the gradient clipping norm (max_grad_norm)"));
    } else {
      STRATA_ASSIGN_OR_RETURN(config_.gradient_clipping,
                              JsonDouble(*v, "gradient_clipping", 0, kInf));
    }
  }
  STRATA_RETURN_IF_ERROR(ParseBatch(root));
  STRATA_RETURN_IF_ERROR(ParseOptimizer(root));
  STRATA_RETURN_IF_ERROR(ParseScheduler(root));
  STRATA_RETURN_IF_ERROR(Bool(root, "", "wall_clock_breakdown", &config_.wall_clock_breakdown));
  STRATA_RETURN_IF_ERROR(Int(root, "", "steps_per_print", 1, kIntMax, &config_.steps_per_print));
  return std::move(config_);
}

void Parser::Warn(std::string message) {
  config_.warnings.push_back(options_.source + ": " + message);
}

Status Parser::Keys(const json& object, std::string_view path,
                    std::span<const std::string_view> known) {
  std::vector<std::string_view> ignored;
  const std::string prefix = path.empty() ? "" : std::string(path) + ".";
  for (std::string_view full : kIgnoredKeys) {
    if (!full.starts_with(prefix)) continue;
    std::string_view rest = full.substr(prefix.size());
    if (rest.find('.') == std::string_view::npos) ignored.push_back(rest);
  }
  STRATA_RETURN_IF_ERROR(CheckKeys(object, path, known, ignored));
  for (std::string_view key : ignored) {
    if (object.contains(key)) {
      Warn(JoinPath(path, key) + ": accepted but ignored by strata");
    }
  }
  return Status::Ok();
}

Status Parser::NotAuto(const json& v, const std::string& path) {
  if (IsAuto(v)) return InvalidArgumentError(path + ": \"auto\" is not accepted for this key");
  return Status::Ok();
}

Status Parser::Double(const json& object, std::string_view path, std::string_view key, double min,
                      double max, double* out) {
  const json* v = Find(object, key);
  if (v == nullptr) return Status::Ok();
  const std::string full = JoinPath(path, key);
  STRATA_RETURN_IF_ERROR(NotAuto(*v, full));
  STRATA_ASSIGN_OR_RETURN(*out, JsonDouble(*v, full, min, max));
  return Status::Ok();
}

Status Parser::Bool(const json& object, std::string_view path, std::string_view key, bool* out) {
  const json* v = Find(object, key);
  if (v == nullptr) return Status::Ok();
  const std::string full = JoinPath(path, key);
  STRATA_RETURN_IF_ERROR(NotAuto(*v, full));
  STRATA_ASSIGN_OR_RETURN(*out, JsonBool(*v, full));
  return Status::Ok();
}

Result<const json*> Parser::Section(const json& parent, std::string_view path,
                                    std::string_view key) {
  const json* v = Find(parent, key);
  if (v == nullptr) return static_cast<const json*>(nullptr);
  if (!v->is_object()) {
    return InvalidArgumentError(JoinPath(path, key) + ": expected an object, got " + v->dump());
  }
  return v;
}

Result<std::optional<int64_t>> Parser::BatchKey(const json& root, std::string_view key,
                                                const std::optional<int64_t>& auto_value,
                                                std::string_view what, bool derivable) {
  const json* v = Find(root, key);
  if (v == nullptr) return std::optional<int64_t>();
  const std::string path(key);
  if (IsAuto(*v)) {
    if (auto_value) {
      if (*auto_value < 1) {
        return InvalidArgumentError(path + ": \"auto\" resolved to " + std::to_string(*auto_value) +
                                    ", expected >= 1");
      }
      return std::optional<int64_t>(*auto_value);
    }
    if (derivable) return std::optional<int64_t>();  // derived from the other two below
    STRATA_ASSIGN_OR_RETURN(int64_t resolved, Auto(auto_value, path, what));
    return std::optional<int64_t>(resolved);
  }
  STRATA_ASSIGN_OR_RETURN(int64_t value, JsonInt(*v, path, 1, kIntMax));
  return std::optional<int64_t>(value);
}

Status Parser::ParseBatch(const json& root) {
  const AutoValues& av = options_.auto_values;
  const int64_t world = options_.world_size;
  if (world < 1) return InvalidArgumentError("world_size: expected >= 1");
  STRATA_ASSIGN_OR_RETURN(
      std::optional<int64_t> tbs,
      BatchKey(root, "train_batch_size", av.train_batch_size, "the global batch size", true));
  STRATA_ASSIGN_OR_RETURN(
      std::optional<int64_t> mbs,
      BatchKey(root, "train_micro_batch_size_per_gpu", av.train_micro_batch_size_per_gpu,
               "the per-device batch size", false));
  STRATA_ASSIGN_OR_RETURN(
      std::optional<int64_t> gas,
      BatchKey(root, "gradient_accumulation_steps", av.gradient_accumulation_steps,
               "the gradient accumulation steps", false));
  const json* tbs_json = Find(root, "train_batch_size");
  if (tbs_json != nullptr && IsAuto(*tbs_json) && !tbs && !(mbs && gas)) {
    return InvalidArgumentError(
        "train_batch_size: \"auto\" needs the global batch size from the caller, or both "
        "train_micro_batch_size_per_gpu and gradient_accumulation_steps to derive it");
  }
  const std::string arithmetic_label =
      "train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * "
      "world_size";
  if (tbs && mbs && gas) {
    if (*tbs != *mbs * *gas * world) {
      return InvalidArgumentError(
          "train_batch_size: inconsistent batch keys: " + arithmetic_label + " requires " +
          std::to_string(*tbs) + " == " + std::to_string(*mbs) + " * " + std::to_string(*gas) +
          " * " + std::to_string(world) + " = " + std::to_string(*mbs * *gas * world));
    }
  } else if (tbs && mbs) {
    if (*tbs % (*mbs * world) != 0) {
      return InvalidArgumentError("gradient_accumulation_steps: cannot derive: train_batch_size " +
                                  std::to_string(*tbs) +
                                  " is not divisible by train_micro_batch_size_per_gpu * "
                                  "world_size = " +
                                  std::to_string(*mbs) + " * " + std::to_string(world) + " = " +
                                  std::to_string(*mbs * world));
    }
    gas = *tbs / (*mbs * world);
  } else if (tbs && gas) {
    if (*tbs % (*gas * world) != 0) {
      return InvalidArgumentError(
          "train_micro_batch_size_per_gpu: cannot derive: train_batch_size " +
          std::to_string(*tbs) +
          " is not divisible by gradient_accumulation_steps * "
          "world_size = " +
          std::to_string(*gas) + " * " + std::to_string(world) + " = " +
          std::to_string(*gas * world));
    }
    mbs = *tbs / (*gas * world);
  } else if (mbs && gas) {
    tbs = *mbs * *gas * world;
  } else if (tbs) {
    gas = 1;
    if (*tbs % world != 0) {
      return InvalidArgumentError(
          "train_micro_batch_size_per_gpu: cannot derive: "
          "train_batch_size " +
          std::to_string(*tbs) + " is not divisible by world_size " + std::to_string(world));
    }
    mbs = *tbs / world;
  } else if (mbs) {
    gas = 1;
    tbs = *mbs * world;
  } else {
    return InvalidArgumentError(
        "train_batch_size: no batch size given; set train_batch_size or "
        "train_micro_batch_size_per_gpu (any two of train_batch_size, "
        "train_micro_batch_size_per_gpu and gradient_accumulation_steps determine the third)");
  }
  config_.train_batch_size = *tbs;
  config_.train_micro_batch_size_per_gpu = *mbs;
  config_.gradient_accumulation_steps = *gas;
  return Status::Ok();
}

}  // namespace config_internal

std::span<const std::string_view> IgnoredKeys() { return config_internal::kIgnoredKeys; }

Result<Config> ParseConfig(std::string_view json_text, const ParseOptions& options) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(json_text.begin(), json_text.end());
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(options.source + ": not valid JSON: " + e.what());
  }
  config_internal::Parser parser(options);
  Result<Config> config = parser.Parse(root);
  if (!config.ok()) return config.status().WithContext(options.source);
  return config;
}

Result<Config> LoadConfigFile(const std::string& path, ParseOptions options) {
  options.source = path;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFoundError(path + ": config file not found");
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoErrorFromErrno(errno != 0 ? errno : EIO, "open config file " + path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return IoErrorFromErrno(errno, "read config file " + path);
  return ParseConfig(text.str(), options);
}

}  // namespace strata::runtime
