// The DeviceBackend contract (tiers/device.h), run against every backend this build has.
// HostDevice always; CudaDevice is added by gpu/ tests where a GPU is present.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "tiers/host_device.h"

namespace strata {
namespace {

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 31 + (i >> 9));
  return v;
}

class HostDeviceTest : public ::testing::Test {
 protected:
  HostDeviceOptions Options() {
    HostDeviceOptions o;
    o.budget_bytes = 8 << 20;
    o.poison = true;
    return o;
  }
};

TEST_F(HostDeviceTest, RoundTripThroughDeviceMemory) {
  HostDevice dev(Options());
  auto stream = dev.CreateStream("copy");
  ASSERT_TRUE(stream.ok());
  const auto src = Pattern(1 << 20, 7);
  std::vector<uint8_t> back(src.size(), 0);
  auto mem = dev.Allocate(src.size());
  ASSERT_TRUE(mem.ok()) << mem.status().ToString();
  ASSERT_TRUE(
      dev.CopyAsync(mem->data(), src.data(), src.size(), CopyKind::kHostToDevice, **stream).ok());
  ASSERT_TRUE(
      dev.CopyAsync(back.data(), mem->data(), src.size(), CopyKind::kDeviceToHost, **stream).ok());
  auto ev = dev.RecordEvent(**stream);
  ASSERT_TRUE(ev.ok());
  ASSERT_TRUE(ev->Wait().ok());
  EXPECT_EQ(back, src);
}

TEST_F(HostDeviceTest, BudgetIsNeverExceededAndFreesReturnIt) {
  HostDevice dev(Options());
  auto a = dev.Allocate(6 << 20);
  ASSERT_TRUE(a.ok());
  auto b = dev.Allocate(3 << 20);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("exceeds the budget"), std::string::npos);
  EXPECT_EQ(dev.used_bytes(), 6u << 20);
  a->Reset();
  EXPECT_EQ(dev.used_bytes(), 0u);
  auto c = dev.Allocate(8 << 20);
  EXPECT_TRUE(c.ok());
  EXPECT_EQ(dev.peak_bytes(), 8u << 20);
  EXPECT_FALSE(dev.Allocate(0).ok());
}

TEST_F(HostDeviceTest, CopyIsNotVisibleBeforeItsEvent) {
  HostDeviceOptions o = Options();
  o.copy_delay_us = 50000;  // 50 ms: long enough that an immediate read sees the old bytes
  HostDevice dev(o);
  auto stream = dev.CreateStream("h2d");
  ASSERT_TRUE(stream.ok());
  std::vector<uint8_t> src(4096, 0x11), dst(4096, 0x22);
  ASSERT_TRUE(
      dev.CopyAsync(dst.data(), src.data(), src.size(), CopyKind::kDeviceToHost, **stream).ok());
  auto ev = dev.RecordEvent(**stream);
  ASSERT_TRUE(ev.ok());
  EXPECT_FALSE(ev->Query());  // CopyAsync returned before copying (reading dst now would race)
  ASSERT_TRUE(ev->Wait().ok());
  EXPECT_TRUE(ev->Query());
  EXPECT_EQ(dst[4095], 0x11);
}

TEST_F(HostDeviceTest, StreamsRunInOrderAndWaitOnOtherStreamsEvents) {
  HostDeviceOptions o = Options();
  o.copy_delay_us = 20000;
  HostDevice dev(o);
  auto s1 = dev.CreateStream("a");
  auto s2 = dev.CreateStream("b");
  ASSERT_TRUE(s1.ok() && s2.ok());
  std::vector<uint8_t> a(1024, 1), b(1024, 0), c(1024, 0);
  // s1: b <- a (slow). s2 waits for it, then c <- b. Without the wait c would copy zeros.
  ASSERT_TRUE(dev.CopyAsync(b.data(), a.data(), 1024, CopyKind::kDeviceToDevice, **s1).ok());
  auto e1 = dev.RecordEvent(**s1);
  ASSERT_TRUE(e1.ok());
  ASSERT_TRUE(dev.StreamWaitEvent(**s2, *e1).ok());
  ASSERT_TRUE(dev.CopyAsync(c.data(), b.data(), 1024, CopyKind::kDeviceToDevice, **s2).ok());
  ASSERT_TRUE(dev.Synchronize(**s2).ok());
  EXPECT_EQ(c, a);

  // In-order execution on one stream: host functions observe the sequence.
  std::vector<int> order;
  std::mutex mu;
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(dev.LaunchHostFunc(**s1,
                                   [&, i] {
                                     std::lock_guard<std::mutex> l(mu);
                                     order.push_back(i);
                                   })
                    .ok());
  }
  ASSERT_TRUE(dev.Synchronize(**s1).ok());
  std::vector<int> expect(50);
  std::iota(expect.begin(), expect.end(), 0);
  EXPECT_EQ(order, expect);
}

TEST_F(HostDeviceTest, ManyThreadsCopyConcurrently) {
  HostDevice dev(Options());
  constexpr int kThreads = 4;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto s = dev.CreateStream("t");
      auto mem = dev.Allocate(64 << 10);
      if (!s.ok() || !mem.ok()) return void(++failures);
      for (int i = 0; i < 20; ++i) {
        auto src = Pattern(64 << 10, static_cast<uint8_t>(t * 40 + i));
        std::vector<uint8_t> back(src.size());
        if (!dev.CopyAsync(mem->data(), src.data(), src.size(), CopyKind::kHostToDevice, **s)
                 .ok() ||
            !dev.CopyAsync(back.data(), mem->data(), src.size(), CopyKind::kDeviceToHost, **s)
                 .ok() ||
            !dev.Synchronize(**s).ok() || back != src) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(dev.used_bytes(), 0u);
}

}  // namespace
}  // namespace strata
