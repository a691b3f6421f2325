#include "tiers/pinned_arena.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "tiers/host_device.h"

namespace strata {
namespace {

TEST(PinnedArenaTest, ExactSizeAlignedBuffersAndCoalescing) {
  HostDevice dev;
  auto arena = PinnedArena::Create({.bytes = 1 << 20, .budget_key = "test.pinned", .device = &dev});
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  EXPECT_EQ((*arena)->capacity(), 1u << 20);  // no power-of-two growth beyond the ask
  auto a = (*arena)->Allocate(100);           // rounds to one 4 KiB unit
  auto b = (*arena)->Allocate(300 << 10);
  auto c = (*arena)->Allocate(4096);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->size(), 4096u);
  for (auto* buf : {&*a, &*b, &*c}) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->data()) % 4096, 0u);
    EXPECT_TRUE((*arena)->Contains(buf->data()));
    std::memset(buf->data(), 0x5a, buf->size());
  }
  EXPECT_EQ((*arena)->used_bytes(), 4096u + (300u << 10) + 4096u);
  // Free the middle one, then the first: they must merge into one extent at the start.
  b->Reset();
  a->Reset();
  EXPECT_GE((*arena)->largest_free_bytes(), (304u << 10));
  auto d = (*arena)->Allocate(304 << 10);
  ASSERT_TRUE(d.ok());
  c->Reset();
  d->Reset();
  EXPECT_EQ((*arena)->used_bytes(), 0u);
  EXPECT_EQ((*arena)->largest_free_bytes(), 1u << 20);
}

TEST(PinnedArenaTest, RefusesSizesOverTheBudgetNamingTheKey) {
  auto arena = PinnedArena::Create(
      {.bytes = 64 << 20, .budget_bytes = 16 << 20, .budget_key = "offload_param.buffer_size"});
  ASSERT_FALSE(arena.ok());
  EXPECT_EQ(arena.status().code(), StatusCode::kResourceExhausted);
  const std::string msg(arena.status().message());
  EXPECT_NE(msg.find("64.00 MiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("16.00 MiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offload_param.buffer_size"), std::string::npos) << msg;

  auto huge = PinnedArena::Create({.bytes = 1ull << 50, .budget_key = "k"});
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(std::string(huge.status().message()).find("available"), std::string::npos);
}

TEST(PinnedArenaTest, FullArenaSaysWhatIsFree) {
  auto arena = PinnedArena::Create({.bytes = 64 << 10});
  ASSERT_TRUE(arena.ok());
  auto a = (*arena)->Allocate(60 << 10);
  ASSERT_TRUE(a.ok());
  auto b = (*arena)->Allocate(8 << 10);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(b.status().message()).find("largest free extent 4.00 KiB"),
            std::string::npos)
      << b.status().message();
}

TEST(PinnedArenaTest, RandomAllocFreeKeepsAccountingExact) {
  auto arena = PinnedArena::Create({.bytes = 4 << 20});
  ASSERT_TRUE(arena.ok());
  std::mt19937 rng(42);
  std::vector<PinnedBuffer> live;
  uint64_t expect_used = 0;
  for (int i = 0; i < 5000; ++i) {
    if (!live.empty() && (rng() % 2 == 0 || live.size() > 40)) {
      size_t k = rng() % live.size();
      expect_used -= live[k].size();
      live.erase(live.begin() + static_cast<long>(k));
    } else {
      auto b = (*arena)->Allocate(1 + rng() % (200 << 10));
      if (b.ok()) {
        expect_used += b->size();
        // Buffers never overlap: tag the first byte with the index and check later.
        live.push_back(std::move(*b));
      }
    }
    ASSERT_EQ((*arena)->used_bytes(), expect_used);
    ASSERT_LE(expect_used, (*arena)->capacity());
  }
  std::vector<std::pair<std::byte*, uint64_t>> spans;
  for (auto& b : live) spans.emplace_back(b.data(), b.size());
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    EXPECT_LE(spans[i - 1].first + spans[i - 1].second, spans[i].first);
  }
  live.clear();
  EXPECT_EQ((*arena)->largest_free_bytes(), 4u << 20);
}

}  // namespace
}  // namespace strata
