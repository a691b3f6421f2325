// HostTensorCache. State: a multimap from mapping size to free mappings, and the bytes in it; a
// large block is either live (owned by a tensor's DataPtr; its header records its mapping size)
// or in the map. Lock rule: one mutex guards the map and the counters; mmap/munmap run outside it.
#include "runtime/engine/host_tensor_cache.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <new>

#include "base/bytes.h"
#include "base/mutex.h"

namespace strata::runtime {
namespace {

// Every block carries a header in the 64 bytes before its data, so that the deleter, which gets
// only the data pointer (libtorch's raw_deallocate requires ctx == data), knows what to free.
// Small blocks: malloc'd with the header in front. Large blocks: a mapping whose first page holds
// the header at its end, the data starting on the next page (page- and 64-byte aligned).
struct Header {
  uint64_t mapping_bytes;  // 0: a small block
  uint64_t reserved[7];
};
static_assert(sizeof(Header) == 64);
constexpr uint64_t kPage = 4096;

Header* HeaderOf(void* data) { return reinterpret_cast<Header*>(static_cast<char*>(data) - 64); }

class CachingCpuAllocator final : public c10::Allocator {
 public:
  explicit CachingCpuAllocator(uint64_t cap) : cap_(cap) {}

  // libtorch changed allocate() from const to non-const (2.x); these two overloads fit either
  // base class, the one that matches overriding it.
  c10::DataPtr allocate(size_t n) const { return AllocateBlock(n); }
  c10::DataPtr allocate(size_t n) { return AllocateBlock(n); }

  c10::DataPtr AllocateBlock(size_t n) const {
    const c10::Device cpu(c10::DeviceType::CPU);
    void* data = nullptr;
    if (n < HostTensorCache::kMinCachedBytes) {
      void* p = nullptr;
      if (posix_memalign(&p, 64, n + 64) != 0) throw std::bad_alloc();
      data = static_cast<char*>(p) + 64;
      HeaderOf(data)->mapping_bytes = 0;
    } else {
      const uint64_t bytes = AlignUp(n + kPage, kPage);
      auto* self = const_cast<CachingCpuAllocator*>(this);
      void* base = self->TakeCached(bytes);
      if (base == nullptr) {
        base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) throw std::bad_alloc();
      }
      data = static_cast<char*>(base) + kPage;
      HeaderOf(data)->mapping_bytes = bytes;
    }
    return {data, data, &Delete, cpu};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }
  // libtorch 2.x declares this pure virtual; 1.13 has no such member (hence no `override`).
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }

  HostTensorCacheStats stats() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return stats_;
  }

 private:
  static void Delete(void* data);

  void* TakeCached(uint64_t bytes) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = free_.find(bytes);
    if (it == free_.end()) {
      ++stats_.misses;
      return nullptr;
    }
    void* base = it->second;
    free_.erase(it);
    stats_.cached_bytes -= bytes;
    ++stats_.hits;
    return base;
  }

  // Keeps the mapping for reuse if the cap allows; else it is unmapped.
  void Give(void* base, uint64_t bytes) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      if (stats_.cached_bytes + bytes <= cap_) {
        free_.emplace(bytes, base);
        stats_.cached_bytes += bytes;
        return;
      }
    }
    munmap(base, bytes);
  }

  const uint64_t cap_;
  Mutex mu_;
  std::multimap<uint64_t, void*> free_ GUARDED_BY(mu_);  // mapping size -> base
  HostTensorCacheStats stats_ GUARDED_BY(mu_);
};

// Never destroyed: tensors freed during static destruction still find it.
CachingCpuAllocator* g_allocator = nullptr;
std::once_flag g_once;

void CachingCpuAllocator::Delete(void* data) {
  if (data == nullptr) return;
  const uint64_t bytes = HeaderOf(data)->mapping_bytes;
  if (bytes == 0) {
    std::free(HeaderOf(data));
  } else {
    g_allocator->Give(static_cast<char*>(data) - kPage, bytes);
  }
}

}  // namespace

void HostTensorCache::Install(uint64_t cap_bytes) {
  std::call_once(g_once, [cap_bytes] {
    g_allocator = new CachingCpuAllocator(cap_bytes);
    c10::SetCPUAllocator(g_allocator, /*priority=*/1);
  });
}

bool HostTensorCache::installed() { return g_allocator != nullptr; }

HostTensorCacheStats HostTensorCache::stats() {
  return g_allocator != nullptr ? g_allocator->stats() : HostTensorCacheStats{};
}

}  // namespace strata::runtime
