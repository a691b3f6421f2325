#include "tiers/memory_ledger.h"

#include <utility>

#include "base/bytes.h"

namespace strata {

std::string_view MemoryTagName(MemoryTag tag) {
  switch (tag) {
    case MemoryTag::kParams:
      return "params";
    case MemoryTag::kGrads:
      return "grads";
    case MemoryTag::kOptimizer:
      return "optimizer";
    case MemoryTag::kBuffers:
      return "buffers";
    case MemoryTag::kActivations:
      return "activations";
  }
  return "?";
}

Status MemoryLedger::SetBudget(Tier tier, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  TierState& t = tiers_[static_cast<int>(tier)];
  if (bytes != 0 && t.used > bytes) {
    return FailedPreconditionError("cannot set the " + std::string(TierName(tier)) + " budget to " +
                                   FormatBytes(bytes) + ": " + FormatBytes(t.used) +
                                   " is already reserved");
  }
  t.budget = bytes;
  return Status::Ok();
}

Result<Reservation> MemoryLedger::Reserve(Tier tier, MemoryTag tag, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  TierState& t = tiers_[static_cast<int>(tier)];
  if (t.budget != 0 && (bytes > t.budget || t.used > t.budget - bytes)) {
    return ResourceExhaustedError(std::string(TierName(tier)) + " tier cannot reserve " +
                                  FormatBytes(bytes) + " for " + std::string(MemoryTagName(tag)) +
                                  ": " + FormatBytes(t.used) + " of " + FormatBytes(t.budget) +
                                  " in use");
  }
  t.used += bytes;
  t.by_tag[static_cast<int>(tag)] += bytes;
  t.peak = std::max(t.peak, t.used);
  return Reservation(this, tier, tag, bytes);
}

bool MemoryLedger::WouldFit(Tier tier, uint64_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  const TierState& t = tiers_[static_cast<int>(tier)];
  return t.budget == 0 || (bytes <= t.budget && t.used <= t.budget - bytes);
}

void MemoryLedger::Return(Tier tier, MemoryTag tag, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  TierState& t = tiers_[static_cast<int>(tier)];
  t.used -= bytes;
  t.by_tag[static_cast<int>(tag)] -= bytes;
}

uint64_t MemoryLedger::budget(Tier tier) const {
  std::lock_guard<std::mutex> lock(mu_);
  return tiers_[static_cast<int>(tier)].budget;
}
uint64_t MemoryLedger::used(Tier tier) const {
  std::lock_guard<std::mutex> lock(mu_);
  return tiers_[static_cast<int>(tier)].used;
}
uint64_t MemoryLedger::used(Tier tier, MemoryTag tag) const {
  std::lock_guard<std::mutex> lock(mu_);
  return tiers_[static_cast<int>(tier)].by_tag[static_cast<int>(tag)];
}
uint64_t MemoryLedger::peak(Tier tier) const {
  std::lock_guard<std::mutex> lock(mu_);
  return tiers_[static_cast<int>(tier)].peak;
}

Reservation::Reservation(Reservation&& other) noexcept
    : ledger_(std::exchange(other.ledger_, nullptr)),
      tier_(other.tier_),
      tag_(other.tag_),
      bytes_(std::exchange(other.bytes_, 0)) {}

Reservation& Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    Release();
    ledger_ = std::exchange(other.ledger_, nullptr);
    tier_ = other.tier_;
    tag_ = other.tag_;
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void Reservation::Release() {
  if (ledger_ != nullptr) ledger_->Return(tier_, tag_, bytes_);
  ledger_ = nullptr;
  bytes_ = 0;
}

}  // namespace strata
