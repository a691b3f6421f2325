// Where strata runs the optimizer for a DeepSpeed offload layout. The engine
// (runtime/engine/initialize.cc, Engine::Create) and `strata estimate` both ask this one function,
// so the memory a run is planned with is the memory it uses.
//
// DeepSpeed keeps the optimizer on the device when zero_optimization.offload_optimizer.device is
// none. strata's device optimizer is torch::optim over parameters that stay on the device (the
// no-offload mode): fp32 anywhere, and bf16 on a GPU (`device_masters`: fp32 master weights on the
// device beside the bf16 compute copies, as DeepSpeed's bf16 optimizer keeps them). For every
// other layout with offload_optimizer none (parameters offloaded to cpu/nvme, fp16 (its loss
// scaler runs with the CPU optimizer), bf16 on the host-emulated device) strata runs its CPU
// optimizer with the state in pinned host memory, as offload_optimizer.device cpu would: the same
// numbers, other memory (the state is not on the device) and another speed.
//
// Thread-safety: pure function.
#pragma once

#include <string>
#include <string_view>

#include "tiers/tier.h"

namespace strata::runtime {

struct OptimizerPlacement {
  Home home = Home::kDevice;  // where strata keeps the optimizer state
  std::string warning;        // why, when `home` differs from the configured device; else empty
};

// `params`/`optimizer`: the configured offload_param/offload_optimizer devices; `dtype`: "fp32",
// "bf16" or "fp16"; `device_masters`: the device can hold bf16's fp32 masters (a GPU).
// Idempotent: placing an already placed layout changes nothing.
OptimizerPlacement PlaceOptimizer(Home params, Home optimizer, std::string_view dtype,
                                  bool device_masters = false);

}  // namespace strata::runtime
