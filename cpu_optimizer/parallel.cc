// TBB arenas for the CPU optimizer. One task_arena per distinct thread count, created on first use
// and kept for the life of the process (arenas are cheap to keep and costly to rebuild per step;
// they are intentionally never destroyed, which also sidesteps static-destruction order with TBB).
#include "cpu_optimizer/internal/parallel.h"

#include <tbb/blocked_range.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <map>
#include <mutex>

namespace strata::cpu_optimizer::internal {
namespace {

tbb::task_arena& ArenaFor(int threads) {
  static std::mutex mu;
  static auto* arenas = new std::map<int, tbb::task_arena*>();
  std::lock_guard<std::mutex> lock(mu);
  tbb::task_arena*& arena = (*arenas)[threads];
  if (arena == nullptr) arena = new tbb::task_arena(threads);
  return *arena;
}

}  // namespace

int ResolveThreads(int requested) {
  if (requested > 0) return requested;
  const int n = tbb::info::default_concurrency();
  return n > 0 ? n : 1;
}

void ParallelChunks(int threads, size_t n, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  threads = ResolveThreads(threads);
  if (threads <= 1 || n < kSerialElements) {
    for (size_t begin = 0; begin < n; begin += kChunkElements) {
      fn(begin, begin + kChunkElements < n ? begin + kChunkElements : n);
    }
    return;
  }
  const size_t chunks = (n + kChunkElements - 1) / kChunkElements;
  ArenaFor(threads).execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, chunks, 1),
        [&](const tbb::blocked_range<size_t>& r) {
          for (size_t c = r.begin(); c != r.end(); ++c) {
            const size_t begin = c * kChunkElements;
            fn(begin, begin + kChunkElements < n ? begin + kChunkElements : n);
          }
        },
        tbb::static_partitioner());
  });
}

}  // namespace strata::cpu_optimizer::internal
