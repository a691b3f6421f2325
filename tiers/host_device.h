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
// Memory pool. Freed blocks are kept and handed out again, as a GPU's caching allocator does, so
// that a training loop that frees and allocates the same blocks every step touches no new pages:
// a fresh mapping costs a page fault and a page zeroing per 4 KiB on first touch, which made a
// pinned-to-device copy run at a fraction of memcpy speed. The contract:
//   - used_bytes() and the budget check are about live blocks only: an allocation fails with
//     kResourceExhausted exactly when it did without the pool (live + asked > budget).
//   - reserved_bytes() = live + cached bytes, each rounded up to its block's size class (4 KiB
//     pages for blocks of 1 MiB and more, 256 B below). The cache is trimmed so that it stays
//     within the budget: reserved_bytes() <= max(budget, rounded live bytes). Host memory held by
//     the emulated device thus never exceeds its budget, as a GPU's pool never exceeds its HBM.
//   - A block is reused for a request of the same size class first. Without one, and without room
//     in the budget for a new block, a cached block of at most twice the size is cut down to the
//     request (its tail unmapped), or the largest smaller one is grown in place (mremap keeps its
//     pages; only the new tail is touched fresh); other cached blocks are released, smallest
//     first, to make room. Blocks of 1 MiB and more are mappings of their own, so a released one
//     goes back to the system at once, never into glibc's heap (tests/integration/hf_rss_test.cc).
//   - The contents of a new allocation are unspecified (stale bytes of a reused block; zeros or
//     garbage otherwise), as on a GPU. With `poison`, every allocation, reused or not, is filled
//     with 0xA5 and every freed block with 0xDD before it enters the cache.
//
// Thread-safety: as DeviceBackend. The HostDevice must outlive its streams and memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>

#include "base/mutex.h"
#include "tiers/device.h"

namespace strata {

struct HostDeviceOptions {
  uint64_t budget_bytes = 1ull << 30;
  // Sleep this long before each copy (tests: exposes missing waits). 0 = none.
  uint32_t copy_delay_us = 0;
  // Cap per-copy bandwidth at this many bytes/s (0 = as fast as memcpy).
  double copy_bytes_per_second = 0;
  // Fill new allocations (reused ones too) with 0xA5 and freed ones with 0xDD.
  bool poison = false;
};

class HostDevice final : public DeviceBackend {
 public:
  explicit HostDevice(HostDeviceOptions options = {});
  ~HostDevice() override;

  DeviceInfo info() const override;
  uint64_t used_bytes() const override { return used_.load(std::memory_order_relaxed); }
  uint64_t peak_bytes() const override { return peak_.load(std::memory_order_relaxed); }
  // Host memory the pool holds: live blocks plus cached free ones, rounded to size classes.
  uint64_t reserved_bytes() const { return reserved_.load(std::memory_order_relaxed); }

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
  // A block of `size` bytes (a size class) from the cache or the system.
  void* TakeBlock(uint64_t size) REQUIRES(alloc_mu_);
  // Releases cached blocks, smallest first, until `extra` more bytes fit in the budget or the
  // cache is empty (so a huge `extra` releases them all).
  void ReleaseCached(uint64_t extra) REQUIRES(alloc_mu_);

  const HostDeviceOptions options_;
  Mutex alloc_mu_;  // serializes the budget check with the charge, and guards cache_
  std::multimap<uint64_t, void*> cache_ GUARDED_BY(alloc_mu_);  // size class -> freed block
  std::atomic<uint64_t> used_{0};                               // live bytes as asked
  std::atomic<uint64_t> peak_{0};
  std::atomic<uint64_t> reserved_{0};  // live + cached, in size classes
};

}  // namespace strata
