// HostDevice: a DeviceBackend that emulates a GPU in host memory (ARCHITECTURE.md §4).
//
// Device memory is ordinary host memory charged against its own budget (standing in for HBM).
// Each stream has one worker thread that executes its copies and host functions in submission
// order; events complete when the worker reaches them. So, as on a GPU, a copy's destination is
// not valid until an event recorded after it has completed, and copies on different streams run
// concurrently. Options make the emulation stricter for tests: a per-copy delay widens the window
// in which code that forgot to wait reads stale bytes, poisoning fills freed and new memory with a
// pattern, and a bandwidth cap models a PCIe link.
//
// Thread-safety: as DeviceBackend. The HostDevice must outlive its streams and memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "tiers/device.h"

namespace strata {

struct HostDeviceOptions {
  uint64_t budget_bytes = 1ull << 30;
  // Sleep this long before each copy (tests: exposes missing waits). 0 = none.
  uint32_t copy_delay_us = 0;
  // Cap per-copy bandwidth at this many bytes/s (0 = as fast as memcpy).
  double copy_bytes_per_second = 0;
  // Fill new allocations with 0xA5 and freed ones with 0xDD.
  bool poison = false;
};

class HostDevice final : public DeviceBackend {
 public:
  explicit HostDevice(HostDeviceOptions options = {});
  ~HostDevice() override;

  DeviceInfo info() const override;
  uint64_t used_bytes() const override { return used_.load(std::memory_order_relaxed); }
  uint64_t peak_bytes() const override { return peak_.load(std::memory_order_relaxed); }

  Result<std::unique_ptr<Stream>> CreateStream(std::string_view name) override;
  Status CopyAsync(void* dst, const void* src, uint64_t bytes, CopyKind kind,
                   Stream& stream) override;
  Status LaunchHostFunc(Stream& stream, std::function<void()> fn) override;
  Result<Event> RecordEvent(Stream& stream) override;
  Status StreamWaitEvent(Stream& stream, const Event& event) override;
  Status Synchronize(Stream& stream) override;
  Status RegisterHost(void* ptr, uint64_t bytes) override { return Status::Ok(); }
  Status UnregisterHost(void* ptr) override { return Status::Ok(); }

 protected:
  Result<void*> AllocateRaw(uint64_t bytes) override;
  void FreeRaw(void* ptr, uint64_t bytes) override;

 private:
  const HostDeviceOptions options_;
  std::mutex alloc_mu_;  // serializes the budget check with the charge
  std::atomic<uint64_t> used_{0};
  std::atomic<uint64_t> peak_{0};
};

}  // namespace strata
