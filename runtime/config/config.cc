// Parsing the DeepSpeed JSON config.
//
// Algorithm: the text is parsed once by nlohmann::json (its exceptions are caught here, at the
// boundary, and become InvalidArgument with the byte position). Then each section is walked with
// a table of its valid keys: a key in the table is read with a typed reader (internal/
// json_values.h) that checks the type and range and writes the field, leaving DeepSpeed's default
// when the key is absent or null; a key listed in IgnoredKeys() gives a warning; any other key is
// an error suggesting the nearest valid key by edit distance. "auto" is resolved per key from
// ParseOptions::auto_values (the rules Hugging Face's integration uses). After the sections come
// the cross-key checks: stage vs. offload, nvme_path (created, must be writable), fp16 vs. bf16,
// batch-size derivation (tbs = mbs × gas × world), and the scheduler, built once by
// MakeLrSchedule so that its parameters are validated with its own rules. Every error is prefixed
// with the source name by ParseConfig.
#include "runtime/config/config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>

#include "base/json_values.h"
#include "runtime/engine/numerics/lr_schedule.h"

namespace strata::runtime {
namespace {

using nlohmann::json;

constexpr int64_t kIntMax = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

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
constexpr std::string_view kZeroKeys[] = {"stage",
                                          "offload_param",
                                          "offload_optimizer",
                                          "sub_group_size",
                                          "stage3_prefetch_bucket_size",
                                          "prefetch_bucket_size",
                                          "stage3_param_persistence_threshold",
                                          "param_persistence_threshold",
                                          "stage3_max_live_parameters",
                                          "max_live_parameters",
                                          "stage3_max_reuse_distance",
                                          "max_reuse_distance",
                                          "contiguous_gradients",
                                          "overlap_comm",
                                          "reduce_bucket_size",
                                          "cpu_offload",
                                          "cpu_offload_param",
                                          "cpu_offload_params",
                                          "cpu_offload_use_pin_memory"};
constexpr std::string_view kOffloadParamKeys[] = {"device",      "nvme_path",  "buffer_count",
                                                  "buffer_size", "max_in_cpu", "pin_memory"};
constexpr std::string_view kOffloadOptimizerKeys[] = {
    "device",         "nvme_path", "buffer_count", "pin_memory", "pipeline_read",
    "pipeline_write", "pipeline",  "fast_init",    "ratio"};
constexpr std::string_view kAioKeys[] = {"block_size",   "queue_depth",   "intra_op_parallelism",
                                         "thread_count", "single_submit", "overlap_events",
                                         "use_gds"};
constexpr std::string_view kFp16Keys[] = {"enabled",
                                          "auto_cast",
                                          "loss_scale",
                                          "initial_scale_power",
                                          "loss_scale_window",
                                          "hysteresis",
                                          "consecutive_hysteresis",
                                          "min_loss_scale",
                                          "fp16_master_weights_and_grads"};
constexpr std::string_view kBf16Keys[] = {"enabled", "immediate_grad_update"};
constexpr std::string_view kOptimizerKeys[] = {"type", "params"};
constexpr std::string_view kSchedulerKeys[] = {"type", "params"};
constexpr std::string_view kAdamParams[] = {
    "lr", "betas", "eps", "weight_decay", "bias_correction", "amsgrad", "adam_w_mode"};
constexpr std::string_view kAdagradParams[] = {"lr", "eps", "weight_decay", "lr_decay",
                                               "initial_accumulator_value"};
constexpr std::string_view kLionParams[] = {"lr", "betas", "weight_decay"};
// DeepSpeed optimizer types strata does not implement (for a clearer message than "unknown").
constexpr std::string_view kUnsupportedOptimizers[] = {
    "lamb",  "onebitadam", "zerooneadam", "onebitlamb", "muadam", "muadamw",
    "musgd", "sgd",        "fusedadam",   "cpuadam",    "muon"};

const json* Find(const json& object, std::string_view key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

class Parser {
 public:
  explicit Parser(const ParseOptions& options) : options_(options) {}

  Result<Config> Parse(const json& root) {
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

 private:
  void Warn(std::string message) { config_.warnings.push_back(options_.source + ": " + message); }

  // Checks `object`'s keys against `known` and the ignored keys under `path`; warns for each
  // ignored key present.
  Status Keys(const json& object, std::string_view path, std::span<const std::string_view> known) {
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

  Status NotAuto(const json& v, const std::string& path) {
    if (IsAuto(v)) return InvalidArgumentError(path + ": \"auto\" is not accepted for this key");
    return Status::Ok();
  }

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
                double max, double* out) {
    const json* v = Find(object, key);
    if (v == nullptr) return Status::Ok();
    const std::string full = JoinPath(path, key);
    STRATA_RETURN_IF_ERROR(NotAuto(*v, full));
    STRATA_ASSIGN_OR_RETURN(*out, JsonDouble(*v, full, min, max));
    return Status::Ok();
  }

  Status Bool(const json& object, std::string_view path, std::string_view key, bool* out) {
    const json* v = Find(object, key);
    if (v == nullptr) return Status::Ok();
    const std::string full = JoinPath(path, key);
    STRATA_RETURN_IF_ERROR(NotAuto(*v, full));
    STRATA_ASSIGN_OR_RETURN(*out, JsonBool(*v, full));
    return Status::Ok();
  }

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
  Result<const json*> Section(const json& parent, std::string_view path, std::string_view key) {
    const json* v = Find(parent, key);
    if (v == nullptr) return static_cast<const json*>(nullptr);
    if (!v->is_object()) {
      return InvalidArgumentError(JoinPath(path, key) + ": expected an object, got " + v->dump());
    }
    return v;
  }

  Result<OffloadDevice> Device(const json& object, const std::string& path) {
    const json* v = Find(object, "device");
    if (v == nullptr) return OffloadDevice::kNone;
    const std::string full = path + ".device";
    if (v->is_string()) {
      const std::string& s = v->get_ref<const std::string&>();
      if (s == "none") return OffloadDevice::kNone;
      if (s == "cpu") return OffloadDevice::kCpu;
      if (s == "nvme") return OffloadDevice::kNvme;
    }
    return InvalidArgumentError(full + ": expected \"none\", \"cpu\" or \"nvme\", got " +
                                v->dump());
  }

  // int64 key with an "auto" rule derived from the model's hidden size.
  Status HiddenSizeAuto(const json& zero, std::string_view key, std::string_view alias, int64_t min,
                        int64_t* out, int64_t (*from_hidden)(int64_t), std::string_view rule) {
    const std::string path = JoinPath("zero_optimization", key);
    const json* v = Find(zero, key);
    const json* a = alias.empty() ? nullptr : Find(zero, alias);
    if (v != nullptr && a != nullptr) {
      return InvalidArgumentError(path + ": given together with its alias zero_optimization." +
                                  std::string(alias) + "; keep one");
    }
    std::string used = path;
    if (v == nullptr && a != nullptr) {
      v = a;
      used = JoinPath("zero_optimization", alias);
    }
    if (v == nullptr) return Status::Ok();
    if (IsAuto(*v)) {
      if (from_hidden == nullptr) {
        return InvalidArgumentError(used + ": \"auto\" is not accepted for this key");
      }
      STRATA_ASSIGN_OR_RETURN(int64_t h,
                              Auto(options_.auto_values.hidden_size, used,
                                   "the model's hidden size (" + std::string(rule) + ")"));
      if (h < 1 || h > (int64_t{1} << 31)) {  // h*h must fit in int64
        return InvalidArgumentError(used + ": \"auto\" with hidden_size " + std::to_string(h) +
                                    ": expected a hidden size 1.." +
                                    std::to_string(int64_t{1} << 31));
      }
      *out = from_hidden(h);
      return Status::Ok();
    }
    STRATA_ASSIGN_OR_RETURN(*out, JsonInt(*v, used, min, kIntMax));
    return Status::Ok();
  }

  Status CheckNvmePath(const std::string& path_key, const std::string& dir) {
    std::error_code ec;
    if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec)) {
      return InvalidArgumentError(path_key + ": \"" + dir + "\" is not a directory");
    }
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      return InvalidArgumentError(path_key + ": cannot create directory \"" + dir + "\": " +
                                  ec.message() + " (errno " + std::to_string(ec.value()) + ")");
    }
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
      const int err = errno;
      return InvalidArgumentError(path_key + ": cannot stat \"" + dir + "\": " +
                                  std::strerror(err) + " (errno " + std::to_string(err) + ")");
    }
    if (!S_ISDIR(st.st_mode)) {
      return InvalidArgumentError(path_key + ": \"" + dir + "\" is not a directory");
    }
    if (::access(dir.c_str(), W_OK | X_OK) != 0) {
      const int err = errno;
      return InvalidArgumentError(path_key + ": directory \"" + dir + "\" is not writable: " +
                                  std::strerror(err) + " (errno " + std::to_string(err) + ")");
    }
    return Status::Ok();
  }

  Status ParseZero(const json& root) {
    STRATA_ASSIGN_OR_RETURN(const json* zero, Section(root, "", "zero_optimization"));
    ZeroConfig& z = config_.zero;
    if (zero == nullptr) {
      z.overlap_comm = false;
      return Status::Ok();
    }
    const std::string path = "zero_optimization";
    STRATA_RETURN_IF_ERROR(Keys(*zero, path, kZeroKeys));
    for (std::string_view old :
         {"cpu_offload", "cpu_offload_param", "cpu_offload_params", "cpu_offload_use_pin_memory"}) {
      if (zero->contains(old)) {
        return InvalidArgumentError(
            JoinPath(path, old) +
            ": deprecated in DeepSpeed and not accepted by strata; use "
            "zero_optimization.offload_optimizer / offload_param {\"device\": \"cpu\"}");
      }
    }
    STRATA_RETURN_IF_ERROR(Int(*zero, path, "stage", 0, 3, &z.stage));

    // offload_param
    STRATA_ASSIGN_OR_RETURN(const json* op, Section(*zero, path, "offload_param"));
    if (op != nullptr) {
      const std::string p = path + ".offload_param";
      OffloadParamConfig& c = z.offload_param;
      STRATA_RETURN_IF_ERROR(Keys(*op, p, kOffloadParamKeys));
      STRATA_ASSIGN_OR_RETURN(c.device, Device(*op, p));
      if (const json* v = Find(*op, "nvme_path")) {
        STRATA_ASSIGN_OR_RETURN(c.nvme_path, JsonString(*v, p + ".nvme_path"));
      }
      STRATA_RETURN_IF_ERROR(Int(*op, p, "buffer_count", 1, kIntMax, &c.buffer_count));
      STRATA_RETURN_IF_ERROR(Int(*op, p, "buffer_size", 1, kIntMax, &c.buffer_size));
      STRATA_RETURN_IF_ERROR(Int(*op, p, "max_in_cpu", 0, kIntMax, &c.max_in_cpu));
      STRATA_RETURN_IF_ERROR(Bool(*op, p, "pin_memory", &c.pin_memory));
      if (c.device != OffloadDevice::kNone && z.stage != 3) {
        return InvalidArgumentError(
            p + ".device: parameter offload (\"" + std::string(OffloadDeviceName(c.device)) +
            "\") needs zero_optimization.stage 3, got stage " + std::to_string(z.stage));
      }
      if (c.device == OffloadDevice::kNvme) {
        if (c.nvme_path.empty()) {
          return InvalidArgumentError(p + ".nvme_path: required when device is \"nvme\"");
        }
        STRATA_RETURN_IF_ERROR(CheckNvmePath(p + ".nvme_path", c.nvme_path));
      }
    }

    // offload_optimizer
    STRATA_ASSIGN_OR_RETURN(const json* oo, Section(*zero, path, "offload_optimizer"));
    if (oo != nullptr) {
      const std::string p = path + ".offload_optimizer";
      OffloadOptimizerConfig& c = z.offload_optimizer;
      STRATA_RETURN_IF_ERROR(Keys(*oo, p, kOffloadOptimizerKeys));
      STRATA_ASSIGN_OR_RETURN(c.device, Device(*oo, p));
      if (const json* v = Find(*oo, "nvme_path")) {
        STRATA_ASSIGN_OR_RETURN(c.nvme_path, JsonString(*v, p + ".nvme_path"));
      }
      STRATA_RETURN_IF_ERROR(Int(*oo, p, "buffer_count", 1, kIntMax, &c.buffer_count));
      STRATA_RETURN_IF_ERROR(Bool(*oo, p, "pin_memory", &c.pin_memory));
      if (const json* v = Find(*oo, "pipeline")) {  // DeepSpeed's legacy switch for both
        STRATA_ASSIGN_OR_RETURN(bool both, JsonBool(*v, p + ".pipeline"));
        c.pipeline_read = c.pipeline_write = both;
      }
      STRATA_RETURN_IF_ERROR(Bool(*oo, p, "pipeline_read", &c.pipeline_read));
      STRATA_RETURN_IF_ERROR(Bool(*oo, p, "pipeline_write", &c.pipeline_write));
      STRATA_RETURN_IF_ERROR(Bool(*oo, p, "fast_init", &c.fast_init));
      STRATA_RETURN_IF_ERROR(Double(*oo, p, "ratio", 0.0, 1.0, &c.ratio));
      if (c.device != OffloadDevice::kNone && z.stage == 0) {
        return InvalidArgumentError(p +
                                    ".device: optimizer offload needs zero_optimization.stage "
                                    "1, 2 or 3, got stage 0");
      }
      if (c.device == OffloadDevice::kNvme && z.stage != 3) {
        return InvalidArgumentError(p +
                                    ".device: optimizer offload to \"nvme\" needs "
                                    "zero_optimization.stage 3, got stage " +
                                    std::to_string(z.stage));
      }
      if (c.ratio < 1.0 && z.stage != 3) {
        return InvalidArgumentError(p +
                                    ".ratio: below 1 (partial offload) needs "
                                    "zero_optimization.stage 3, got stage " +
                                    std::to_string(z.stage));
      }
      if (c.device == OffloadDevice::kNvme) {
        if (c.nvme_path.empty()) {
          return InvalidArgumentError(p + ".nvme_path: required when device is \"nvme\"");
        }
        STRATA_RETURN_IF_ERROR(CheckNvmePath(p + ".nvme_path", c.nvme_path));
      }
    }

    STRATA_RETURN_IF_ERROR(Int(*zero, path, "sub_group_size", 1, kIntMax, &z.sub_group_size));
    STRATA_RETURN_IF_ERROR(HiddenSizeAuto(
        *zero, "stage3_prefetch_bucket_size", "prefetch_bucket_size", 0, &z.prefetch_bucket_size,
        [](int64_t h) { return static_cast<int64_t>(0.9 * static_cast<double>(h) * h); },
        "0.9 * hidden_size^2"));
    STRATA_RETURN_IF_ERROR(HiddenSizeAuto(
        *zero, "stage3_param_persistence_threshold", "param_persistence_threshold", 0,
        &z.param_persistence_threshold, [](int64_t h) { return 10 * h; }, "10 * hidden_size"));
    STRATA_RETURN_IF_ERROR(HiddenSizeAuto(*zero, "stage3_max_live_parameters",
                                          "max_live_parameters", 0, &z.max_live_parameters, nullptr,
                                          ""));
    STRATA_RETURN_IF_ERROR(HiddenSizeAuto(*zero, "stage3_max_reuse_distance", "max_reuse_distance",
                                          0, &z.max_reuse_distance, nullptr, ""));
    STRATA_RETURN_IF_ERROR(HiddenSizeAuto(
        *zero, "reduce_bucket_size", "", 1, &z.reduce_bucket_size, [](int64_t h) { return h * h; },
        "hidden_size^2"));
    STRATA_RETURN_IF_ERROR(Bool(*zero, path, "contiguous_gradients", &z.contiguous_gradients));
    z.overlap_comm = z.stage == 3;  // DeepSpeed: null -> true for stage 3 only
    STRATA_RETURN_IF_ERROR(Bool(*zero, path, "overlap_comm", &z.overlap_comm));
    return Status::Ok();
  }

  Status ParseAio(const json& root) {
    STRATA_ASSIGN_OR_RETURN(const json* aio, Section(root, "", "aio"));
    if (aio == nullptr) return Status::Ok();
    const std::string p = "aio";
    AioConfig& a = config_.aio;
    STRATA_RETURN_IF_ERROR(Keys(*aio, p, kAioKeys));
    STRATA_RETURN_IF_ERROR(Int(*aio, p, "block_size", 4096, int64_t{1} << 30, &a.block_size));
    if (a.block_size % 4096 != 0) {
      return InvalidArgumentError(
          "aio.block_size: expected a multiple of 4096 bytes (direct "
          "I/O alignment), got " +
          std::to_string(a.block_size));
    }
    STRATA_RETURN_IF_ERROR(Int(*aio, p, "queue_depth", 1, 4096, &a.queue_depth));
    std::optional<int> intra, threads;
    if (Find(*aio, "intra_op_parallelism") != nullptr) {
      int v = 0;
      STRATA_RETURN_IF_ERROR(Int(*aio, p, "intra_op_parallelism", 1, 64, &v));
      intra = v;
    }
    if (Find(*aio, "thread_count") != nullptr) {
      int v = 0;
      STRATA_RETURN_IF_ERROR(Int(*aio, p, "thread_count", 1, 64, &v));
      threads = v;
    }
    if (intra && threads && *intra != *threads) {
      return InvalidArgumentError("aio.thread_count: " + std::to_string(*threads) +
                                  " contradicts aio.intra_op_parallelism " +
                                  std::to_string(*intra) +
                                  " (thread_count is its legacy name); keep intra_op_parallelism");
    }
    if (threads) {
      Warn("aio.thread_count: legacy name, read as aio.intra_op_parallelism = " +
           std::to_string(*threads) + " (DeepSpeed ignores it silently); rename it");
    }
    a.intra_op_parallelism = intra ? *intra : threads ? *threads : a.intra_op_parallelism;
    STRATA_RETURN_IF_ERROR(Bool(*aio, p, "single_submit", &a.single_submit));
    STRATA_RETURN_IF_ERROR(Bool(*aio, p, "overlap_events", &a.overlap_events));
    STRATA_RETURN_IF_ERROR(Bool(*aio, p, "use_gds", &a.use_gds));
    return Status::Ok();
  }

  Result<bool> Enabled(const json& section, const std::string& path,
                       const std::optional<bool>& auto_value) {
    const json* v = Find(section, "enabled");
    if (v == nullptr) return false;
    if (IsAuto(*v)) return Auto(auto_value, path + ".enabled", "whether training runs in " + path);
    return JsonBool(*v, path + ".enabled");
  }

  Status ParsePrecision(const json& root) {
    STRATA_ASSIGN_OR_RETURN(const json* fp16, Section(root, "", "fp16"));
    if (fp16 != nullptr) {
      const std::string p = "fp16";
      Fp16Config& f = config_.fp16;
      STRATA_RETURN_IF_ERROR(Keys(*fp16, p, kFp16Keys));
      STRATA_ASSIGN_OR_RETURN(f.enabled, Enabled(*fp16, p, options_.auto_values.fp16));
      STRATA_RETURN_IF_ERROR(Bool(*fp16, p, "auto_cast", &f.auto_cast));
      STRATA_RETURN_IF_ERROR(Double(*fp16, p, "loss_scale", 0, kInf, &f.loss_scale));
      STRATA_RETURN_IF_ERROR(Int(*fp16, p, "initial_scale_power", 0, 127, &f.initial_scale_power));
      STRATA_RETURN_IF_ERROR(Int(*fp16, p, "loss_scale_window", 1, std::numeric_limits<int>::max(),
                                 &f.loss_scale_window));
      STRATA_RETURN_IF_ERROR(
          Int(*fp16, p, "hysteresis", 1, std::numeric_limits<int>::max(), &f.hysteresis));
      STRATA_RETURN_IF_ERROR(Bool(*fp16, p, "consecutive_hysteresis", &f.consecutive_hysteresis));
      STRATA_RETURN_IF_ERROR(Double(*fp16, p, "min_loss_scale", 0, kInf, &f.min_loss_scale));
      if (f.min_loss_scale <= 0) {
        return InvalidArgumentError("fp16.min_loss_scale: expected a number > 0, got 0");
      }
    }
    const bool has_bf16 = Find(root, "bf16") != nullptr;
    const bool has_alias = Find(root, "bfloat16") != nullptr;
    if (has_bf16 && has_alias) {
      return InvalidArgumentError("bfloat16: given together with its alias bf16; keep one");
    }
    const std::string key = has_alias ? "bfloat16" : "bf16";
    STRATA_ASSIGN_OR_RETURN(const json* bf16, Section(root, "", key));
    if (bf16 != nullptr) {
      STRATA_RETURN_IF_ERROR(CheckKeys(*bf16, key, kBf16Keys));
      if (bf16->contains("immediate_grad_update")) {
        Warn(key + ".immediate_grad_update: accepted but ignored by strata");
      }
      STRATA_ASSIGN_OR_RETURN(config_.bf16.enabled, Enabled(*bf16, key, options_.auto_values.bf16));
    }
    if (config_.fp16.enabled && config_.bf16.enabled) {
      return InvalidArgumentError(key + ".enabled: fp16 and bf16 are both enabled; enable one");
    }
    return Status::Ok();
  }

  // One batch key: nullopt when absent, null or an unresolvable "auto" on train_batch_size.
  Result<std::optional<int64_t>> BatchKey(const json& root, std::string_view key,
                                          const std::optional<int64_t>& auto_value,
                                          std::string_view what, bool derivable) {
    const json* v = Find(root, key);
    if (v == nullptr) return std::optional<int64_t>();
    const std::string path(key);
    if (IsAuto(*v)) {
      if (auto_value) {
        if (*auto_value < 1) {
          return InvalidArgumentError(path + ": \"auto\" resolved to " +
                                      std::to_string(*auto_value) + ", expected >= 1");
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

  Status ParseBatch(const json& root) {
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
        return InvalidArgumentError(
            "gradient_accumulation_steps: cannot derive: train_batch_size " + std::to_string(*tbs) +
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

  // An optimizer hyper-parameter: a number, or "auto" resolved from `auto_value`.
  Status OptDouble(const json& params, std::string_view key,
                   const std::optional<double>& auto_value, std::string_view what, double min,
                   double* out) {
    const json* v = Find(params, key);
    if (v == nullptr) return Status::Ok();
    const std::string path = JoinPath("optimizer.params", key);
    if (IsAuto(*v)) {
      STRATA_ASSIGN_OR_RETURN(*out, Auto(auto_value, path, what));
      return Status::Ok();
    }
    STRATA_ASSIGN_OR_RETURN(*out, JsonDouble(*v, path, min, kInf));
    return Status::Ok();
  }

  Status ParseOptimizer(const json& root) {
    STRATA_ASSIGN_OR_RETURN(const json* opt, Section(root, "", "optimizer"));
    if (opt == nullptr) return Status::Ok();
    STRATA_RETURN_IF_ERROR(Keys(*opt, "optimizer", kOptimizerKeys));
    const json* type_json = Find(*opt, "type");
    if (type_json == nullptr) {
      return InvalidArgumentError("optimizer.type: required (one of Adam, AdamW, Adagrad, Lion)");
    }
    STRATA_ASSIGN_OR_RETURN(std::string type_name, JsonString(*type_json, "optimizer.type"));
    const std::string type = Lower(type_name);
    using cpu_optimizer::OptimizerType;
    cpu_optimizer::OptimizerOptions o;
    std::span<const std::string_view> known;
    if (type == "adam" || type == "adamw") {
      o.type = OptimizerType::kAdamW;
      known = kAdamParams;
    } else if (type == "adagrad") {
      o.type = OptimizerType::kAdagrad;
      o.lr = 1e-2;  // DeepSpeedCPUAdagrad's defaults
      o.eps = 1e-10;
      known = kAdagradParams;
    } else if (type == "lion") {
      o.type = OptimizerType::kLion;  // DeepSpeedCPULion: lr 1e-3, betas (0.9, 0.999)
      known = kLionParams;
    } else {
      const bool deepspeed_type =
          std::find(std::begin(kUnsupportedOptimizers), std::end(kUnsupportedOptimizers), type) !=
          std::end(kUnsupportedOptimizers);
      return InvalidArgumentError("optimizer.type: " + type_json->dump() +
                                  (deepspeed_type
                                       ? " is a DeepSpeed optimizer strata does not support"
                                       : " is not a known optimizer") +
                                  "; supported: Adam, AdamW, Adagrad, Lion (case-insensitive)");
    }
    // DeepSpeed's CPU optimizers default weight_decay to 0 (unlike torch.optim.AdamW).
    o.weight_decay = 0.0;

    STRATA_ASSIGN_OR_RETURN(const json* params, Section(*opt, "optimizer", "params"));
    static const json kEmpty = json::object();
    const json& p = params != nullptr ? *params : kEmpty;
    const std::string pp = "optimizer.params";
    if (p.contains("max_grad_norm")) {
      return InvalidArgumentError(pp +
                                  ".max_grad_norm: not accepted in optimizer params (as in "
                                  "DeepSpeed); use the top-level \"gradient_clipping\"");
    }
    STRATA_RETURN_IF_ERROR(Keys(p, pp, known));
    const AutoValues& av = options_.auto_values;
    STRATA_RETURN_IF_ERROR(OptDouble(p, "lr", av.lr, "the learning rate", 0, &o.lr));
    STRATA_RETURN_IF_ERROR(OptDouble(p, "eps", av.eps, "the epsilon (adam_epsilon)", 0, &o.eps));
    STRATA_RETURN_IF_ERROR(
        OptDouble(p, "weight_decay", av.weight_decay, "the weight decay", 0, &o.weight_decay));
    if (const json* b = Find(p, "betas")) {
      const std::string path = pp + ".betas";
      if (IsAuto(*b)) {
        STRATA_ASSIGN_OR_RETURN(auto betas,
                                Auto(av.betas, path, "the betas (adam_beta1, adam_beta2)"));
        o.beta1 = betas.first;
        o.beta2 = betas.second;
      } else {
        if (!b->is_array() || b->size() != 2) {
          return InvalidArgumentError(path + ": expected [beta1, beta2], got " + b->dump());
        }
        STRATA_ASSIGN_OR_RETURN(o.beta1, JsonDouble((*b)[0], path + "[0]", 0, 1));
        STRATA_ASSIGN_OR_RETURN(o.beta2, JsonDouble((*b)[1], path + "[1]", 0, 1));
      }
    }
    STRATA_RETURN_IF_ERROR(Bool(p, pp, "bias_correction", &o.bias_correction));
    if (type == "adam") {
      bool adam_w_mode = true;  // DeepSpeed's default: "Adam" means decoupled weight decay
      STRATA_RETURN_IF_ERROR(Bool(p, pp, "adam_w_mode", &adam_w_mode));
      o.type = adam_w_mode ? OptimizerType::kAdamW : OptimizerType::kAdam;
    } else if (type == "adamw" && p.contains("adam_w_mode")) {
      bool adam_w_mode = true;
      STRATA_RETURN_IF_ERROR(Bool(p, pp, "adam_w_mode", &adam_w_mode));
      if (!adam_w_mode) {
        Warn(pp + ".adam_w_mode: false is overridden by type AdamW (as in DeepSpeed)");
      }
    }
    bool amsgrad = false;
    STRATA_RETURN_IF_ERROR(Bool(p, pp, "amsgrad", &amsgrad));
    if (amsgrad) {
      return InvalidArgumentError(pp +
                                  ".amsgrad: true is not supported (neither does "
                                  "DeepSpeed's CPU Adam); remove it or set false");
    }
    STRATA_RETURN_IF_ERROR(Double(p, pp, "lr_decay", 0, kInf, &o.lr_decay));
    STRATA_RETURN_IF_ERROR(
        Double(p, pp, "initial_accumulator_value", 0, kInf, &o.initial_accumulator_value));
    if (Status s = o.Validate(); !s.ok()) return s.WithContext(pp);
    config_.optimizer = o;
    return Status::Ok();
  }

  Status ParseScheduler(const json& root) {
    STRATA_ASSIGN_OR_RETURN(const json* sched, Section(root, "", "scheduler"));
    if (sched == nullptr) return Status::Ok();
    STRATA_RETURN_IF_ERROR(Keys(*sched, "scheduler", kSchedulerKeys));
    const json* type_json = Find(*sched, "type");
    if (type_json == nullptr) {
      return InvalidArgumentError(
          "scheduler.type: required (WarmupLR, WarmupDecayLR, "
          "WarmupCosineLR, OneCycle or LRRangeTest)");
    }
    SchedulerConfig sc;
    STRATA_ASSIGN_OR_RETURN(sc.type, JsonString(*type_json, "scheduler.type"));
    STRATA_ASSIGN_OR_RETURN(const json* params, Section(*sched, "scheduler", "params"));
    if (params != nullptr) sc.params = *params;
    const AutoValues& av = options_.auto_values;
    for (auto it = sc.params.begin(); it != sc.params.end(); ++it) {
      if (!IsAuto(*it)) continue;
      const std::string path = "scheduler.params." + it.key();
      if (it.key() == "warmup_min_lr") {
        *it = 0.0;  // Hugging Face fills 0
      } else if (it.key() == "warmup_max_lr") {
        STRATA_ASSIGN_OR_RETURN(double lr, Auto(av.lr, path, "the learning rate"));
        *it = lr;
      } else if (it.key() == "warmup_num_steps") {
        STRATA_ASSIGN_OR_RETURN(int64_t n,
                                Auto(av.warmup_num_steps, path, "the number of warmup steps"));
        *it = n;
      } else if (it.key() == "total_num_steps") {
        STRATA_ASSIGN_OR_RETURN(int64_t n,
                                Auto(av.total_num_steps, path, "the total number of steps"));
        *it = n;
      } else {
        return InvalidArgumentError(path + ": \"auto\" is not accepted for this key");
      }
    }
    const double lr = config_.optimizer ? config_.optimizer->lr : 1e-3;
    const bool has_betas =
        !config_.optimizer || config_.optimizer->type != cpu_optimizer::OptimizerType::kAdagrad;
    STRATA_ASSIGN_OR_RETURN(auto schedule, MakeLrSchedule(sc, lr, has_betas));
    (void)schedule;
    config_.scheduler = std::move(sc);
    return Status::Ok();
  }

  const ParseOptions& options_;
  Config config_;
};

}  // namespace

std::string_view OffloadDeviceName(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "?";
}

std::span<const std::string_view> IgnoredKeys() { return kIgnoredKeys; }

Result<Config> ParseConfig(std::string_view json_text, const ParseOptions& options) {
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    return InvalidArgumentError(options.source + ": not valid JSON: " + e.what());
  }
  Parser parser(options);
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
