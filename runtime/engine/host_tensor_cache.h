// HostTensorCache: libtorch's CPU allocator with a cache of large blocks, for the host-emulated
// device, whose "device" tensors (activations, gradients) are libtorch CPU tensors.
//
// Why: glibc maps every block over its mmap threshold (at most 32 MiB) afresh and unmaps it on
// free, so each step's large tensors (a 1.3B unit's fp32 gradients are ~200 MB) fault in and zero
// every page again: ~1.7 M minor faults per step at 1.3B. A GPU's caching allocator keeps such
// blocks; this does the same on the host. Blocks of at least kMinCachedBytes are mappings of
// their own; freed, one goes to a cache keyed by its page-rounded size and is handed back to the
// next request of that size. The cache holds at most `cap_bytes`: a block freed beyond that is
// unmapped. Smaller blocks go to malloc (64-byte aligned, as libtorch's default allocator).
//
// Contents of a new block are unspecified (as torch::empty's). Thread-safety: allocate and free
// from any thread (one mutex). Install() replaces libtorch's CPU allocator for the process; the
// cache lives until exit (tensors may outlive any scope), and tensors allocated before keep their
// own deleters.
#pragma once

#include <cstdint>

namespace strata::runtime {

struct HostTensorCacheStats {
  uint64_t cached_bytes = 0;  // freed large blocks kept for reuse
  uint64_t hits = 0;          // large allocations served from the cache
  uint64_t misses = 0;        // large allocations that mapped new memory
};

class HostTensorCache {
 public:
  static constexpr uint64_t kMinCachedBytes = uint64_t{1} << 20;
  // Installs the process-wide cache with this cap (idempotent: a second call changes nothing).
  static void Install(uint64_t cap_bytes);
  static bool installed();
  static HostTensorCacheStats stats();
};

}  // namespace strata::runtime
