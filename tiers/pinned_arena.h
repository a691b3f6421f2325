// PinnedArena: one exact-size region of page-locked host memory for every staging buffer.
//
// DeepSpeed users' most common failure is pinned-memory OOM, made worse by allocators that round
// each pinned buffer up to a power of two. strata maps one region of exactly the configured size
// (rounded to a page), checks it against the configured budget and the memory actually available
// at start-up, page-locks it (mlock, best effort: a refusal is logged once, not fatal), registers
// it with the compute device (cudaHostRegister on CUDA) and hands out aligned extents from it.
// Buffers are aligned to `alignment` (4 KiB by default), so they are valid O_DIRECT targets.
//
// Thread-safety: Allocate and buffer release may be called from any thread. The arena must outlive
// its buffers (checked: destroying an arena with live buffers is a programmer error).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "base/mutex.h"
#include "base/status.h"

namespace strata {

class DeviceBackend;
class PinnedArena;

struct PinnedArenaOptions {
  uint64_t bytes = 0;               // exact capacity asked for (rounded up to a page)
  uint64_t budget_bytes = 0;        // the most pinned memory allowed; 0 = only what the host has
  std::string budget_key;           // the config key that sets the size, named in errors
  uint64_t alignment = 4096;        // every buffer's start and size are multiples of this
  bool lock = true;                 // mlock the region (best effort)
  DeviceBackend* device = nullptr;  // if set, the region is registered with it
};

// Bytes from a PinnedArena. Move-only; gives its extent back when dropped.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { Reset(); }

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }  // the aligned size handed out (>= asked)
  bool valid() const { return data_ != nullptr; }
  void Reset();

 private:
  friend class PinnedArena;
  PinnedBuffer(PinnedArena* arena, std::byte* data, uint64_t size)
      : arena_(arena), data_(data), size_(size) {}
  PinnedArena* arena_ = nullptr;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

class PinnedArena {
 public:
  // Maps, locks and registers the region. Fails with kResourceExhausted when the size exceeds the
  // budget or the host's available memory, naming the asked size, the limit and budget_key.
  static Result<std::unique_ptr<PinnedArena>> Create(const PinnedArenaOptions& options);
  ~PinnedArena();

  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;

  // A pool of `slots` equal slots of `slot_bytes` (rounded up to the alignment) carved out of
  // `parent` (no new mapping: the memory is already locked and registered). Every Allocate from
  // a pool takes one whole slot, whatever it asks up to slot_bytes, so a pool never fragments:
  // `slots` buffers always fit. The pool holds one buffer of its parent until it is destroyed.
  // kResourceExhausted when the parent cannot fit it.
  static Result<std::unique_ptr<PinnedArena>> CarvePool(PinnedArena& parent, uint64_t slot_bytes,
                                                        uint64_t slots, std::string name);

  // An extent of at least `bytes` (rounded up to the alignment), first fit; in a pool, one slot
  // (kInvalidArgument for more than slot_bytes). kResourceExhausted
  // when no free extent is large enough (the message gives used, capacity and largest free).
  Result<PinnedBuffer> Allocate(uint64_t bytes);

  uint64_t capacity() const { return capacity_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t used_bytes() const;
  uint64_t peak_bytes() const;
  uint64_t largest_free_bytes() const;
  uint64_t slot_bytes() const { return slot_bytes_; }  // 0 unless a pool
  bool locked() const { return locked_; }
  bool Contains(const void* p) const;

 private:
  PinnedArena(std::byte* base, uint64_t capacity, uint64_t alignment);
  void Free(std::byte* data, uint64_t size);
  friend class PinnedBuffer;

  PinnedBuffer pool_memory_;  // a pool's memory, held from its parent (empty for a root arena)
  uint64_t slot_bytes_ = 0;   // 0: free-form first fit
  std::byte* const base_;
  const uint64_t capacity_;
  const uint64_t alignment_;
  bool locked_ = false;
  DeviceBackend* device_ = nullptr;
  std::string budget_key_;

  mutable Mutex mu_;
  std::map<uint64_t, uint64_t> free_ GUARDED_BY(mu_);  // offset -> size, coalesced
  uint64_t used_ GUARDED_BY(mu_) = 0;
  uint64_t peak_ GUARDED_BY(mu_) = 0;
  uint64_t live_buffers_ GUARDED_BY(mu_) = 0;
};

// Bytes of host memory the kernel reports as available (MemAvailable), or 0 if unknown.
uint64_t HostAvailableBytes();

}  // namespace strata
