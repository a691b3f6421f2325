// Internal: how the CPU optimizer spreads one flat span over threads (TBB stays in parallel.cc).
#pragma once

#include <cstddef>
#include <functional>

namespace strata::cpu_optimizer::internal {

// Elements per chunk: 64K elements is 256 KiB per fp32 stream, long enough for the hardware
// prefetchers and short enough to balance. Chunk boundaries are multiples of it, so they keep the
// alignment of the buffers' starts.
inline constexpr size_t kChunkElements = size_t{1} << 16;
// Below this many elements the calling thread does the whole span (waking workers costs more).
inline constexpr size_t kSerialElements = 2 * kChunkElements;

// 0 -> the TBB default concurrency (cores in this process's affinity mask); else `requested`.
int ResolveThreads(int requested);

// Calls fn(chunk_begin, chunk_end) for consecutive chunks covering [0, n). With threads > 1 and
// n >= kSerialElements, runs in a TBB arena of `threads` slots with static partitioning: each
// thread gets one contiguous run of chunks and walks it in order. Returns when all are done.
void ParallelChunks(int threads, size_t n, const std::function<void(size_t, size_t)>& fn);

}  // namespace strata::cpu_optimizer::internal
