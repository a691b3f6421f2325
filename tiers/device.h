// DeviceBackend: the seam between strata and a compute device (ARCHITECTURE.md §4).
//
// A device has memory within a byte budget, streams that execute copies in order, and events
// recorded on streams. Two implementations:
//   - HostDevice (tiers/host_device.h): emulates a GPU in host memory, with copy threads.
//   - CudaDevice (gpu/cuda_device.h): the real one, built only where CUDA is found.
//
// Contract, shared by every backend (the conformance suite in tests/tiers checks it):
//   - Allocate() charges the budget and fails with kResourceExhausted (saying asked/used/budget)
//     rather than exceeding it. The returned DeviceMemory frees itself when dropped. Dropping
//     memory that a queued copy still uses is a programmer error: wait for the copy's event first.
//   - CopyAsync() enqueues a copy on a stream and returns at once. Copies on one stream run in
//     submission order; copies on different streams may overlap. The destination is not valid
//     until an event recorded after the copy has completed.
//   - RecordEvent() returns an event that completes when everything enqueued on the stream before
//     it has completed. Events are shared handles: copy them freely.
//   - A failed copy (e.g. a CUDA error) makes every later event on that stream report the error.
//   - Host functions (LaunchHostFunc) never run on the caller's thread: not inline, not on an idle
//     stream, not when the launch fails (then `fn` is dropped unrun and the error returned). They
//     run on a backend thread: HostDevice's stream worker; CudaDevice's callback thread, to which
//     CUDA's own host-function thread hands them (CUDA calls are not allowed on that one). So a
//     caller may hold a lock across LaunchHostFunc that `fn` takes (TierManager holds its mu_).
//     Checked by DeviceConformanceTest.HostFunctionsNeverRunOnTheCallersThread.
//
// Thread-safety: all methods may be called from any thread. A Stream must outlive the work
// queued on it (its destructor waits for that work).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"

namespace strata {

class DeviceBackend;

// Bytes of device memory. Move-only; frees (and returns budget) on destruction.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(DeviceMemory&& other) noexcept;
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() { Reset(); }

  // A device address: host-dereferenceable only on HostDevice. REQUIRES: valid().
  void* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool valid() const { return data_ != nullptr; }
  void Reset();

 private:
  friend class DeviceBackend;
  DeviceMemory(DeviceBackend* owner, void* data, uint64_t size)
      : owner_(owner), data_(data), size_(size) {}
  DeviceBackend* owner_ = nullptr;
  void* data_ = nullptr;
  uint64_t size_ = 0;
};

// Completion state of an event; backends subclass it.
class EventState {
 public:
  virtual ~EventState() = default;
  // Non-blocking: true once complete (successfully or not).
  virtual bool Query() const = 0;
  // Blocks until complete; returns the error of the work it covers, if any.
  virtual Status Wait() const = 0;
};

// A recorded point in a stream. Copyable; an empty Event is complete.
class Event {
 public:
  Event() = default;
  explicit Event(std::shared_ptr<const EventState> state) : state_(std::move(state)) {}
  bool Query() const { return state_ == nullptr || state_->Query(); }
  Status Wait() const { return state_ ? state_->Wait() : Status::Ok(); }
  const EventState* state() const { return state_.get(); }

 private:
  std::shared_ptr<const EventState> state_;
};

// An in-order queue of device work. Created by DeviceBackend::CreateStream.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual std::string_view name() const = 0;
  // The backend's own handle (a cudaStream_t for CudaDevice), for handing the stream to another
  // library (libtorch computes on the engine's compute stream); null where there is none.
  virtual void* native_handle() const { return nullptr; }
};

enum class CopyKind : uint8_t { kHostToDevice, kDeviceToHost, kDeviceToDevice };

struct DeviceInfo {
  std::string name;               // "host-emulated", "NVIDIA H100 80GB HBM3", ...
  uint64_t budget_bytes = 0;      // what strata may allocate
  uint64_t total_bytes = 0;       // physical memory of the device
  bool host_addressable = false;  // the CPU may read and write its memory directly (HostDevice)
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  virtual DeviceInfo info() const = 0;
  virtual uint64_t used_bytes() const = 0;
  virtual uint64_t peak_bytes() const = 0;

  Result<DeviceMemory> Allocate(uint64_t bytes);

  virtual Result<std::unique_ptr<Stream>> CreateStream(std::string_view name) = 0;

  // Enqueues a copy of `bytes` from `src` to `dst` on `stream`. For kHostToDevice/kDeviceToHost
  // the host side should be registered (RegisterHost) for full speed.
  virtual Status CopyAsync(void* dst, const void* src, uint64_t bytes, CopyKind kind,
                           Stream& stream) = 0;

  // Enqueues `fn` to run on a backend thread after the stream's earlier work (cudaLaunchHostFunc);
  // never on the calling thread (see the contract above). `fn` must not block on the same stream.
  virtual Status LaunchHostFunc(Stream& stream, std::function<void()> fn) = 0;

  virtual Result<Event> RecordEvent(Stream& stream) = 0;
  // Makes later work on `stream` wait until `event` completes.
  virtual Status StreamWaitEvent(Stream& stream, const Event& event) = 0;
  // Blocks until everything enqueued on `stream` so far has completed.
  virtual Status Synchronize(Stream& stream) = 0;

  // Page-locks host memory for fast asynchronous copies (cudaHostRegister); a no-op for
  // HostDevice. REQUIRES: [ptr, ptr+bytes) stays mapped until UnregisterHost.
  virtual Status RegisterHost(void* ptr, uint64_t bytes) = 0;
  virtual Status UnregisterHost(void* ptr) = 0;

 protected:
  // Backend allocation primitives; Allocate() wraps them in a DeviceMemory.
  virtual Result<void*> AllocateRaw(uint64_t bytes) = 0;
  virtual void FreeRaw(void* ptr, uint64_t bytes) = 0;

 private:
  friend class DeviceMemory;
};

}  // namespace strata
