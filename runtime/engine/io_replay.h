// The I/O of a training step without its compute, for `strata bench step` (does a step overlap
// its parts?). Not part of training: the replays leave gradients and parameters unspecified, so
// use them on an engine that will be discarded.
//
// Threads: the training thread, between steps.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "runtime/engine/engine.h"

namespace strata::runtime {

// One recorded forward+backward pass: gathers in the recorded order (with the same prefetching)
// and zero gradients handed off where the backward would hand them off. FailedPrecondition in
// no-offload mode or before a pass was recorded.
[[nodiscard]] Status ReplayPassIo(Engine& engine);
// One optimizer step's reads and writes without the update arithmetic.
[[nodiscard]] Status ReplayOptimizerIo(Engine& engine);
// Elements the CPU optimizer updates per step, and its largest sub-group (0 without offload).
uint64_t OptimizerElements(Engine& engine);
uint64_t LargestSubGroupElements(Engine& engine);

}  // namespace strata::runtime
