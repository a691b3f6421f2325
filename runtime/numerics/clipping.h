// The one gradient-clipping rule (DeepSpeed's): with max_norm > 0 and a global gradient norm
// above it, gradients are multiplied by max_norm / (norm + 1e-6); otherwise left alone. Both the
// CPU optimizer (which folds the multiplier into its gradient scale) and the no-offload
// torch::optim path use ClipMultiplier, so the modes cannot drift apart.
//
// Thread-safety: pure functions.
#pragma once

namespace strata::runtime {

// The factor to multiply gradients by: 1 when clipping is off (max_norm <= 0) or not needed.
constexpr double ClipMultiplier(double grad_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double clip = (grad_norm + 1e-6) / max_norm;
  return clip > 1 ? 1.0 / clip : 1.0;
}

// fp16 with loss scaling (DeepSpeed's unscale_and_clip_grads): the gradients hold loss_scale
// times their value and `scaled_norm` is their norm, so the clip test runs on scaled_norm /
// loss_scale and the one multiplier both unscales and clips: 1 / (max(1, clip) * loss_scale) with
// clip = (scaled_norm / loss_scale + 1e-6) / max_norm. With loss_scale 1 it is ClipMultiplier.
constexpr double UnscaleAndClipMultiplier(double scaled_norm, double loss_scale, double max_norm) {
  double combined = loss_scale;
  if (max_norm > 0) {
    const double clip = (scaled_norm / loss_scale + 1e-6) / max_norm;
    if (clip > 1) combined = clip * loss_scale;
  }
  return 1.0 / combined;
}

}  // namespace strata::runtime
