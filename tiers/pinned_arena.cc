// PinnedArena. The region is one anonymous mmap; the free list is a map of offset -> size kept
// coalesced (a freed extent merges with its neighbours), so fragmentation is bounded by the
// allocation pattern rather than by size classes. First fit is enough: the runtime allocates a
// handful of long-lived staging buffers, not a stream of small ones.
#include "tiers/pinned_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <utility>

#include "base/bytes.h"
#include "base/logging.h"
#include "tiers/device.h"

namespace strata {

uint64_t HostAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0;
  std::string unit;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

Result<std::unique_ptr<PinnedArena>> PinnedArena::Create(const PinnedArenaOptions& options) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (options.alignment == 0 || (options.alignment & (options.alignment - 1)) != 0) {
    return InvalidArgumentError("pinned arena alignment " + std::to_string(options.alignment) +
                                " is not a power of two");
  }
  if (options.bytes == 0) return InvalidArgumentError("pinned arena of 0 bytes");
  const uint64_t capacity = AlignUp(options.bytes, std::max(page, options.alignment));
  const std::string key =
      options.budget_key.empty() ? std::string() : " (set by " + options.budget_key + ")";
  if (options.budget_bytes != 0 && capacity > options.budget_bytes) {
    return ResourceExhaustedError("pinned host buffers need " + FormatBytes(capacity) +
                                  " but the pinned-memory limit is " +
                                  FormatBytes(options.budget_bytes) + key);
  }
  const uint64_t available = HostAvailableBytes();
  if (available != 0 && capacity > available) {
    return ResourceExhaustedError("pinned host buffers need " + FormatBytes(capacity) +
                                  " but only " + FormatBytes(available) +
                                  " of host memory is available" + key);
  }

  void* p = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return IoErrorFromErrno(errno, "mmap of a " + FormatBytes(capacity) + " pinned arena" + key);
  }
  std::unique_ptr<PinnedArena> arena(
      new PinnedArena(static_cast<std::byte*>(p), capacity, options.alignment));
  arena->budget_key_ = options.budget_key;
  if (options.lock) {
    if (mlock(p, capacity) == 0) {
      arena->locked_ = true;
    } else {
      const int err = errno;
      STRATA_LOG(kWarning) << "could not page-lock the " << FormatBytes(capacity)
                           << " pinned arena (" << IoErrorFromErrno(err, "mlock").message()
                           << "); continuing with pageable memory. Raise `ulimit -l` to lock it.";
    }
  }
  if (options.device != nullptr) {
    Status s = options.device->RegisterHost(p, capacity);
    if (!s.ok()) return s.WithContext("registering the pinned arena with the device");
    arena->device_ = options.device;
  }
  return arena;
}

PinnedArena::PinnedArena(std::byte* base, uint64_t capacity, uint64_t alignment)
    : base_(base), capacity_(capacity), alignment_(alignment) {
  free_.emplace(0, capacity);
}

Result<std::unique_ptr<PinnedArena>> PinnedArena::CarvePool(PinnedArena& parent,
                                                            uint64_t slot_bytes, uint64_t slots,
                                                            std::string name) {
  if (slot_bytes == 0 || slots == 0) {
    return InvalidArgumentError("pinned pool " + name + ": needs slots of a positive size");
  }
  const uint64_t slot = AlignUp(slot_bytes, parent.alignment_);
  Result<PinnedBuffer> memory = parent.Allocate(slot * slots);
  if (!memory.ok()) return memory.status().WithContext("carving pinned pool " + name);
  std::unique_ptr<PinnedArena> pool(
      new PinnedArena(memory->data(), slot * slots, parent.alignment_));
  pool->slot_bytes_ = slot;
  pool->locked_ = parent.locked_;
  pool->budget_key_ = parent.budget_key_.empty() ? name : name + " in " + parent.budget_key_;
  pool->pool_memory_ = std::move(*memory);
  return pool;
}

PinnedArena::~PinnedArena() {
  STRATA_CHECK(live_buffers_ == 0) << live_buffers_ << " pinned buffers outlive their arena";
  if (pool_memory_.valid()) return;  // a pool: the memory goes back to its parent
  if (device_ != nullptr) device_->UnregisterHost(base_).IgnoreError();
  if (locked_) munlock(base_, capacity_);
  munmap(base_, capacity_);
}

Result<PinnedBuffer> PinnedArena::Allocate(uint64_t bytes) {
  if (bytes == 0) return InvalidArgumentError("pinned buffer of 0 bytes");
  if (slot_bytes_ != 0 && bytes > slot_bytes_) {
    return InvalidArgumentError("pinned buffer of " + FormatBytes(bytes) +
                                " does not fit a pool slot of " + FormatBytes(slot_bytes_));
  }
  const uint64_t size = slot_bytes_ != 0 ? slot_bytes_ : AlignUp(bytes, alignment_);
  MutexLock lock(&mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - size;
    free_.erase(it);
    if (rest > 0) free_.emplace(offset + size, rest);
    used_ += size;
    peak_ = std::max(peak_, used_);
    ++live_buffers_;
    return PinnedBuffer(this, base_ + offset, size);
  }
  uint64_t largest = 0;
  for (const auto& [off, len] : free_) largest = std::max(largest, len);
  return ResourceExhaustedError(
      "pinned arena cannot fit " + FormatBytes(size) + ": " + FormatBytes(used_) + " of " +
      FormatBytes(capacity_) + " in use, largest free extent " + FormatBytes(largest) +
      (budget_key_.empty() ? std::string() : " (size set by " + budget_key_ + ")"));
}

void PinnedArena::Free(std::byte* data, uint64_t size) {
  const uint64_t offset = static_cast<uint64_t>(data - base_);
  MutexLock lock(&mu_);
  auto next = free_.lower_bound(offset);
  uint64_t start = offset;
  uint64_t len = size;
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    STRATA_CHECK(prev->first + prev->second <= offset) << "double free in pinned arena";
    if (prev->first + prev->second == offset) {
      start = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end()) {
    STRATA_CHECK(offset + size <= next->first) << "double free in pinned arena";
    if (offset + size == next->first) {
      len += next->second;
      free_.erase(next);
    }
  }
  free_.emplace(start, len);
  used_ -= size;
  --live_buffers_;
}

uint64_t PinnedArena::used_bytes() const {
  MutexLock lock(&mu_);
  return used_;
}
uint64_t PinnedArena::peak_bytes() const {
  MutexLock lock(&mu_);
  return peak_;
}
uint64_t PinnedArena::largest_free_bytes() const {
  MutexLock lock(&mu_);
  uint64_t largest = 0;
  for (const auto& [off, len] : free_) largest = std::max(largest, len);
  return largest;
}
bool PinnedArena::Contains(const void* p) const {
  const auto* b = static_cast<const std::byte*>(p);
  return b >= base_ && b < base_ + capacity_;
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : arena_(std::exchange(other.arena_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    arena_ = std::exchange(other.arena_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void PinnedBuffer::Reset() {
  if (data_ != nullptr) arena_->Free(data_, size_);
  arena_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

}  // namespace strata
