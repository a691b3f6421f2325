// Eviction policies: which copy a TierManager drops (or writes back and then drops) when a tier is
// full. The manager offers the copies that can go now; the policy picks one.
//
// Thread-safety: ChooseVictim is called with the manager's lock held (it must not call back into
// the manager); FutureUsePolicy's windows may be set from any thread meanwhile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/mutex.h"
#include "tiers/tier.h"

namespace strata {

// A copy that could be evicted, offered to the policy.
struct EvictionCandidate {
  BlockId id;
  uint64_t last_use;          // a logical clock: larger = used more recently
  bool awaiting_use = false;  // prefetched and not acquired since: needed soon
};

// Chooses which copy to evict. Called with the manager's lock held: must not call back into it.
class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // Returns the index in `candidates` (never empty) of the copy to evict from `tier`.
  virtual size_t ChooseVictim(Tier tier, std::span<const EvictionCandidate> candidates) = 0;
};

// Least recently used, sparing copies that were prefetched and not used yet (evicting those would
// throw away the prefetch: their last use is older than the copy just released).
class LruPolicy final : public EvictionPolicy {
 public:
  size_t ChooseVictim(Tier tier, std::span<const EvictionCandidate> candidates) override;
};

// Belady's rule over caller-supplied windows of upcoming uses: evicts a block in no window (LRU
// among those), else the one whose next use is furthest away; as LruPolicy, it spares copies
// prefetched and not used yet while any other candidate exists.
//
// Each client that knows its own upcoming uses (the engine's parameter coordinator, its optimizer
// pipeline) sets its own window, so clients on different threads never overwrite each other's: a
// block's next use is the nearest over all windows (its position in each). A client empties its
// window (SetUpcoming with {}) when its uses end. Window kDefaultWindow exists from the start.
class FutureUsePolicy final : public EvictionPolicy {
 public:
  using Window = int;
  static constexpr Window kDefaultWindow = 0;

  // A new, empty window for one more client. Any thread.
  Window AddWindow() EXCLUDES(mu_);
  // Replaces `window`'s upcoming uses (nearest first). Any thread.
  void SetUpcoming(Window window, std::vector<BlockId> upcoming) EXCLUDES(mu_);
  void SetUpcoming(std::vector<BlockId> upcoming) EXCLUDES(mu_) {
    SetUpcoming(kDefaultWindow, std::move(upcoming));
  }
  size_t ChooseVictim(Tier tier, std::span<const EvictionCandidate> candidates) override
      EXCLUDES(mu_);

 private:
  Mutex mu_;
  std::vector<std::vector<BlockId>> windows_ GUARDED_BY(mu_) = {{}};  // by Window
};

}  // namespace strata
