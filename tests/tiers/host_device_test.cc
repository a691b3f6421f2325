// HostDevice's memory pool (tiers/host_device.h): freed blocks are reused, so a loop that frees
// and allocates the same sizes touches no new pages; the budget still bounds live memory, and the
// cache gives way to it; poisoning covers reused blocks. The stream and copy contract is checked
// for every device in tests/conformance/device_conformance_test.cc.
#include "tiers/host_device.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "base/clock.h"

namespace strata {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// TSan maps shadow memory for what an mremap moves, so faults there say nothing about the pool.
#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
#else
constexpr bool kThreadSanitizer = false;
#endif

DeviceMemory MustAllocate(HostDevice& dev, uint64_t bytes) {
  Result<DeviceMemory> m = dev.Allocate(bytes);
  EXPECT_TRUE(m.ok()) << "allocating " << bytes << ": " << m.status().ToString();
  return m.ok() ? std::move(m).value() : DeviceMemory();
}

bool AllBytesAre(const void* p, uint64_t n, unsigned char value) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (uint64_t i = 0; i < n; ++i) {
    if (b[i] != value) return false;
  }
  return true;
}

TEST(HostDeviceTest, FreedBlockIsReusedForTheSameSizeClass) {
  HostDevice dev({.budget_bytes = 64 * kMiB});
  for (const uint64_t bytes : {uint64_t{1000}, 4 * kMiB}) {
    DeviceMemory a = MustAllocate(dev, bytes);
    ASSERT_TRUE(a.valid());
    void* const first = a.data();
    a.Reset();
    EXPECT_EQ(dev.used_bytes(), 0u);
    EXPECT_GE(dev.reserved_bytes(), bytes) << "the freed block is cached";
    DeviceMemory b = MustAllocate(dev, bytes);
    EXPECT_EQ(b.data(), first) << bytes;
    EXPECT_EQ(dev.used_bytes(), bytes);
    b.Reset();
    // A size in the same class (4 KiB pages above 1 MiB, 256 B below) gets the same block.
    DeviceMemory c = MustAllocate(dev, bytes - 10);
    EXPECT_EQ(c.data(), first) << bytes;
  }
  EXPECT_EQ(dev.peak_bytes(), 4 * kMiB);
}

// The point of the pool: after a warm-up, allocating, writing and freeing the same blocks again
// takes no page faults. Without it, every iteration below maps ~9 MiB anew: ~2,400 faults each.
TEST(HostDeviceTest, SteadyStateAllocTouchFreeTakesNoPageFaults) {
  HostDevice dev({.budget_bytes = 64 * kMiB});
  const std::vector<uint64_t> sizes = {3 * kMiB, 5 * kMiB + 123, 200 << 10, kMiB, 4096};
  auto iteration = [&] {
    std::vector<DeviceMemory> live;
    for (uint64_t bytes : sizes) {
      live.push_back(MustAllocate(dev, bytes));
      if (live.back().valid()) std::memset(live.back().data(), 0x3c, bytes);
    }
  };
  for (int i = 0; i < 2; ++i) iteration();
  constexpr int kIterations = 20;
  const PageFaults before = ProcessPageFaults();
  for (int i = 0; i < kIterations; ++i) iteration();
  const PageFaults after = ProcessPageFaults();
  // Generous: a few faults from the test harness or the allocator's bookkeeping are fine; one
  // iteration's worth of fresh pages (~2,400) is not.
  EXPECT_LT(after.minor - before.minor, 200u)
      << "minor faults over " << kIterations << " alloc/touch/free iterations";
  EXPECT_EQ(dev.used_bytes(), 0u);
  EXPECT_LE(dev.reserved_bytes(), 64 * kMiB);
}

// Budget 8 MiB. The cache never makes an allocation fail that fits the budget, never lets one
// through that does not, and shrinks so that live + cached stays within the budget.
TEST(HostDeviceTest, BudgetIsEnforcedWithAFullCache) {
  constexpr uint64_t kBudget = 8 * kMiB;
  HostDevice dev({.budget_bytes = kBudget});
  {
    // Fill the cache with eight 1 MiB blocks.
    std::vector<DeviceMemory> blocks;
    for (int i = 0; i < 8; ++i) blocks.push_back(MustAllocate(dev, kMiB));
    Result<DeviceMemory> over = dev.Allocate(kMiB);
    ASSERT_FALSE(over.ok());
    EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(over.status().message().find("exceeds the budget"), std::string::npos)
        << over.status().ToString();
  }
  EXPECT_EQ(dev.used_bytes(), 0u);
  EXPECT_EQ(dev.reserved_bytes(), kBudget);
  // A different size: the cached blocks give way to it.
  DeviceMemory big = MustAllocate(dev, 7 * kMiB);
  ASSERT_TRUE(big.valid());
  std::memset(big.data(), 1, big.size());
  EXPECT_LE(dev.reserved_bytes(), kBudget);
  EXPECT_EQ(dev.used_bytes(), 7 * kMiB);
  // Live bytes still bound what can be had: 2 MiB more does not fit, whatever the cache holds.
  Result<DeviceMemory> over = dev.Allocate(2 * kMiB);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  DeviceMemory small = MustAllocate(dev, kMiB);  // 1 MiB does
  EXPECT_LE(dev.reserved_bytes(), kBudget);
  big.Reset();
  small.Reset();
  DeviceMemory all = MustAllocate(dev, kBudget);  // the whole budget, from a full cache
  ASSERT_TRUE(all.valid());
  std::memset(all.data(), 2, all.size());
  EXPECT_EQ(dev.reserved_bytes(), kBudget);
  EXPECT_EQ(dev.peak_bytes(), kBudget);
}

// Without room for a new block, a cached one is cut down (same address, its pages kept) or grown.
TEST(HostDeviceTest, CachedBlockIsCutOrGrownWhenTheBudgetHasNoRoom) {
  constexpr uint64_t kBudget = 8 * kMiB;
  HostDevice dev({.budget_bytes = kBudget});
  DeviceMemory a = MustAllocate(dev, 6 * kMiB);
  ASSERT_TRUE(a.valid());
  std::memset(a.data(), 7, a.size());
  void* const six = a.data();
  a.Reset();
  // 6 + 4 > 8: the 6 MiB block becomes the 4 MiB one.
  DeviceMemory b = MustAllocate(dev, 4 * kMiB);
  EXPECT_EQ(b.data(), six);
  EXPECT_EQ(dev.reserved_bytes(), 4 * kMiB);
  b.Reset();
  // 4 + 7 > 8: the 4 MiB block grows to 7 MiB; only its new 3 MiB are fresh pages.
  const PageFaults before = ProcessPageFaults();
  DeviceMemory c = MustAllocate(dev, 7 * kMiB);
  ASSERT_TRUE(c.valid());
  std::memset(c.data(), 8, c.size());
  const PageFaults after = ProcessPageFaults();
  EXPECT_EQ(dev.reserved_bytes(), 7 * kMiB);
  if (!kThreadSanitizer) {
    EXPECT_LT(after.minor - before.minor, (5 * kMiB) / 4096) << "more faults than a fresh 7 MiB";
  }
}

TEST(HostDeviceTest, PoisonFillsReusedBlocksAndFreedOnes) {
  HostDevice dev({.budget_bytes = 16 * kMiB, .poison = true});
  for (const uint64_t bytes : {uint64_t{3000}, 2 * kMiB}) {
    DeviceMemory a = MustAllocate(dev, bytes);
    ASSERT_TRUE(a.valid());
    EXPECT_TRUE(AllBytesAre(a.data(), bytes, 0xA5)) << bytes;
    std::memset(a.data(), 0x11, bytes);
    auto* const raw = static_cast<unsigned char*>(a.data());
    a.Reset();
    // The block is in the cache, still mapped: freeing filled it with 0xDD.
    EXPECT_TRUE(AllBytesAre(raw, bytes, 0xDD)) << bytes;
    DeviceMemory b = MustAllocate(dev, bytes);
    ASSERT_EQ(b.data(), raw) << "reused";
    EXPECT_TRUE(AllBytesAre(b.data(), bytes, 0xA5)) << "a reused block is poisoned too";
  }
}

// Threads allocating and freeing mixed sizes under a tight budget: no block is handed out twice
// (each thread's pattern survives), and the accounting ends where it started.
TEST(HostDeviceTest, ConcurrentAllocAndFreeKeepTheAccounting) {
  constexpr uint64_t kBudget = 24 * kMiB;
  HostDevice dev({.budget_bytes = kBudget});
  std::atomic<int> corrupted{0};
  std::atomic<uint64_t> over_reserved{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      const uint64_t sizes[] = {512, 300 << 10, kMiB, 2 * kMiB + 4096, 5 * kMiB};
      for (int i = 0; i < 200; ++i) {
        const uint64_t bytes = sizes[rng() % 5];
        Result<DeviceMemory> m = dev.Allocate(bytes);
        if (!m.ok()) continue;  // the budget is shared: a refusal is expected now and then
        const auto mark = static_cast<unsigned char>(t * 50 + i % 50);
        std::memset(m->data(), mark, bytes);
        std::this_thread::yield();
        if (!AllBytesAre(m->data(), bytes, mark)) corrupted++;
        if (dev.reserved_bytes() > kBudget) over_reserved++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(corrupted.load(), 0);
  EXPECT_EQ(over_reserved.load(), 0u);
  EXPECT_EQ(dev.used_bytes(), 0u);
  EXPECT_LE(dev.reserved_bytes(), kBudget);
}

}  // namespace
}  // namespace strata
