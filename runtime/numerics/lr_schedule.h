// Learning-rate schedules with DeepSpeed's names, parameters, defaults and formulas
// (deepspeed/runtime/lr_schedules.py): WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle,
// LRRangeTest; and Hugging Face's (transformers/optimization.py, get_scheduler), which its Trainer
// builds when the DeepSpeed config has no "scheduler" section: linear, cosine, constant,
// constant_with_warmup, cosine_with_min_lr (HfSchedulerTypes()).
//
// What is matched: the learning rate the DeepSpeed engine hands the optimizer for each step.
// DeepSpeed builds the scheduler before the first step; its constructor writes the initial lr into
// the optimizer WITHOUT calling step() (last_batch_iteration stays -1), and the engine calls
// scheduler.step() after every optimizer step that was applied (not after fp16 overflow steps,
// which are skipped). So with k = applied steps so far (`steps_taken`), the optimizer step that
// follows uses
//   k == 0: the constructor's value (WarmupLR/WarmupDecayLR: warmup_min_lr; WarmupCosineLR: 0.0;
//           OneCycle: cycle_min_lr; LRRangeTest: lr_range_test_min_lr), and
//   k >= 1: get_lr() with last_batch_iteration = k - 1.
// For WarmupLR (log) that means the second step also uses warmup_min_lr (log(1) = 0), exactly as
// DeepSpeed.
//
// Hugging Face's schedules are LambdaLR(optimizer, lambda): its constructor applies lambda(0) and
// the Trainer steps it after every applied optimizer step, so the step after k applied steps uses
// optimizer_lr × lambda(k), with the lambdas of transformers/optimization.py (cosine: num_cycles
// 0.5 by default; cosine_with_min_lr: the cosine scaled into [min_lr_rate, 1], min_lr_rate =
// min_lr / optimizer_lr when min_lr is given). Their params carry get_scheduler's argument names:
// num_warmup_steps, num_training_steps (linear and the cosines), num_cycles, min_lr, min_lr_rate.
//
// Every schedule is a pure function of the step count (a checkpoint needs only the step). The
// caller owns the count and must not advance it on skipped (overflow) steps.
//
// OneCycle with cycle_momentum (DeepSpeed's default true) also cycles the optimizer's betas:
// beta1 between cycle_max_mom and cycle_min_mom and beta2 fixed at 0.99 (DeepSpeed writes
// (mom, 0.99) into the param group). Betas() returns them; the engine applies them to Adam, AdamW
// and Lion. For optimizers without betas (Adagrad) momentum cycling is off, as in DeepSpeed.
//
// Parameters: DeepSpeed's constructor defaults (not its argparse defaults). Unknown parameters are
// errors naming the nearest valid one (Python would raise "unexpected keyword argument").
// Thread-safety: schedules are immutable; any thread may call them.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "base/status.h"

namespace strata::runtime {

// "scheduler": {type, params}. `params` has every "auto" already resolved; MakeLrSchedule
// (below) validates it, and ParseConfig calls it so a bad section fails early.
struct SchedulerConfig {
  std::string type;
  nlohmann::json params = nlohmann::json::object();
  // Where it came from, for the run's log (e.g. "--lr-scheduler"); not part of what it computes.
  std::string origin;
};

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // The learning rate used by the optimizer step that follows `steps_taken` completed (applied)
  // steps (0 for the first). REQUIRES: steps_taken >= 0.
  virtual double LearningRate(int64_t steps_taken) const = 0;
  // (beta1, beta2) for that step when the schedule drives them (OneCycle with cycle_momentum),
  // else nullopt (the optimizer keeps its own).
  virtual std::optional<std::pair<double, double>> Betas(int64_t /*steps_taken*/) const {
    return std::nullopt;
  }
  // DeepSpeed's type name, e.g. "WarmupLR", or Hugging Face's lr_scheduler_type, e.g. "cosine".
  virtual std::string_view name() const = 0;
};

// Hugging Face's lr_scheduler_type names strata implements, in get_scheduler's spelling.
std::span<const std::string_view> HfSchedulerTypes();
bool IsHfSchedulerType(std::string_view type);

// Builds the schedule named by config.type (case-sensitive, as DeepSpeed and get_scheduler) from
// config.params.
// `optimizer_lr` is the optimizer's lr (WarmupLR's default warmup_max_lr; WarmupCosineLR's peak).
// `optimizer_has_betas`: false for Adagrad (disables OneCycle momentum cycling).
// InvalidArgument with the key path ("scheduler.params.warmup_num_steps: ...") on an unknown type
// or parameter, a wrong type or an out-of-range value, or a missing required parameter.
Result<std::unique_ptr<LrSchedule>> MakeLrSchedule(const SchedulerConfig& config,
                                                   double optimizer_lr,
                                                   bool optimizer_has_betas = true);

// One line naming the schedule for a run's log, e.g. "cosine, 10 warmup steps of 100, peak
// 0.0003" or "constant 5e-05 (no scheduler)". REQUIRES: `config`, if set, builds (MakeLrSchedule).
std::string DescribeLrSchedule(const std::optional<SchedulerConfig>& config, double optimizer_lr);

}  // namespace strata::runtime
