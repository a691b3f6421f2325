#include "tiers/memory_ledger.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace strata {
namespace {

TEST(MemoryLedgerTest, ChargesPerTierAndTagAndRefusesOverBudget) {
  MemoryLedger ledger;
  ASSERT_TRUE(ledger.SetBudget(Tier::kDevice, 1000).ok());
  auto a = ledger.Reserve(Tier::kDevice, MemoryTag::kParams, 600);
  auto b = ledger.Reserve(Tier::kDevice, MemoryTag::kGrads, 300);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(ledger.used(Tier::kDevice), 900u);
  EXPECT_EQ(ledger.used(Tier::kDevice, MemoryTag::kGrads), 300u);
  auto c = ledger.Reserve(Tier::kDevice, MemoryTag::kOptimizer, 101);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(
      std::string(c.status().message()).find("device tier cannot reserve 101 B for optimizer"),
      std::string::npos)
      << c.status().message();
  EXPECT_FALSE(ledger.WouldFit(Tier::kDevice, 101));
  EXPECT_TRUE(ledger.WouldFit(Tier::kDevice, 100));
  EXPECT_FALSE(ledger.SetBudget(Tier::kDevice, 800).ok());  // 900 already reserved
  a->Release();
  EXPECT_EQ(ledger.used(Tier::kDevice), 300u);
  EXPECT_EQ(ledger.peak(Tier::kDevice), 900u);
  // Unlimited tiers accept anything.
  EXPECT_TRUE(ledger.Reserve(Tier::kNvme, MemoryTag::kOptimizer, 1ull << 40).ok());
}

TEST(MemoryLedgerTest, MovedReservationReturnsOnce) {
  MemoryLedger ledger;
  ASSERT_TRUE(ledger.SetBudget(Tier::kPinned, 100).ok());
  {
    auto r = ledger.Reserve(Tier::kPinned, MemoryTag::kBuffers, 100);
    ASSERT_TRUE(r.ok());
    Reservation moved = std::move(*r);
    Reservation again;
    again = std::move(moved);
    EXPECT_EQ(ledger.used(Tier::kPinned), 100u);
  }
  EXPECT_EQ(ledger.used(Tier::kPinned), 0u);
}

TEST(MemoryLedgerTest, ConcurrentReservationsNeverExceedBudget) {
  MemoryLedger ledger;
  ASSERT_TRUE(ledger.SetBudget(Tier::kHost, 10000).ok());
  std::atomic<bool> over{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        auto r = ledger.Reserve(Tier::kHost, MemoryTag::kParams, 1 + (i * 37) % 3000);
        if (ledger.used(Tier::kHost) > 10000) over = true;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE(over.load());
  EXPECT_EQ(ledger.used(Tier::kHost), 0u);
  EXPECT_LE(ledger.peak(Tier::kHost), 10000u);
}

}  // namespace
}  // namespace strata
