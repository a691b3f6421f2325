// MakeNcclCommunicator where this build has no NCCL (libtorch without CUDA, or
// nccl_communicator.cc did not compile against this libtorch: runtime/comm/CMakeLists.txt).
#include <utility>

#include "runtime/comm/nccl_communicator.h"

namespace strata::runtime {

void PrepareNcclEnvironment() {}

Result<std::shared_ptr<Communicator>> MakeNcclCommunicator(std::shared_ptr<Communicator> control,
                                                           const c10::intrusive_ptr<c10d::Store>&,
                                                           int cuda_device,
                                                           std::chrono::milliseconds,
                                                           std::function<std::string()>) {
  return UnavailableError(
      "ranks on cuda:" + std::to_string(cuda_device) + " (rank " + std::to_string(control->rank()) +
      " of " + std::to_string(control->world_size()) +
      ") need c10d's ProcessGroupNCCL, which this build does not have (strata was built against a "
      "libtorch without CUDA; build against PyTorch's CUDA libtorch: scripts/gpu-bundle.sh), or "
      "train on --device host");
}

}  // namespace strata::runtime
