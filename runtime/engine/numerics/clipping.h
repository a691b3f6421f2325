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

}  // namespace strata::runtime
