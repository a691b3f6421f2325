#include "runtime/plan/placement.h"

namespace strata::runtime {

OptimizerPlacement PlaceOptimizer(Home params, Home optimizer, std::string_view dtype,
                                  bool device_masters) {
  OptimizerPlacement p;
  p.home = optimizer;
  const bool device_optimizer = dtype == "fp32" || (dtype == "bf16" && device_masters);
  if (optimizer != Home::kDevice || (params == Home::kDevice && device_optimizer)) return p;
  p.home = Home::kCpu;
  const std::string why =
      params != Home::kDevice
          ? "zero_optimization.offload_param.device is " + std::string(HomeName(params))
          : std::string(dtype) + " mixed precision keeps fp32 master weights with the optimizer";
  p.warning = "zero_optimization.offload_optimizer.device is none but " + why +
              ": the optimizer runs on the CPU with its state (fp32 master weights, moments, "
              "fp32 gradients) in pinned host memory, as offload_optimizer.device cpu would. "
              "DeepSpeed keeps it on the device; strata's device optimizer runs fp32, and bf16 "
              "on a GPU. The numbers are the same as with the optimizer on the device";
  return p;
}

}  // namespace strata::runtime
