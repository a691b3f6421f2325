#include "runtime/commands/training_flags.h"

#include <string>
#include <string_view>
#include <vector>

#include "base/bytes.h"
#include "base/env.h"
#include "runtime/commands/flag_checks.h"
#include "runtime/numerics/lr_schedule.h"
#include "runtime/plan/memory_plan.h"
#include "runtime/plan/model_spec.h"

namespace strata::runtime {

void TrainingFlags::Add(CLI::App& cmd) {
  micro_batch_opt_ =
      cmd.add_option("--micro-batch", micro_batch_,
                     "Per-device micro-batch: train_micro_batch_size_per_gpu for \"auto\" or an "
                     "absent key (default 8, as Hugging Face's Trainer)")
          ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  grad_accum_opt_ = cmd.add_option("--grad-accum", grad_accum_,
                                   "gradient_accumulation_steps for \"auto\" (default 1)")
                        ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  lr_opt_ = cmd.add_option("--lr", lr_,
                           "Learning rate for \"auto\" (optimizer lr, warmup_max_lr; default 5e-5)")
                ->check(flags::Real(0, 1e38, /*min_open=*/true));
  warmup_steps_opt_ =
      cmd.add_option("--warmup-steps", warmup_steps_,
                     "Warmup steps: the scheduler's warmup_num_steps for \"auto\" (default 0); "
                     "without a scheduler section, Hugging Face's schedule (--lr-scheduler, "
                     "default linear)")
          ->check(flags::Count(0));
  warmup_ratio_opt_ =
      cmd.add_option("--warmup-ratio", warmup_ratio_,
                     "Warmup as a fraction of the run's steps (ceil(ratio x steps)), as "
                     "--warmup-steps; --warmup-steps > 0 overrides it (as Hugging Face's)")
          ->check(flags::Real(0, 1));
  std::string types;
  for (std::string_view t : HfSchedulerTypes())
    types += (types.empty() ? "" : "|") + std::string(t);
  lr_scheduler_opt_ =
      cmd.add_option("--lr-scheduler", lr_scheduler_,
                     "Hugging Face's lr_scheduler_type (" + types +
                         ") when the config has no scheduler section (none and no warmup "
                         "flag: constant lr)")
          ->check(CLI::IsMember(
              std::vector<std::string>(HfSchedulerTypes().begin(), HfSchedulerTypes().end())));
  min_lr_opt_ = cmd.add_option("--min-lr", min_lr_,
                               "cosine_with_min_lr: the lr the cosine ends at (Hugging Face's "
                               "lr_scheduler_kwargs min_lr)")
                    ->check(flags::Real(0, 1e3));
  min_lr_rate_opt_ = cmd.add_option("--min-lr-rate", min_lr_rate_,
                                    "cosine_with_min_lr: the end lr as a fraction of --lr "
                                    "(lr_scheduler_kwargs min_lr_rate)")
                         ->check(flags::Real(0, 1));
  min_lr_opt_->excludes(min_lr_rate_opt_);
  max_grad_norm_opt_ =
      cmd.add_option("--max-grad-norm", max_grad_norm_,
                     "gradient_clipping for \"auto\" or an absent key (default 1.0; 0 = off)")
          ->check(flags::Real(0, 1e12));
  bf16_opt_ = cmd.add_flag("--bf16", bf16_, "bf16 mixed precision (bf16.enabled \"auto\" -> true)");
  fp16_opt_ = cmd.add_flag(
      "--fp16", fp16_, "fp16 mixed precision with loss scaling (fp16.enabled \"auto\" -> true)");
  bf16_opt_->excludes(fp16_opt_);
}

ParseOptions TrainingFlags::MakeParseOptions(std::optional<int64_t> hidden_size,
                                             std::optional<int64_t> total_steps) const {
  ParseOptions o;
  AutoValues& given = o.given;
  auto set = [](const CLI::Option* opt) { return opt != nullptr && opt->count() > 0; };
  if (set(micro_batch_opt_)) given.train_micro_batch_size_per_gpu = micro_batch_;
  if (set(grad_accum_opt_)) given.gradient_accumulation_steps = grad_accum_;
  if (set(lr_opt_)) given.lr = lr_;
  if (set(warmup_steps_opt_)) given.warmup_num_steps = warmup_steps_;
  if (set(warmup_ratio_opt_)) given.warmup_ratio = warmup_ratio_;
  if (set(lr_scheduler_opt_)) given.lr_scheduler_type = lr_scheduler_;
  if (set(min_lr_opt_)) given.min_lr = min_lr_;
  if (set(min_lr_rate_opt_)) given.min_lr_rate = min_lr_rate_;
  if (set(max_grad_norm_opt_)) given.gradient_clipping = max_grad_norm_;
  if (set(bf16_opt_)) given.bf16 = bf16_;
  if (set(fp16_opt_)) given.fp16 = fp16_;

  AutoValues& av = o.auto_values;
  av = DefaultAutoValues();
  if (given.train_micro_batch_size_per_gpu) {
    av.train_micro_batch_size_per_gpu = given.train_micro_batch_size_per_gpu;
  }
  if (given.gradient_accumulation_steps) {
    av.gradient_accumulation_steps = given.gradient_accumulation_steps;
  }
  if (given.lr) av.lr = given.lr;
  if (given.warmup_num_steps) av.warmup_num_steps = given.warmup_num_steps;
  if (given.gradient_clipping) av.gradient_clipping = given.gradient_clipping;
  av.warmup_ratio = given.warmup_ratio;
  av.lr_scheduler_type = given.lr_scheduler_type;
  av.min_lr = given.min_lr;
  av.min_lr_rate = given.min_lr_rate;
  if (given.bf16) av.bf16 = given.bf16;
  if (given.fp16) av.fp16 = given.fp16;
  av.hidden_size = hidden_size;
  av.total_num_steps = total_steps;
  return o;
}

void AddResourceFlags(CLI::App& cmd, const ResourceFlagTargets& t) {
  if (t.device != nullptr) {
    cmd.add_option("--device", *t.device,
                   "Where the model computes: auto (a GPU when one is visible, else the host), "
                   "cuda, cuda:N, or host (the emulated device; libtorch on the CPU)")
        ->check(flags::DeviceSpec());
  }
  if (t.device_memory != nullptr) {
    cmd.add_option("--device-memory", *t.device_memory,
                   "Device memory for strata's parameter copies, e.g. 2G (default: host: all "
                   "parameters fit; a GPU: its free memory less the activations and 1 GiB)")
        ->check(flags::ByteSize(0, flags::kMaxBytes));
  }
  if (t.host_memory != nullptr) {
    cmd.add_option("--host-memory", *t.host_memory,
                   "Host memory the run may take (this machine's ranks together), e.g. 24G: "
                   "the process (512 MiB), the host-emulated device's memory, the pinned arena, "
                   "and a host-RAM tier of what they leave, which keeps gradient accumulators, "
                   "then parameters, then optimizer state in RAM instead of on NVMe; a run that "
                   "needs more is refused, naming the need. auto (default; or strata.host_memory): "
                   "MemAvailable (or the cgroup's limit) less max(1/4, 2 GiB), sizing the tier "
                   "only. 0: no tier, no limit (every offloaded block on NVMe, as DeepSpeed)")
        ->check(flags::ByteSizeOrAuto(0, flags::kMaxBytes));
  }
  if (t.threads != nullptr) {
    cmd.add_option("--threads", *t.threads, t.threads_help + " (default: all cores)")
        ->check(flags::Threads(0));
  }
}

void AddPageExpertsFlag(CLI::App& cmd, bool* page_experts) {
  cmd.add_flag("--page-experts", *page_experts,
               "Mixtures of experts (Mixtral, Qwen2-MoE): page each expert on its own, so a "
               "forward reads only the experts its tokens were routed to and a training step "
               "hands off and updates only those (each layer's attention and dense MLP become "
               "units of their own too); losses and tokens are the same as without it");
}

Status ApplyPageExperts(bool page_experts, const std::string& model, ModelSpec& spec) {
  if (!page_experts) return Status::Ok();
  if (!spec.llama || spec.llama->num_experts == 0) {
    return InvalidArgumentError("--page-experts needs a mixture of experts (Mixtral, Qwen2-MoE); " +
                                model + " has no experts");
  }
  spec.llama->page_experts = true;
  return Status::Ok();
}

Status PageExpertsRanksError() {
  // Each rank gathers the experts its own tokens chose, and a gather of a partitioned unit is a
  // collective every rank must join: ranks routing differently would call different collectives.
  return InvalidArgumentError(
      "--page-experts runs on one rank only for now: each rank gathers the experts its own tokens "
      "are routed to, and those gathers are collectives every rank must join. Train on one rank "
      "with --page-experts (a larger --micro-batch or --grad-accum gives the same global batch), "
      "or on several ranks without it (whole layers)");
}

std::string DefaultHostMemorySpec() {
  const char* env = GetEnv("STRATA_HOST_MEMORY");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string("auto");
}

Result<HostBudget> ParseHostBudget(const std::string& spec, const Result<HostMemory>& host) {
  HostBudget out;
  if (spec == "auto") {
    out.automatic = true;
    if (host.ok()) out.budget = DefaultHostBudget(host->usable());
    return out;
  }
  STRATA_ASSIGN_OR_RETURN(out.budget, ParseBytes(spec));
  return out;
}

}  // namespace strata::runtime
