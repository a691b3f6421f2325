// libtorch's own optimizer step, timed for `strata bench adam` (kept apart so that only this TU
// pays for <torch/torch.h>, and so the bench builds without libtorch).
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace strata::bench {

struct TorchStepTiming {
  double best_seconds = 0;    // fastest timed step
  double median_seconds = 0;  // median timed step
  int steps = 0;              // timed steps (after one untimed step that allocates the state)
};

// Runs torch::optim::{Adam, AdamW, Adagrad} (`optimizer` is "adam", "adamw" or "adagrad") on one
// fp32 parameter tensor of `numel` elements with an fp32 gradient, using torch::set_num_threads
// (`threads`) for the duration of the call. Unavailable when libtorch is not built in or has no
// such optimizer (Lion).
Result<TorchStepTiming> TimeTorchOptimizer(std::string_view optimizer, uint64_t numel, int threads,
                                           int steps);

}  // namespace strata::bench
