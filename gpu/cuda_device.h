// CudaDevice: the DeviceBackend for an NVIDIA GPU (ARCHITECTURE.md §4).
//
// Memory comes from the device's stream-ordered pool (cudaMallocAsync on a private allocation
// stream, with the pool's release threshold raised so freed blocks are reused, not returned to
// the driver) and is charged against a budget standing in for the part of HBM strata may use.
// Streams are non-blocking CUDA streams (the runtime makes one for H2D copies, one for D2H and one
// for compute, so copies overlap kernels); events are cudaEvents with timing disabled.
// RegisterHost page-locks host memory with cudaHostRegister so copies from the pinned arena run at
// DMA speed without a staging copy.
//
// Without a usable GPU, Open() returns kUnavailable and names the CUDA error: 35 (driver older than
// the runtime, or none), 34 (stub driver) or 100 (no device). Callers and tests treat that as
// "no GPU here", not as a failure.
//
// Host functions (LaunchHostFunc) do not run on CUDA's callback thread, where no CUDA call is
// allowed (cudaFreeAsync there fails with error 800, and the tier manager frees and copies from its
// completions): the CUDA callback hands them to the device's own callback thread, which runs them
// one at a time and may call CUDA, and waits for them, so stream order is as cudaLaunchHostFunc's.
//
// Thread-safety: as DeviceBackend. All work targets the device chosen at Open().
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "base/mutex.h"
#include "tiers/device.h"

namespace strata {

struct CudaDeviceOptions {
  int ordinal = 0;
  // Bytes strata may allocate; 0 = 90% of the device's free memory at Open().
  uint64_t budget_bytes = 0;
};

class CudaDevice final : public DeviceBackend {
 public:
  static Result<std::unique_ptr<CudaDevice>> Open(const CudaDeviceOptions& options = {});
  ~CudaDevice() override;

  DeviceInfo info() const override { return info_; }
  uint64_t used_bytes() const override { return used_.load(std::memory_order_relaxed); }
  uint64_t peak_bytes() const override { return peak_.load(std::memory_order_relaxed); }

  Result<std::unique_ptr<Stream>> CreateStream(std::string_view name) override;
  Status CopyAsync(void* dst, const void* src, uint64_t bytes, CopyKind kind,
                   Stream& stream) override;
  Status LaunchHostFunc(Stream& stream, std::function<void()> fn) override;
  Result<Event> RecordEvent(Stream& stream) override;
  Status StreamWaitEvent(Stream& stream, const Event& event) override;
  Status Synchronize(Stream& stream) override;
  Status RegisterHost(void* ptr, uint64_t bytes) override;
  Status UnregisterHost(void* ptr) override;

  int ordinal() const { return ordinal_; }

  // Called by the CUDA host-function trampoline: queues `fn` for the callback thread.
  void PostCallback(std::function<void()> fn) EXCLUDES(callback_mu_);

 protected:
  Result<void*> AllocateRaw(uint64_t bytes) override;
  void FreeRaw(void* ptr, uint64_t bytes) override;

 private:
  CudaDevice(int ordinal, DeviceInfo info, void* alloc_stream);

  const int ordinal_;
  const DeviceInfo info_;
  void* alloc_stream_;  // cudaStream_t for pool allocations and frees
  Mutex alloc_mu_;      // serializes the budget check with the charge (used_ is read lock-free)
  std::atomic<uint64_t> used_{0};
  std::atomic<uint64_t> peak_{0};

  void CallbackLoop() EXCLUDES(callback_mu_);
  Mutex callback_mu_;
  CondVar callback_cv_;
  std::deque<std::function<void()>> callbacks_ GUARDED_BY(callback_mu_);
  bool stopping_ GUARDED_BY(callback_mu_) = false;
  std::thread callback_thread_;
};

// The cudaStream_t behind a Stream created by a CudaDevice (as void*, to keep CUDA headers out).
// REQUIRES: `stream` was created by a CudaDevice.
void* CudaStreamHandle(Stream& stream);

// True for the CUDA errors that mean "no usable GPU on this machine" (34, 35, 100).
bool IsNoGpuError(int cuda_error);

}  // namespace strata
