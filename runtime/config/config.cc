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

#include <algorithm>
#include <initializer_list>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/file_util.h"
#include "base/json_text.h"
#include "base/json_values.h"
#include "runtime/config/internal_parser.h"

namespace strata::runtime {
namespace config_internal {
namespace {

// Top-level sections and keys DeepSpeed defines that strata accepts and does not act on: one
// warning lists those present. Keep in sync with the README's config section.
constexpr std::string_view kIgnoredTopLevel[] = {
    "activation_checkpointing",
    "amp",
    "autotuning",
    "checkpoint",
    "comet",
    "communication_data_type",
    "comms_config",
    "comms_logger",
    "compile",
    "compression_training",
    "csv_monitor",
    "curriculum_learning",
    "data_efficiency",
    "data_parallel_size",
    "data_types",
    "dataloader_drop_last",
    "datastates_ckpt",
    "disable_allgather",
    "dump_state",
    "eigenvalue",
    "elasticity",
    "expert_parallel",
    "flops_profiler",
    "fp32_allreduce",
    "gradient_allreduce_op",
    "gradient_predivide_factor",
    "graph_harvesting",
    "hybrid_engine",
    "log_level",
    "managed_gradient_accumulation",
    "memory_breakdown",
    "monitor_config",
    "nebula",
    "pipeline",
    "pld",
    "prescale_gradients",
    "progressive_layer_drop",
    "quantize_training",
    "seq_parallel_communication_data_type",
    "sequence_parallel_size",
    "sparse_attention",
    "sparse_gradients",
    "tensor_parallel",
    "tensorboard",
    "timers",
    "torch_autocast",
    "use_data_before_expert_parallelism",
    "vocabulary_size",
    "wandb",
    "weight_quantization",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
};

// Ignored sections DeepSpeed validates strictly (pydantic, extra keys forbidden): their keys are
// checked, so a file DeepSpeed refuses is refused here too, naming the key.
struct StrictSection {
  std::string_view name;
  std::initializer_list<std::string_view> keys;
};
const StrictSection kStrictIgnoredSections[] = {
    {"tensorboard", {"enabled", "output_path", "job_name"}},
    {"csv_monitor", {"enabled", "output_path", "job_name"}},
    {"wandb", {"enabled", "group", "team", "project"}},
    {"comet",
     {"enabled", "samples_log_interval", "project", "workspace", "api_key", "experiment_name",
      "experiment_key", "online", "mode"}},
    {"comms_logger", {"enabled", "verbose", "prof_all", "debug", "prof_ops"}},
    {"hybrid_engine",
     {"enabled", "max_out_tokens", "inference_tp_size", "release_inference_cache", "pin_parameters",
      "tp_gather_partition_size", "enable_cuda_graph"}},
    {"compile",
     {"deepcompile", "free_activation", "free_activation_threshold", "offload_activation",
      "offload_activation_pin_memory", "offload_opt_states", "double_buffer", "symmetric_memory",
      "debug_log", "offload_parameters", "sync_before_reduce", "sync_after_reduce",
      "sync_before_allgather", "sync_after_allgather", "keep_int_input_tensors",
      "keep_all_input_tensors", "passes"}},
    {"tensor_parallel",
     {"dtype", "autotp_size", "tp_overlap_comm", "tensor_parallel", "tp", "injection_policy_tuple",
      "partition_config", "preset_model", "keep_module_on_host", "replace_with_kernel_inject",
      "kernel_inject"}},
};

// Keys inside the sections strata reads that it accepts and does not act on (a warning each).
constexpr std::string_view kIgnoredKeys[] = {
    // zero_optimization
    "zero_optimization.allgather_bucket_size",
    "zero_optimization.allgather_partitions",
    "zero_optimization.allgather_sequential",
    "zero_optimization.elastic_checkpoint",
    "zero_optimization.gather_16bit_weights_on_model_save",
    "zero_optimization.ignore_unused_parameters",
    "zero_optimization.leaf_module",
    "zero_optimization.legacy_stage1",
    "zero_optimization.load_from_fp32_weights",
    "zero_optimization.memory_efficient_linear",
    "zero_optimization.mics_hierarchical_params_gather",
    "zero_optimization.mics_shard_size",
    "zero_optimization.model_persistence_threshold",
    "zero_optimization.module_granularity_threshold",
    "zero_optimization.override_module_apply",
    "zero_optimization.pipeline_loading_checkpoint",
    "zero_optimization.reduce_scatter",
    "zero_optimization.round_robin_gradients",
    "zero_optimization.save_muon_momentum_buffer_in_memory",
    "zero_optimization.stage3_allgather_sequential",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save",
    "zero_optimization.stage3_model_persistence_threshold",
    "zero_optimization.stage3_module_granularity_threshold",
    "zero_optimization.stage3_use_all_reduce_for_fetch_params",
    "zero_optimization.use_all_reduce_for_fetch_params",
    "zero_optimization.use_multi_rank_bucket_allreduce",
    "zero_optimization.zero_hpz_partition_size",
    "zero_optimization.zero_quantized_gradients",
    "zero_optimization.zero_quantized_nontrainable_weights",
    "zero_optimization.zero_quantized_weights",
    "zero_optimization.zenflow",
    "zero_optimization.zeropp_loco_param",
    "zero_optimization.log_trace_cache_warnings",
    "zero_optimization.enable_sanity_checks",
    "zero_optimization.offload_optimizer.super_offload",
    "zero_optimization.offload_optimizer.cpuadam_cores_perc",
    // others
    "aio.use_gds",
    "fp16.fp16_master_weights_and_grads",
    "bf16.immediate_grad_update",
    "bf16.check_grad_overflow",
    "bf16.bf16_master_weights_and_grads",
    "bfloat16.immediate_grad_update",
    "bfloat16.check_grad_overflow",
    "bfloat16.bf16_master_weights_and_grads",
    "optimizer.legacy_fusion",
    "optimizer.params.torch_adam",
};

// The top-level keys strata reads.
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
                                         "steps_per_print",
                                         "strata"};

}  // namespace

std::string Number(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

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
  TopLevelKeys(root);
  ParseZero(root);
  ParseAio(root);
  ParseStrata(root);
  ParsePrecision(root);
  GradientClipping(root);
  ParseBatch(root);
  ParseOptimizer(root);
  ParseScheduler(root);
  Bool(root, "", "wall_clock_breakdown", &config_.wall_clock_breakdown);
  Int(root, "", "steps_per_print", 1, kIntMax, &config_.steps_per_print);
  if (errors_.size() == 1) return InvalidArgumentError(errors_[0]);
  if (!errors_.empty()) {
    std::string all = std::to_string(errors_.size()) + " problems:";
    for (const std::string& e : errors_) all += "\n  " + options_.source + ": " + e;
    return InvalidArgumentError(all);
  }
  return std::move(config_);
}

void Parser::Fail(const Status& status) { errors_.emplace_back(status.message()); }

bool Parser::Check(const Status& status) {
  if (status.ok()) return true;
  Fail(status);
  return false;
}

void Parser::Warn(std::string message) {
  config_.warnings.push_back(options_.source + ": " + message);
}

void Parser::Resolved(const std::string& path, const std::string& value, std::string_view why) {
  config_.auto_resolved.push_back(path + ": \"auto\" -> " + value + " (" + std::string(why) + ")");
}

void Parser::TopLevelKeys(const json& root) {
  std::vector<std::string_view> all_known(std::begin(kTopKeys), std::end(kTopKeys));
  all_known.insert(all_known.end(), std::begin(kIgnoredTopLevel), std::end(kIgnoredTopLevel));
  std::string ignored, unknown;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& key = it.key();
    if (std::find(std::begin(kTopKeys), std::end(kTopKeys), key) != std::end(kTopKeys)) continue;
    if (std::find(std::begin(kIgnoredTopLevel), std::end(kIgnoredTopLevel), key) !=
        std::end(kIgnoredTopLevel)) {
      ignored += (ignored.empty() ? "" : ", ") + key;
      continue;
    }
    // DeepSpeed ignores top-level keys it does not know; a near-miss of one it does know is
    // almost certainly a typo that would silently change the run, so that is an error.
    const std::string hint = DidYouMean(key, all_known);
    if (!hint.empty()) {
      Fail(key + ": unknown key" + hint);
    } else {
      unknown += (unknown.empty() ? "" : ", ") + key;
    }
  }
  if (!ignored.empty()) Warn("accepted but ignored by strata: " + ignored);
  for (const StrictSection& section : kStrictIgnoredSections) {
    const json* v = Find(root, section.name);
    if (v == nullptr) continue;
    if (!v->is_object()) {
      Fail(std::string(section.name) + ": expected an object, got " + v->dump());
      continue;
    }
    std::vector<std::string_view> keys(section.keys);
    for (auto it = v->begin(); it != v->end(); ++it) {
      if (std::find(keys.begin(), keys.end(), it.key()) != keys.end()) continue;
      Fail(JoinPath(section.name, it.key()) + ": unknown key" + DidYouMean(it.key(), keys) +
           " (DeepSpeed refuses it too)");
    }
  }
  if (!unknown.empty()) {
    Warn("not DeepSpeed config keys, ignored (as DeepSpeed ignores them): " + unknown);
  }
}

void Parser::Keys(const json& object, std::string_view path,
                  std::span<const std::string_view> known) {
  std::vector<std::string_view> ignored;
  const std::string prefix = path.empty() ? "" : std::string(path) + ".";
  for (std::string_view full : kIgnoredKeys) {
    if (!full.starts_with(prefix)) continue;
    std::string_view rest = full.substr(prefix.size());
    if (rest.find('.') == std::string_view::npos) ignored.push_back(rest);
  }
  std::vector<std::string_view> candidates(known.begin(), known.end());
  candidates.insert(candidates.end(), ignored.begin(), ignored.end());
  std::string ignored_present;
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string& key = it.key();
    if (std::find(ignored.begin(), ignored.end(), key) != ignored.end()) {
      ignored_present += (ignored_present.empty() ? "" : ", ") + JoinPath(path, key);
      continue;
    }
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    Fail(JoinPath(path, key) + ": unknown key" + DidYouMean(key, candidates));
  }
  if (!ignored_present.empty()) Warn("accepted but ignored by strata: " + ignored_present);
}

bool Parser::Double(const json& object, std::string_view path, std::string_view key, double min,
                    double max, double* out) {
  const json* v = Find(object, key);
  if (v == nullptr) return true;
  const std::string full = JoinPath(path, key);
  if (IsAuto(*v)) {
    Resolved(full, Number(*out), "DeepSpeed's default");
    return true;
  }
  Result<double> value = JsonDouble(*v, full, min, max);
  if (!Check(value.status())) return false;
  *out = *value;
  return true;
}

bool Parser::Bool(const json& object, std::string_view path, std::string_view key, bool* out) {
  const json* v = Find(object, key);
  if (v == nullptr) return true;
  const std::string full = JoinPath(path, key);
  if (IsAuto(*v)) {
    Resolved(full, *out ? "true" : "false", "DeepSpeed's default");
    return true;
  }
  Result<bool> value = JsonBool(*v, full);
  if (!Check(value.status())) return false;
  *out = *value;
  return true;
}

const json* Parser::Section(const json& parent, std::string_view path, std::string_view key) {
  const json* v = Find(parent, key);
  if (v == nullptr) return nullptr;
  if (!v->is_object()) {
    Fail(JoinPath(path, key) + ": expected an object, got " + v->dump());
    return nullptr;
  }
  return v;
}

void Parser::GradientClipping(const json& root) {
  const AutoValues& av = options_.auto_values;
  const std::string path = "gradient_clipping";
  const json* v = Find(root, path);
  if (v == nullptr) {
    // Absent: HF's Trainer clips at max_grad_norm itself; the value applies only when the user
    // gave it explicitly (the commands' --max-grad-norm).
    if (options_.given.gradient_clipping)
      config_.gradient_clipping = *options_.given.gradient_clipping;
    return;
  }
  if (IsAuto(*v)) {
    if (auto c =
            Auto(av.gradient_clipping, path, "the gradient clipping norm", "--max-grad-norm")) {
      config_.gradient_clipping = *c;
      Resolved(path, Number(*c),
               From(options_.given.gradient_clipping.has_value(), "--max-grad-norm"));
    }
    return;
  }
  Result<double> c = JsonDouble(*v, path, 0, kInf);
  if (!Check(c.status())) return;
  config_.gradient_clipping = *c;
  Match(path, *c, options_.given.gradient_clipping, "--max-grad-norm", Number(*c),
        Number(options_.given.gradient_clipping.value_or(0)));
}

namespace {

// micro-batch × accumulation × world size, saturating instead of overflowing (each factor may be
// as large as kMaxBatchFactor or the world size).
int64_t BatchProduct(int64_t micro_batch, int64_t accumulation, int64_t world) {
  const __int128 p = static_cast<__int128>(micro_batch) * accumulation * world;
  return p > kIntMax ? kIntMax : static_cast<int64_t>(p);
}

}  // namespace

std::optional<int64_t> Parser::BatchKey(const json& root, std::string_view key,
                                        const std::optional<int64_t>& auto_value,
                                        const std::optional<int64_t>& given, std::string_view what,
                                        std::string_view flag, bool derivable) {
  const json* v = Find(root, key);
  const std::string path(key);
  if (v == nullptr) return given;  // absent: a value the user gave applies
  if (IsAuto(*v)) {
    if (auto_value) {
      if (*auto_value < 1) {
        Fail(path + ": \"auto\" resolved to " + std::to_string(*auto_value) + ", expected >= 1");
        return std::nullopt;
      }
      Resolved(path, std::to_string(*auto_value),
               flag.empty() ? std::string(what) : From(given.has_value(), flag));
      return auto_value;
    }
    if (derivable) return std::nullopt;  // derived from the other two below
    return Auto(auto_value, path, what, flag);
  }
  Result<int64_t> value =
      JsonInt(*v, path, 1, key == "train_batch_size" ? kMaxTrainBatch : kMaxBatchFactor);
  if (!Check(value.status())) return std::nullopt;
  if (!flag.empty()) {
    Match(path, *value, given, flag, std::to_string(*value), std::to_string(given.value_or(0)));
  }
  return *value;
}

void Parser::ParseBatch(const json& root) {
  const AutoValues& av = options_.auto_values;
  const AutoValues& given = options_.given;
  const int64_t world = options_.world_size;
  if (world < 1) {
    Fail("world_size: expected >= 1");
    return;
  }
  const size_t errors_before = errors_.size();
  std::optional<int64_t> mbs = BatchKey(
      root, "train_micro_batch_size_per_gpu", av.train_micro_batch_size_per_gpu,
      given.train_micro_batch_size_per_gpu, "the per-device batch size", "--micro-batch", false);
  std::optional<int64_t> gas = BatchKey(
      root, "gradient_accumulation_steps", av.gradient_accumulation_steps,
      given.gradient_accumulation_steps, "the gradient accumulation steps", "--grad-accum", false);
  // HF's Trainer writes train_batch_size = world_size * micro-batch * accumulation for "auto".
  std::optional<int64_t> tbs_auto = av.train_batch_size;
  if (!tbs_auto && mbs && gas) tbs_auto = BatchProduct(*mbs, *gas, world);
  std::optional<int64_t> tbs = BatchKey(root, "train_batch_size", tbs_auto, std::nullopt,
                                        "micro-batch x accumulation x "
                                        "world size",
                                        "", true);
  if (errors_.size() != errors_before) return;
  const json* tbs_json = Find(root, "train_batch_size");
  if (tbs_json != nullptr && IsAuto(*tbs_json) && !tbs && !(mbs && gas)) {
    Fail(
        "train_batch_size: \"auto\" needs the global batch size, or both "
        "train_micro_batch_size_per_gpu and gradient_accumulation_steps to derive it");
    return;
  }
  const std::string arithmetic_label =
      "train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * "
      "world_size";
  if (tbs && mbs && gas) {
    if (*tbs != BatchProduct(*mbs, *gas, world)) {
      Fail("train_batch_size: inconsistent batch keys: " + arithmetic_label + " requires " +
           std::to_string(*tbs) + " == " + std::to_string(*mbs) + " * " + std::to_string(*gas) +
           " * " + std::to_string(world) + " = " + std::to_string(BatchProduct(*mbs, *gas, world)));
      return;
    }
  } else if (tbs && mbs) {
    if (*tbs % (*mbs * world) != 0) {
      Fail("gradient_accumulation_steps: cannot derive: train_batch_size " + std::to_string(*tbs) +
           " is not divisible by train_micro_batch_size_per_gpu * world_size = " +
           std::to_string(*mbs) + " * " + std::to_string(world) + " = " +
           std::to_string(*mbs * world));
      return;
    }
    gas = *tbs / (*mbs * world);
  } else if (tbs && gas) {
    if (*tbs % (*gas * world) != 0) {
      Fail("train_micro_batch_size_per_gpu: cannot derive: train_batch_size " +
           std::to_string(*tbs) +
           " is not divisible by gradient_accumulation_steps * world_size = " +
           std::to_string(*gas) + " * " + std::to_string(world) + " = " +
           std::to_string(*gas * world));
      return;
    }
    mbs = *tbs / (*gas * world);
  } else if (mbs && gas) {
    tbs = BatchProduct(*mbs, *gas, world);
  } else if (tbs) {
    gas = 1;
    if (*tbs % world != 0) {
      Fail("train_micro_batch_size_per_gpu: cannot derive: train_batch_size " +
           std::to_string(*tbs) + " is not divisible by world_size " + std::to_string(world));
      return;
    }
    mbs = *tbs / world;
  } else if (mbs) {
    gas = 1;
    tbs = *mbs * world;
  } else if (av.train_micro_batch_size_per_gpu) {
    // No batch key at all (DeepSpeed would refuse): the caller's micro-batch, as HF's Trainer
    // runs its dataloader with per_device_train_batch_size.
    mbs = *av.train_micro_batch_size_per_gpu;
    gas = av.gradient_accumulation_steps.value_or(1);
    tbs = BatchProduct(*mbs, *gas, world);
    Warn("no batch size keys: train_micro_batch_size_per_gpu " + std::to_string(*mbs) +
         ", gradient_accumulation_steps " + std::to_string(*gas) +
         " (--micro-batch, --grad-accum)");
  } else {
    Fail(
        "train_batch_size: no batch size given; set train_batch_size or "
        "train_micro_batch_size_per_gpu (any two of train_batch_size, "
        "train_micro_batch_size_per_gpu and gradient_accumulation_steps determine the third)");
    return;
  }
  // Derived values and products stay where the engine counts them without overflow.
  if (*tbs > kMaxTrainBatch || *mbs > kMaxBatchFactor || *gas > kMaxBatchFactor) {
    Fail("train_batch_size: " + arithmetic_label + " = " + std::to_string(*tbs) + " = " +
         std::to_string(*mbs) + " * " + std::to_string(*gas) + " * " + std::to_string(world) +
         ": expected train_batch_size <= 2^40 and the other two <= 2^30");
    return;
  }
  config_.train_batch_size = *tbs;
  config_.train_micro_batch_size_per_gpu = *mbs;
  config_.gradient_accumulation_steps = *gas;
}

}  // namespace config_internal

std::span<const std::string_view> IgnoredKeys() { return config_internal::kIgnoredKeys; }
std::span<const std::string_view> IgnoredSections() { return config_internal::kIgnoredTopLevel; }

AutoValues DefaultAutoValues() {
  AutoValues v;
  v.train_micro_batch_size_per_gpu = 8;
  v.gradient_accumulation_steps = 1;
  v.lr = 5e-5;
  v.weight_decay = 0.0;
  v.betas = std::make_pair(0.9, 0.999);
  v.eps = 1e-8;
  v.gradient_clipping = 1.0;
  v.fp16 = false;
  v.bf16 = false;
  v.warmup_num_steps = 0;
  return v;
}

// A DeepSpeed config is a few KB; anything this large is not one (/dev/zero, a wrong file).
constexpr uint64_t kMaxConfigBytes = 16ull << 20;

Result<Config> ParseConfig(std::string_view json_text, const ParseOptions& options) {
  // DeepSpeed reads configs with hjson, which allows comments: so do we. Duplicate keys are
  // refused, as DeepSpeed does ("stage": 3, "stage": 0 must not quietly mean stage 0).
  STRATA_ASSIGN_OR_RETURN(const nlohmann::json root,
                          ParseJsonText(json_text, options.source,
                                        {.max_bytes = kMaxConfigBytes, .allow_comments = true}));
  config_internal::Parser parser(options);
  Result<Config> config = parser.Parse(root);
  if (!config.ok()) return config.status().WithContext(options.source);
  return config;
}

Status ReadConfigFile(const std::string& path, std::string* text) {
  Status read = ReadSmallFile(path, kMaxConfigBytes, text, StatusCode::kInvalidArgument);
  if (read.code() == StatusCode::kNotFound) return NotFoundError(path + ": config file not found");
  return read;
}

Result<Config> LoadConfigFile(const std::string& path, ParseOptions options, std::string* text) {
  options.source = path;
  std::string read_text;
  STRATA_RETURN_IF_ERROR(ReadConfigFile(path, &read_text));
  Result<Config> config = ParseConfig(read_text, options);
  if (text != nullptr) *text = std::move(read_text);
  return config;
}

}  // namespace strata::runtime
