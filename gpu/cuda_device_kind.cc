// Registers CudaDevice as the device kind "cuda" (tiers/device_registry.h) when the program
// starts. This object must stay alone in the library strata_gpu_device_kind, which strata_devices
// links whole: nothing refers to it, so a plain static-library link would drop it (Note [Device
// registration] in tiers/device_registry.h).
#include <memory>
#include <utility>

#include "base/logging.h"
#include "gpu/cuda_device.h"
#include "tiers/device_registry.h"

namespace strata {
namespace {

Result<std::unique_ptr<DeviceBackend>> OpenCuda(const DeviceOptions& options) {
  STRATA_ASSIGN_OR_RETURN(
      std::unique_ptr<CudaDevice> device,
      CudaDevice::Open({.ordinal = options.index, .budget_bytes = options.budget_bytes}));
  return std::unique_ptr<DeviceBackend>(std::move(device));
}

[[maybe_unused]] const bool kRegistered = [] {
  Status s = RegisterDevice("cuda", OpenCuda);
  // No caller to return to before main(); OpenDevice("cuda") will then report the kind missing.
  if (!s.ok()) STRATA_LOG(kError) << "registering the cuda device kind: " << s.ToString();
  return s.ok();
}();

}  // namespace
}  // namespace strata
