#include "runtime/engine/compute_device.h"

#include <cstdlib>
#include <utility>

#include "tiers/device_registry.h"

namespace strata::runtime {

Result<ComputeDevice> OpenComputeDevice(const std::string& spec, uint64_t budget_bytes) {
  ComputeDevice out;
  if (spec == "host" || spec.rfind("host:", 0) == 0) return out;
  DeviceOptions d;
  d.budget_bytes = budget_bytes;
  Result<std::unique_ptr<DeviceBackend>> opened = OpenDevice(spec, d);
  if (!opened.ok()) {
    std::string msg = "--device " + spec + ": " + std::string(opened.status().message());
    if (opened.status().code() == StatusCode::kUnavailable) {
      msg += " (--device auto or host trains on the host-emulated device)";
    }
    return Status(opened.status().code(), msg);
  }
  if ((*opened)->info().host_addressable) return out;  // auto chose the host
  out.spec = spec == "auto" ? "cuda:0" : spec;
  const size_t colon = out.spec.find(':');
  const int index = colon == std::string::npos ? 0 : std::atoi(out.spec.c_str() + colon + 1);
  out.device = std::move(*opened);
  out.torch_device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  return out;
}

}  // namespace strata::runtime
