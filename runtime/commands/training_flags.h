// The flags with which a user answers a DeepSpeed config's "auto" values, shared by the commands
// that read a config (`strata train`, `strata estimate`): --micro-batch, --grad-accum, --lr,
// --warmup-steps, --max-grad-norm, --bf16, --fp16, and Hugging Face's schedule for a config
// without a "scheduler" section: --lr-scheduler, --warmup-ratio, --min-lr, --min-lr-rate
// (AutoValues, runtime/config/config.h). They play the part of Hugging Face's
// TrainingArguments: a flag not given takes TrainingArguments' default for "auto"
// (DefaultAutoValues); a flag given also fills a key the config leaves out, and must agree with
// a key the config sets (runtime/config/config.h).
//
// Thread-safety: set up and read on the main thread.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"
#include "runtime/config/config.h"
#include "runtime/plan/machine_info.h"

namespace strata::runtime {

struct ModelSpec;

class TrainingFlags {
 public:
  // Adds the flags to `cmd`. REQUIRES: called once; `this` outlives the parse.
  void Add(CLI::App& cmd);

  // ParseOptions for the config: auto_values = the flags over DefaultAutoValues() plus what the
  // command knows (`hidden_size` of the model, `total_steps` of the run); given = the flags given.
  ParseOptions MakeParseOptions(std::optional<int64_t> hidden_size,
                                std::optional<int64_t> total_steps) const;

 private:
  int64_t micro_batch_ = 0, grad_accum_ = 0, warmup_steps_ = 0;
  double lr_ = 0, max_grad_norm_ = 0, warmup_ratio_ = 0, min_lr_ = 0, min_lr_rate_ = 0;
  std::string lr_scheduler_;
  bool bf16_ = false, fp16_ = false;
  CLI::Option *micro_batch_opt_ = nullptr, *grad_accum_opt_ = nullptr, *warmup_steps_opt_ = nullptr,
              *lr_opt_ = nullptr, *max_grad_norm_opt_ = nullptr, *bf16_opt_ = nullptr,
              *fp16_opt_ = nullptr, *lr_scheduler_opt_ = nullptr, *warmup_ratio_opt_ = nullptr,
              *min_lr_opt_ = nullptr, *min_lr_rate_opt_ = nullptr;
};

// The flags that say what a run may use of the machine, the same for every command that computes
// (`strata train`, `strata eval`, `strata bench step`): --device, --device-memory, --host-memory,
// --threads. One binder, so their names, help and checks cannot drift apart. A null pointer leaves
// that flag out. REQUIRES: the pointees outlive the parse.
struct ResourceFlagTargets {
  std::string* device = nullptr;         // auto | host | cuda | cuda:N
  std::string* device_memory = nullptr;  // bytes, e.g. 2G ("" or 0: the default)
  std::string* host_memory = nullptr;    // auto, or bytes, e.g. 64M (0: no tier, no limit)
  int* threads = nullptr;                // 0: every core
  // What --threads drives, for its help: "Compute and optimizer threads" or "Compute threads".
  std::string threads_help = "Compute and optimizer threads";
};
void AddResourceFlags(CLI::App& cmd, const ResourceFlagTargets& targets);

// What a --host-memory (or strata.host_memory) value gives, the same for every command that takes
// it: the host memory of this machine's ranks together (memory_plan.h HostBeside: the arena, the
// host-RAM tier and the processes). A size is a cap and the tier's budget (0: neither);
// "auto" (`automatic`) is DefaultHostBudget of `host`'s usable memory, or 0 when `host` could not
// be read, and caps nothing. A bad size is the ParseBytes error.
struct HostBudget {
  uint64_t budget = 0;
  bool automatic = false;
};
// The host budget a command takes when neither --host-memory nor strata.host_memory gives one:
// STRATA_HOST_MEMORY where set (a machine's or a job's default), else "auto".
std::string DefaultHostMemorySpec();
Result<HostBudget> ParseHostBudget(const std::string& spec, const Result<HostMemory>& host);

// --page-experts, the same for every command that runs a model through the engine (`strata
// train`, `strata eval`, `strata generate`): each expert of a mixture of experts (and each
// layer's attention, dense MLP and shared expert) is an offload unit of its own, so a forward
// gathers only the experts its tokens were routed to (LlamaShape::page_experts). REQUIRES:
// `page_experts` outlives the parse.
void AddPageExpertsFlag(CLI::App& cmd, bool* page_experts);
// Applies --page-experts to the resolved model `spec` (named `model` as the user gave it):
// kInvalidArgument when the model has no experts (a GPT preset, a dense Llama-family model);
// nothing to do when `page_experts` is false.
Status ApplyPageExperts(bool page_experts, const std::string& model, ModelSpec& spec);

// The refusal of --page-experts with more than one rank (train's --nproc, ranks started by
// torchrun, estimate's --nproc): kInvalidArgument saying why and what to do instead.
Status PageExpertsRanksError();

}  // namespace strata::runtime
