// Pin: keeps one copy of a TierManager block resident and valid in one tier while it lives.
// Move-only; made only by TierManager::Acquire.
//
// Thread-safety: a Pin is used by one thread at a time (it may be moved to another); its methods
// take the manager's lock. It must not be destroyed (released) with the manager's lock held, and
// the manager must outlive it.
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "tiers/tier.h"

namespace strata {

class TierManager;

class Pin {
 public:
  Pin() = default;
  Pin(Pin&& other) noexcept;
  Pin& operator=(Pin&& other) noexcept;
  Pin(const Pin&) = delete;
  Pin& operator=(const Pin&) = delete;
  ~Pin() { Release(); }

  // Blocks until the copy is valid (a fetch may be in flight); returns the fetch's error if it
  // failed. REQUIRES: valid().
  Status Wait() const;
  bool Ready() const;
  // The copy's bytes: a device address for Tier::kDevice, host memory for Tier::kPinned.
  // REQUIRES: Wait() returned OK.
  void* data() const;
  uint64_t size() const;
  Tier tier() const { return tier_; }
  BlockId id() const { return id_; }
  bool valid() const { return manager_ != nullptr; }

  // Declares that the caller wrote this copy: it becomes the only valid copy. REQUIRES: Wait() OK.
  void MarkDirty();
  void Release();

 private:
  friend class TierManager;
  struct Completion;
  Pin(TierManager* m, BlockId id, Tier tier, std::shared_ptr<Completion> c)
      : manager_(m), id_(id), tier_(tier), completion_(std::move(c)) {}
  TierManager* manager_ = nullptr;
  BlockId id_ = 0;
  Tier tier_ = Tier::kPinned;
  std::shared_ptr<Completion> completion_;  // null when the copy was valid at Acquire
};

}  // namespace strata
