// MemoryLedger and Reservation: byte budgets per tier, charged per (tier, tag).
//
// Every byte strata keeps resident is charged to a tier (device, pinned host, pageable host, NVMe)
// and a tag (what it is for). A Reservation is the move-only proof of a charge: the bytes return
// to the ledger when it is dropped. Reserve() refuses, with kResourceExhausted naming the tier,
// the tag, the asked bytes and the budget, rather than exceeding a budget. Budgets of 0 mean
// "unlimited" (the tier is not constrained).
//
// Thread-safety: all methods may be called from any thread. The ledger must outlive reservations.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string_view>

#include "base/status.h"
#include "tiers/tier.h"

namespace strata {


enum class MemoryTag : uint8_t { kParams = 0, kGrads, kOptimizer, kBuffers, kActivations };
inline constexpr int kNumTags = 5;
std::string_view MemoryTagName(MemoryTag tag);

class MemoryLedger;

class [[nodiscard]] Reservation {
 public:
  Reservation() = default;
  Reservation(Reservation&& other) noexcept;
  Reservation& operator=(Reservation&& other) noexcept;
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  ~Reservation() { Release(); }

  uint64_t bytes() const { return bytes_; }
  Tier tier() const { return tier_; }
  MemoryTag tag() const { return tag_; }
  bool valid() const { return ledger_ != nullptr; }
  void Release();

 private:
  friend class MemoryLedger;
  Reservation(MemoryLedger* ledger, Tier tier, MemoryTag tag, uint64_t bytes)
      : ledger_(ledger), tier_(tier), tag_(tag), bytes_(bytes) {}
  MemoryLedger* ledger_ = nullptr;
  Tier tier_ = Tier::kDevice;
  MemoryTag tag_ = MemoryTag::kParams;
  uint64_t bytes_ = 0;
};

class MemoryLedger {
 public:
  MemoryLedger() = default;
  MemoryLedger(const MemoryLedger&) = delete;
  MemoryLedger& operator=(const MemoryLedger&) = delete;

  // Sets a tier's budget (0 = unlimited). Fails if more than `bytes` is already reserved.
  Status SetBudget(Tier tier, uint64_t bytes);

  Result<Reservation> Reserve(Tier tier, MemoryTag tag, uint64_t bytes);
  // True if `bytes` more would fit in `tier` now (a hint: another thread may reserve first).
  bool WouldFit(Tier tier, uint64_t bytes) const;

  uint64_t budget(Tier tier) const;
  uint64_t used(Tier tier) const;
  uint64_t used(Tier tier, MemoryTag tag) const;
  uint64_t peak(Tier tier) const;

 private:
  friend class Reservation;
  void Return(Tier tier, MemoryTag tag, uint64_t bytes);

  struct TierState {
    uint64_t budget = 0;
    uint64_t used = 0;
    uint64_t peak = 0;
    std::array<uint64_t, kNumTags> by_tag{};
  };
  mutable std::mutex mu_;
  std::array<TierState, kNumTiers> tiers_{};  // guarded by mu_
};

}  // namespace strata
