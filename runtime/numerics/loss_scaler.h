// fp16 loss scaling with DeepSpeed's semantics (deepspeed/runtime/fp16/loss_scaler.py).
//
// Static (fp16.loss_scale > 0): the scale never changes. Dynamic (loss_scale 0, DeepSpeed's
// DynamicLossScaler): starts at 2^initial_scale_power; on an overflow step, if the hysteresis
// budget is spent (hysteresis == 1 or one left) the scale is halved, never below min_loss_scale,
// else one unit of hysteresis is used up; after loss_scale_window consecutive clean steps since the
// last overflow the scale doubles and the hysteresis budget is refilled. With
// consecutive_hysteresis every clean step refills it. Overflow steps are skipped in both modes
// (the engine checks the gradients for inf/NaN; the scaler only decides the scale).
//
// With fp16 disabled the scaler is static with scale 1 (DeepSpeed builds the same for fp32/bf16).
//
// Deviation: where DeepSpeed raises "Current loss scale already at minimum" (an overflow that must
// halve a scale already at min_loss_scale), Update() keeps the scale at the floor, skips the step
// and sets overflow_at_min_scale(); the engine decides whether to stop.
//
// The state is four numbers (State) so a checkpoint can restore it exactly. Thread-safety: a
// value type; one thread at a time per object.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace strata::runtime {

// DeepSpeed's "fp16" section (runtime/config parses it; defaults are DeepSpeed's).
struct Fp16Config {
  bool enabled = false;
  bool auto_cast = false;
  double loss_scale = 0;  // 0 = dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;
};

class LossScaler {
 public:
  // InvalidArgument (naming the fp16 key) for a negative/non-finite loss_scale, window or
  // hysteresis < 1, min_loss_scale <= 0, or initial_scale_power outside 0..127.
  static Result<LossScaler> Create(const Fp16Config& fp16);

  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }

  // After a step's overflow check: returns true if that step must be skipped (`overflow`), and
  // updates the scale as DeepSpeed's DynamicLossScaler.update_scale does.
  bool Update(bool overflow);

  // True when the last Update() was an overflow that would have halved a scale already at
  // min_loss_scale (DeepSpeed raises there).
  bool overflow_at_min_scale() const { return overflow_at_min_; }

  struct State {
    double scale;
    int64_t iteration;                // DeepSpeed's cur_iter: Update() calls so far
    int64_t last_overflow_iteration;  // -1 before the first overflow
    int hysteresis_left;              // DeepSpeed's cur_hysteresis
  };
  State state() const { return {scale_, iteration_, last_overflow_iteration_, hysteresis_left_}; }
  // REQUIRES: a state from a scaler created with the same Fp16Config.
  void Restore(const State& state);

 private:
  LossScaler() = default;

  bool dynamic_ = false;
  double scale_ = 1.0;
  double min_scale_ = 1.0;
  int64_t window_ = 1000;
  int hysteresis_ = 2;  // DeepSpeed's delayed_shift
  bool consecutive_hysteresis_ = false;
  int64_t iteration_ = 0;
  int64_t last_overflow_iteration_ = -1;
  int hysteresis_left_ = 2;
  bool overflow_at_min_ = false;
};

}  // namespace strata::runtime
