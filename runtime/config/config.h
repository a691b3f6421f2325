// runtime/config/ is the lowest floor of runtime/: DeepSpeed JSON in, a plain Config out, no
// libtorch; the engine, plan and commands read the Config, nothing here reads them.
//
// The DeepSpeed JSON config, parsed and validated (ARCHITECTURE.md §7).
//
// strata is switched on by the same JSON a DeepSpeed ZeRO-Offload / ZeRO-Infinity job uses. Every
// key DeepSpeed documents for offload training is parsed with DeepSpeed's default; keys strata
// accepts but does not act on (IgnoredKeys()) give a warning in Config::warnings; anything else is
// an error. Errors are InvalidArgument and read
//   `<source>: <key.path>: <what was expected>, got <value>` or
//   `<source>: <key.path>: unknown key (did you mean "<nearest valid key>"?)`.
//
// One pass reports every problem: the error lists each bad key on its own line.
//
// Top level: sections strata reads are validated key by key; sections DeepSpeed defines but
// strata does not act on (monitoring, compile, hybrid_engine, ...) are accepted with one warning
// listing them; a key DeepSpeed does not know either is ignored with a warning (as DeepSpeed
// ignores it), unless it is a near-miss of a known key ("did you mean"), which is an error.
//
// Numbers: integer keys accept JSON integers, integral floats (1e9) and numeric strings ("5e8");
// float keys accept numbers and numeric strings. "auto" (as Hugging Face's integration writes it)
// is resolved as Hugging Face's Trainer does (its deepspeed.py): from ParseOptions::auto_values
// (the commands fill them from their flags, defaulting as TrainingArguments does) on the keys HF
// fills, and to DeepSpeed's default on any other key. Each resolution is one line of
// Config::auto_resolved. A key that holds an explicit value different from a value the user gave
// explicitly (ParseOptions::given, e.g. --lr) is an error, as HF's mismatch check.
//
// Deprecated DeepSpeed spellings are mapped with a warning: zero_optimization.cpu_offload ->
// offload_optimizer {"device": "cpu"}, cpu_offload_param -> offload_param {"device": "cpu"},
// cpu_offload_use_pin_memory -> both sections' pin_memory. sub_group_size 0 (DeepSpeed: every
// parameter its own sub-group) becomes one sub-group per offload unit, with a warning.
//
// strata's own settings live in a top-level "strata" section (StrataConfig), validated key by key
// like the sections above; DeepSpeed ignores unknown top-level keys, so the same file still runs
// under DeepSpeed.
//
// Deviation from DeepSpeed: offload_optimizer.pipeline_read/pipeline_write default to true
// (DeepSpeed: false), since strata's optimizer pipeline read(g+1) || step(g) || write(g-1) costs no
// extra correctness and is what makes NVMe offload fast. Set them false to serialize.
//
// Side effect: ParseConfig creates a missing nvme_path (mkdir -p) and checks that it is a writable
// directory. Thread-safety: the functions are reentrant; a Config is a plain value.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "cpu_optimizer/optimizer.h"
#include "runtime/numerics/loss_scaler.h"  // Fp16Config
#include "runtime/numerics/lr_schedule.h"  // SchedulerConfig
#include "tiers/tier.h"                    // Home

namespace strata::runtime {

// zero_optimization.offload_param (ZeRO-Infinity parameter offload; stage 3 only).
struct OffloadParamConfig {
  Home device = Home::kDevice;  // "none" (kDevice), "cpu", "nvme"
  std::string nvme_path;        // required (and created) when device is nvme
  int64_t buffer_count = 5;
  // Elements per pinned parameter buffer. Unset (absent, null or "auto"; DeepSpeed's default is
  // 1e8): strata sizes its buffers to the largest offload unit. Given, it must hold that unit.
  std::optional<int64_t> buffer_size;
  // Parameter elements kept in pinned host memory with device nvme (the leading offload units).
  // Unset: none, every unit on NVMe (DeepSpeed's default is 1e9, which keeps any model below a
  // billion parameters entirely in CPU memory; README lists it among the deviations).
  std::optional<int64_t> max_in_cpu;
  bool pin_memory = false;
};

// zero_optimization.offload_optimizer (ZeRO-Offload; nvme needs stage 3).
struct OffloadOptimizerConfig {
  Home device = Home::kDevice;
  std::string nvme_path;
  int64_t buffer_count = 4;
  bool pin_memory = false;
  bool pipeline_read = true;   // strata default; DeepSpeed's is false (see the file comment)
  bool pipeline_write = true;  // strata default; DeepSpeed's is false
  bool fast_init = false;
  double ratio = 1.0;  // [0, 1]; below 1 only with stage 3 (DeepSpeed's Twin-Flow)
};

struct ZeroConfig {
  int stage = 0;
  OffloadParamConfig offload_param;
  OffloadOptimizerConfig offload_optimizer;
  int64_t sub_group_size = 1'000'000'000;
  int64_t prefetch_bucket_size = 50'000'000;      // stage3_prefetch_bucket_size
  int64_t param_persistence_threshold = 100'000;  // stage3_param_persistence_threshold
  int64_t max_live_parameters = 1'000'000'000;    // stage3_max_live_parameters
  int64_t max_reuse_distance = 1'000'000'000;     // stage3_max_reuse_distance
  bool contiguous_gradients = true;
  bool overlap_comm = false;  // JSON null/absent -> stage == 3
  int64_t reduce_bucket_size = 500'000'000;
};

struct AioConfig {
  int64_t block_size = 1048576;
  int queue_depth = 8;
  int intra_op_parallelism = 1;  // legacy alias thread_count accepted with a warning
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;  // parsed; strata has no GDS path (listed as ignored: a warning)
};

struct Bf16Config {
  bool enabled = false;  // "bf16" or its alias "bfloat16"
  // bf16.bf16_optimizer_states: the optimizer's moments (Adam m and v, Adagrad's sum, Lion's m)
  // kept in bf16, rounded to nearest even after each update (DeepSpeed's DeepSpeedCPUAdam with
  // fp32_optimizer_states=False); the fp32 masters stay fp32. Read when bf16 is enabled.
  bool optimizer_states = false;
};

// "strata": settings DeepSpeed has no key for.
struct StrataConfig {
  // strata.swap_checksums: keep an XXH3 checksum of every block written to the NVMe swap files and
  // verify it on every read; a mismatch (bits flipped on the drive) ends the run with an error
  // naming the file and offset instead of training on corrupt state. Costs a hash per swap
  // transfer on the I/O threads; false turns it off.
  bool swap_checksums = true;
  // strata.comms_timeout_seconds: how long a collective between data-parallel ranks (and the
  // rendezvous) may wait before the run fails naming the rank that is missing (torch's
  // init_process_group(timeout=...)). 1 to 86400.
  int64_t comms_timeout_seconds = 300;
  // strata.offload_unit_classes: the Python package's offload units are the submodules of these
  // classes (names, or module.qualified names); empty: the model's _no_split_modules, else its
  // top-level children (python/strata/_units.py). The command's models have their own units.
  std::vector<std::string> offload_unit_classes;
  // strata.host_memory: the host budget, as --host-memory (which wins when given): "auto" (the
  // default rule, plan/memory_plan.h DefaultHostBudget), a size ("24G") of pinned host memory for
  // the arena and the host-RAM tier that keeps blocks in RAM instead of on NVMe, or "0" (none:
  // the arena only, every offloaded block on NVMe). Empty: not given ("0").
  std::string host_memory;
  // strata.lr_scheduler: Hugging Face's schedule for a config without a "scheduler" section, as
  // --lr-scheduler, --warmup-steps, --warmup-ratio, --min-lr and --min-lr-rate give it:
  // {"type", "warmup_steps", "warmup_ratio", "min_lr", "min_lr_rate"} (the total is the run's
  // steps). Set (the section merged with the flags, type resolved) whenever that schedule is used:
  // the command writes it into the config a checkpoint keeps, so a resumed run continues it.
  std::optional<nlohmann::json> lr_scheduler;
};

struct Config {
  ZeroConfig zero;
  AioConfig aio;
  Fp16Config fp16;
  Bf16Config bf16;
  StrataConfig strata;
  double gradient_clipping = 0;  // 0 = off
  // Resolved so that train_batch_size = micro × accumulation × world_size.
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;
  std::optional<cpu_optimizer::OptimizerOptions> optimizer;  // from "optimizer" {type, params}
  std::optional<SchedulerConfig> scheduler;
  bool wall_clock_breakdown = false;
  int steps_per_print = 10;
  std::vector<std::string> warnings;       // one line each, prefixed by the source
  std::vector<std::string> auto_resolved;  // `key: "auto" -> value (where from)`, one per key
};

// What a caller knows to resolve "auto" (as Hugging Face's Trainer fills the config in). The
// commands fill every field (flags, else TrainingArguments' defaults; DefaultAutoValues).
struct AutoValues {
  std::optional<int64_t> train_micro_batch_size_per_gpu, gradient_accumulation_steps,
      train_batch_size;
  std::optional<double> lr, weight_decay, gradient_clipping;
  std::optional<std::pair<double, double>> betas;
  std::optional<double> eps;
  std::optional<bool> fp16, bf16;      // for fp16.enabled / bf16.enabled = "auto"
  std::optional<int64_t> hidden_size;  // reduce_bucket_size, stage3_* thresholds
  std::optional<int64_t> total_num_steps, warmup_num_steps;
  // Hugging Face's schedule for a config without a "scheduler" section (strata.lr_scheduler):
  // lr_scheduler_type, warmup_ratio (warmup = ceil(ratio × total) unless warmup_num_steps > 0, as
  // TrainingArguments.get_warmup_steps), and cosine_with_min_lr's lr_scheduler_kwargs. Only
  // ParseOptions::given carries them: given any of them or warmup_num_steps, the run uses that
  // schedule (lr_scheduler_type "linear" when not given, TrainingArguments' default).
  std::optional<std::string> lr_scheduler_type;
  std::optional<double> warmup_ratio, min_lr, min_lr_rate;
};

// Hugging Face TrainingArguments' defaults for what "auto" asks (per_device_train_batch_size 8,
// gradient_accumulation_steps 1, learning_rate 5e-5, adam betas (0.9, 0.999), epsilon 1e-8,
// weight_decay 0, max_grad_norm 1.0, warmup_steps 0, fp16/bf16 off). hidden_size and
// total_num_steps are left unset: they depend on the model and the run.
AutoValues DefaultAutoValues();

struct ParseOptions {
  std::string source = "config";  // prefix of every message (LoadConfigFile: the path)
  int world_size = 1;
  AutoValues auto_values;
  // The values the user gave explicitly (flags): an explicit config value that differs is an
  // error; with the key absent from the config the given value applies.
  AutoValues given;
};

// Parses and validates a DeepSpeed JSON config. InvalidArgument as described atop this file.
Result<Config> ParseConfig(std::string_view json_text, const ParseOptions& options = {});
// Reads `path` (NotFound / IoError naming it) and parses it with source = path; `text`, when not
// null, receives the file's text (for a caller that keeps the config as given).
// The text of the config file at `path`, as every face reads it (the command's --config and
// strata.initialize(config=PATH)): a regular file of at most 16 MiB, opened without waiting (a
// FIFO is refused, not read), else kInvalidArgument naming the path and what it is; kNotFound
// when there is none.
Status ReadConfigFile(const std::string& path, std::string* text);
Result<Config> LoadConfigFile(const std::string& path, ParseOptions options = {},
                              std::string* text = nullptr);

// Keys inside the sections strata reads that it accepts but ignores, as "section.key" paths
// ("zero_optimization.reduce_scatter", "aio.use_gds").
std::span<const std::string_view> IgnoredKeys();
// Top-level sections and keys DeepSpeed defines that strata accepts but ignores ("tensorboard",
// "comms_logger", "compile", ...).
std::span<const std::string_view> IgnoredSections();

}  // namespace strata::runtime
