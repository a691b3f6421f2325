// OpenComputeDevice: the device a `--device` spec names (tiers/device_registry.h), as the engine
// takes it: where libtorch computes, and the DeviceBackend to hand the engine (EngineOptions::
// device). One home for `strata train`, `strata eval` and `strata bench step`.
//
//   host, host:N, or auto where no GPU opens: `device` null (the engine owns its host-emulated
//       device, sized by EngineOptions::device_budget), `torch_device` the CPU;
//   cuda, cuda:N, or auto where cuda:0 opens: the CudaDevice with `budget_bytes` (0: the backend's
//       default), `torch_device` CUDA N, `spec` "cuda:N" (to open the same GPU again).
// Errors: OpenDevice's code, the message prefixed "--device SPEC: "; where no GPU is usable
// (kUnavailable) it adds that auto or host train on the emulated device.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "tiers/device.h"

namespace strata::runtime {

struct ComputeDevice {
  std::unique_ptr<DeviceBackend> device;  // null: the host-emulated device
  torch::Device torch_device = torch::kCPU;
  std::string spec;  // "cuda:N" on a GPU; empty on the host
};

[[nodiscard]] Result<ComputeDevice> OpenComputeDevice(const std::string& spec,
                                                      uint64_t budget_bytes);

}  // namespace strata::runtime
