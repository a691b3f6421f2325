// TorchStreamGuard: makes a stream strata created libtorch's current stream for a device on the
// calling thread, until the guard is destroyed (the previous one is restored then).
//
// On a GPU, libtorch computes on strata's compute stream so that strata orders its copies after
// the compute with device events (StateStore). This uses libtorch's device-generic stream API (c10
// VirtualGuardImpl), so nothing outside gpu/ needs CUDA headers: a CUDA stream created outside
// libtorch is known to it by its cudaStream_t as the stream id (what at::cuda's
// getStreamFromExternal does; PyTorch's CUDAStream reads an even non-zero id as such a pointer).
// Install reads the current stream back and fails if libtorch did not take it.
//
//   auto stream = device.CreateStream("compute").value();
//   auto guard = TorchStreamGuard::Install(torch::Device(torch::kCUDA, 0),
//   stream->native_handle());
//
// Ownership: the guard does not own the stream, which must outlive it. Move-only.
// Threads: libtorch's current stream is per thread: install, compute and destroy on one thread
// (the autograd engine runs each backward op on its forward op's stream by itself).
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "base/status.h"

namespace strata::runtime {

class TorchStreamGuard {
 public:
  // Errors: a libtorch without that device type, or one that did not take the stream
  // (kFailedPrecondition naming the device).
  [[nodiscard]] static Result<TorchStreamGuard> Install(torch::Device device, void* handle);

  TorchStreamGuard(TorchStreamGuard&& other) noexcept;
  TorchStreamGuard& operator=(TorchStreamGuard&& other) noexcept;
  TorchStreamGuard(const TorchStreamGuard&) = delete;
  TorchStreamGuard& operator=(const TorchStreamGuard&) = delete;
  ~TorchStreamGuard();

 private:
  TorchStreamGuard(torch::Device device, int64_t previous)
      : device_(device), previous_(previous), active_(true) {}
  void Restore();

  torch::Device device_ = torch::kCPU;
  int64_t previous_ = 0;  // libtorch's stream id before Install
  bool active_ = false;
};

}  // namespace strata::runtime
