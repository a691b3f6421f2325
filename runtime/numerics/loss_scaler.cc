#include "runtime/numerics/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace strata::runtime {

Result<LossScaler> LossScaler::Create(const Fp16Config& fp16) {
  LossScaler s;
  if (!fp16.enabled) return s;  // static, scale 1
  if (!std::isfinite(fp16.loss_scale) || fp16.loss_scale < 0) {
    return InvalidArgumentError(
        "fp16.loss_scale: expected a finite number >= 0 (0 = dynamic), got " +
        std::to_string(fp16.loss_scale));
  }
  if (fp16.loss_scale > 0) {
    s.scale_ = fp16.loss_scale;
    return s;
  }
  if (fp16.initial_scale_power < 0 || fp16.initial_scale_power > 127) {
    return InvalidArgumentError("fp16.initial_scale_power: expected an integer 0..127, got " +
                                std::to_string(fp16.initial_scale_power));
  }
  if (fp16.loss_scale_window < 1) {
    return InvalidArgumentError("fp16.loss_scale_window: expected an integer >= 1, got " +
                                std::to_string(fp16.loss_scale_window));
  }
  if (fp16.hysteresis < 1) {
    return InvalidArgumentError("fp16.hysteresis: expected an integer >= 1, got " +
                                std::to_string(fp16.hysteresis));
  }
  if (!std::isfinite(fp16.min_loss_scale) || fp16.min_loss_scale <= 0) {
    return InvalidArgumentError("fp16.min_loss_scale: expected a finite number > 0, got " +
                                std::to_string(fp16.min_loss_scale));
  }
  s.dynamic_ = true;
  s.scale_ = std::ldexp(1.0, fp16.initial_scale_power);
  s.min_scale_ = fp16.min_loss_scale;
  s.window_ = fp16.loss_scale_window;
  s.hysteresis_ = fp16.hysteresis;
  s.hysteresis_left_ = fp16.hysteresis;
  s.consecutive_hysteresis_ = fp16.consecutive_hysteresis;
  return s;
}

bool LossScaler::Update(bool overflow) {
  overflow_at_min_ = false;
  if (!dynamic_) return overflow;
  constexpr double kScaleFactor = 2.0;
  if (overflow) {
    if (hysteresis_ == 1 || hysteresis_left_ == 1) {
      if (scale_ == min_scale_) overflow_at_min_ = true;
      scale_ = std::max(scale_ / kScaleFactor, min_scale_);
    } else {
      --hysteresis_left_;
    }
    last_overflow_iteration_ = iteration_;
  } else {
    if (consecutive_hysteresis_) hysteresis_left_ = hysteresis_;
    const int64_t stable_interval = (iteration_ - last_overflow_iteration_) - 1;
    if (stable_interval > 0 && stable_interval % window_ == 0) {
      if (!consecutive_hysteresis_) hysteresis_left_ = hysteresis_;
      scale_ *= kScaleFactor;
    }
  }
  ++iteration_;
  return overflow;
}

void LossScaler::Restore(const State& state) {
  scale_ = state.scale;
  iteration_ = state.iteration;
  last_overflow_iteration_ = state.last_overflow_iteration;
  hysteresis_left_ = state.hysteresis_left;
  overflow_at_min_ = false;
}

}  // namespace strata::runtime
