// The eviction policies (tiers/eviction_policy.h).
#include "tiers/eviction_policy.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace strata {

size_t LruPolicy::ChooseVictim(Tier, std::span<const EvictionCandidate> candidates) {
  auto older = [&](size_t a, size_t b) {  // true if a is a better victim than b
    if (candidates[a].awaiting_use != candidates[b].awaiting_use)
      return !candidates[a].awaiting_use;
    return candidates[a].last_use < candidates[b].last_use;
  };
  size_t best = 0;
  for (size_t i = 1; i < candidates.size(); ++i) {
    if (older(i, best)) best = i;
  }
  return best;
}

FutureUsePolicy::Window FutureUsePolicy::AddWindow() {
  MutexLock lock(&mu_);
  windows_.emplace_back();
  return static_cast<Window>(windows_.size() - 1);
}

void FutureUsePolicy::SetUpcoming(Window window, std::vector<BlockId> upcoming) {
  MutexLock lock(&mu_);
  windows_.at(static_cast<size_t>(window)) = std::move(upcoming);
}

size_t FutureUsePolicy::ChooseVictim(Tier, std::span<const EvictionCandidate> candidates) {
  MutexLock lock(&mu_);
  // A block's next use: its nearest position over the windows (with one window set, exactly that
  // window's order).
  std::unordered_map<BlockId, size_t> next_use;
  for (const std::vector<BlockId>& upcoming : windows_) {
    for (size_t i = 0; i < upcoming.size(); ++i) {
      auto [it, added] = next_use.emplace(upcoming[i], i);
      if (!added) it->second = std::min(it->second, i);
    }
  }
  size_t best = 0;
  auto key = [&](size_t i) {
    // A copy prefetched and not used yet goes last, whatever the window says: the window may not
    // cover what the prefetcher knew (evicting it throws the read away, to be done again). Then:
    // not needed again (least recently used first); else furthest next use.
    auto it = next_use.find(candidates[i].id);
    const uint64_t distance =
        it == next_use.end() ? std::numeric_limits<uint64_t>::max() : it->second;
    return std::tuple<bool, uint64_t, uint64_t>(
        !candidates[i].awaiting_use, distance,
        std::numeric_limits<uint64_t>::max() - candidates[i].last_use);
  };
  for (size_t i = 1; i < candidates.size(); ++i) {
    if (key(i) > key(best)) best = i;
  }
  return best;
}

}  // namespace strata
