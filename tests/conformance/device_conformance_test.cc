// The DeviceBackend contract (tiers/device.h), run against every device kind this program has
// registered (tiers/device_registry.h): "host" always, "cuda" in CUDA builds. A kind that cannot
// open here (cuda without a GPU) skips each test with the reason.
//
// Nothing here depends on timing: where a test must observe work that has not run yet, it blocks
// the stream with a host function waiting on a Gate, checks, then opens the gate. Host buffers
// that gated copies touch come from a PinnedArena registered with the device, because CUDA copies
// to or from pageable memory may wait for the stream on the calling thread (and would deadlock).
// Gated tests declare buffers, then streams, then the gate: on a failed assertion the gate opens
// first, each stream then drains, and only then is the memory its copies use freed.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/pattern.h"
#include "tiers/device_registry.h"
#include "tiers/pinned_arena.h"

namespace strata {
namespace {

using testing::FillPattern;
using testing::Pattern;

constexpr uint64_t kBudget = 8 << 20;

// A latch a stream can wait on. Open() is idempotent and runs on destruction, so a failed
// assertion never leaves a stream blocked (its destructor would wait forever).
class Gate {
 public:
  ~Gate() { Open(); }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

class DeviceConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<DeviceBackend>> dev =
        OpenDevice(GetParam(), {.budget_bytes = kBudget, .poison = true});
    if (!dev.ok()) {
      if (dev.status().code() == StatusCode::kUnavailable) {
        GTEST_SKIP() << dev.status().message();
      }
      FAIL() << dev.status().ToString();
    }
    dev_ = std::move(dev).value();
    auto arena = PinnedArena::Create({.bytes = 4 << 20, .device = dev_.get()});
    ASSERT_TRUE(arena.ok()) << arena.status().ToString();
    arena_ = std::move(arena).value();
  }

  std::unique_ptr<Stream> NewStream(const char* name) {
    Result<std::unique_ptr<Stream>> s = dev_->CreateStream(name);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  PinnedBuffer Pinned(uint64_t bytes, uint64_t seed) {
    Result<PinnedBuffer> b = arena_->Allocate(bytes);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (b.ok()) FillPattern(b->data(), b->size(), seed);
    return b.ok() ? std::move(b).value() : PinnedBuffer();
  }
  DeviceMemory Memory(uint64_t bytes) {
    Result<DeviceMemory> m = dev_->Allocate(bytes);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(m).value() : DeviceMemory();
  }
  // Enqueues src -> device memory `mem` -> dst on `stream`: one H2D and one D2H copy.
  Status EnqueueRoundTrip(const void* src, void* mem, void* dst, uint64_t bytes, Stream& stream) {
    STRATA_RETURN_IF_ERROR(dev_->CopyAsync(mem, src, bytes, CopyKind::kHostToDevice, stream));
    return dev_->CopyAsync(dst, mem, bytes, CopyKind::kDeviceToHost, stream);
  }
  void BlockOn(Stream& stream, Gate& gate) {
    ASSERT_TRUE(dev_->LaunchHostFunc(stream, [&gate] { gate.Wait(); }).ok());
  }

  // The arena is registered with the device, so it must go first (members die in reverse order).
  std::unique_ptr<DeviceBackend> dev_;
  std::unique_ptr<PinnedArena> arena_;
};

TEST_P(DeviceConformanceTest, InfoReportsTheBudget) {
  const DeviceInfo info = dev_->info();
  EXPECT_FALSE(info.name.empty());
  EXPECT_EQ(info.budget_bytes, kBudget);
  EXPECT_EQ(dev_->used_bytes(), 0u);
}

TEST_P(DeviceConformanceTest, RoundTripThroughDeviceMemory) {
  PinnedBuffer src = Pinned(1 << 20, 7);
  PinnedBuffer back = Pinned(1 << 20, 0);
  DeviceMemory a = Memory(src.size());
  DeviceMemory b = Memory(src.size());
  ASSERT_TRUE(a.valid() && b.valid() && src.valid() && back.valid());
  auto stream = NewStream("copy");
  ASSERT_NE(stream, nullptr);
  ASSERT_TRUE(
      dev_->CopyAsync(a.data(), src.data(), src.size(), CopyKind::kHostToDevice, *stream).ok());
  ASSERT_TRUE(
      dev_->CopyAsync(b.data(), a.data(), src.size(), CopyKind::kDeviceToDevice, *stream).ok());
  ASSERT_TRUE(
      dev_->CopyAsync(back.data(), b.data(), src.size(), CopyKind::kDeviceToHost, *stream).ok());
  Result<Event> ev = dev_->RecordEvent(*stream);
  ASSERT_TRUE(ev.ok()) << ev.status().ToString();
  ASSERT_TRUE(ev->Wait().ok());
  EXPECT_EQ(std::memcmp(back.data(), src.data(), src.size()), 0);
}

TEST_P(DeviceConformanceTest, BudgetIsNeverExceededAndFreesReturnIt) {
  Result<DeviceMemory> a = dev_->Allocate(6 << 20);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  Result<DeviceMemory> b = dev_->Allocate(3 << 20);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("exceeds the budget"), std::string::npos)
      << b.status().ToString();
  EXPECT_EQ(dev_->used_bytes(), 6u << 20);
  a->Reset();
  EXPECT_EQ(dev_->used_bytes(), 0u);
  Result<DeviceMemory> c = dev_->Allocate(kBudget);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(dev_->peak_bytes(), kBudget);
  EXPECT_EQ(dev_->Allocate(0).status().code(), StatusCode::kInvalidArgument);
}

TEST_P(DeviceConformanceTest, CopyIsNotVisibleBeforeItsEvent) {
  PinnedBuffer src = Pinned(64 << 10, 1);
  PinnedBuffer dst = Pinned(64 << 10, 2);
  DeviceMemory mem = Memory(src.size());
  ASSERT_TRUE(src.valid() && dst.valid() && mem.valid());
  const std::vector<std::byte> before(dst.data(), dst.data() + dst.size());
  auto stream = NewStream("h2d");
  ASSERT_NE(stream, nullptr);
  Gate gate;
  BlockOn(*stream, gate);
  ASSERT_TRUE(EnqueueRoundTrip(src.data(), mem.data(), dst.data(), src.size(), *stream).ok());
  Result<Event> ev = dev_->RecordEvent(*stream);
  ASSERT_TRUE(ev.ok()) << ev.status().ToString();
  // CopyAsync returned before copying: the event is pending and the destination untouched.
  EXPECT_FALSE(ev->Query());
  EXPECT_EQ(std::memcmp(dst.data(), before.data(), before.size()), 0);
  gate.Open();
  ASSERT_TRUE(ev->Wait().ok());
  EXPECT_TRUE(ev->Query());
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), src.size()), 0);

  const Event copy = *ev;  // events are shared handles
  EXPECT_TRUE(copy.Query());
  const Event empty;
  EXPECT_TRUE(empty.Query());
  EXPECT_TRUE(empty.Wait().ok());
}

TEST_P(DeviceConformanceTest, StreamWaitsOnAnotherStreamsEvent) {
  PinnedBuffer src = Pinned(64 << 10, 3);
  PinnedBuffer out = Pinned(64 << 10, 4);
  DeviceMemory a = Memory(src.size()), b = Memory(src.size()), c = Memory(src.size());
  ASSERT_TRUE(src.valid() && out.valid() && a.valid() && b.valid() && c.valid());
  auto s1 = NewStream("a");
  auto s2 = NewStream("b");
  ASSERT_TRUE(s1 != nullptr && s2 != nullptr);
  ASSERT_TRUE(dev_->CopyAsync(a.data(), src.data(), src.size(), CopyKind::kHostToDevice, *s1).ok());
  ASSERT_TRUE(dev_->Synchronize(*s1).ok());

  // s1: (blocked) b <- a. s2 waits for that, then c <- b. Without the wait c would copy garbage.
  Gate gate;
  BlockOn(*s1, gate);
  ASSERT_TRUE(dev_->CopyAsync(b.data(), a.data(), src.size(), CopyKind::kDeviceToDevice, *s1).ok());
  Result<Event> e1 = dev_->RecordEvent(*s1);
  ASSERT_TRUE(e1.ok()) << e1.status().ToString();
  ASSERT_TRUE(dev_->StreamWaitEvent(*s2, *e1).ok());
  ASSERT_TRUE(dev_->CopyAsync(c.data(), b.data(), src.size(), CopyKind::kDeviceToDevice, *s2).ok());
  ASSERT_TRUE(dev_->CopyAsync(out.data(), c.data(), src.size(), CopyKind::kDeviceToHost, *s2).ok());
  Result<Event> e2 = dev_->RecordEvent(*s2);
  ASSERT_TRUE(e2.ok()) << e2.status().ToString();
  EXPECT_FALSE(e2->Query());  // s2 is held back by s1's event
  gate.Open();
  ASSERT_TRUE(dev_->Synchronize(*s2).ok());
  EXPECT_TRUE(e1->Query());
  EXPECT_EQ(std::memcmp(out.data(), src.data(), src.size()), 0);
}

// The contract in tiers/device.h: a host function never runs on the thread that launched it (not
// inline, not even on an idle stream), so a caller may hold a lock across LaunchHostFunc that the
// function takes (the TierManager does).
TEST_P(DeviceConformanceTest, HostFunctionsNeverRunOnTheCallersThread) {
  auto stream = NewStream("host functions");
  ASSERT_NE(stream, nullptr);
  std::mutex mu;
  std::vector<std::thread::id> ran_on;
  {
    std::lock_guard<std::mutex> held(mu);  // an inline call would deadlock here
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(dev_->LaunchHostFunc(*stream,
                                       [&] {
                                         std::lock_guard<std::mutex> lock(mu);
                                         ran_on.push_back(std::this_thread::get_id());
                                       })
                      .ok());
    }
  }
  ASSERT_TRUE(dev_->Synchronize(*stream).ok());
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(ran_on.size(), 8u);
  for (const std::thread::id& id : ran_on) EXPECT_NE(id, std::this_thread::get_id());
}

TEST_P(DeviceConformanceTest, WorkOnOneStreamRunsInSubmissionOrder) {
  std::mutex mu;
  std::vector<int> order;
  auto stream = NewStream("order");
  ASSERT_NE(stream, nullptr);
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(dev_->LaunchHostFunc(*stream,
                                     [&, i] {
                                       std::lock_guard<std::mutex> lock(mu);
                                       order.push_back(i);
                                     })
                    .ok());
  }
  ASSERT_TRUE(dev_->Synchronize(*stream).ok());
  std::vector<int> expect(50);
  std::iota(expect.begin(), expect.end(), 0);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(order, expect);
}

TEST_P(DeviceConformanceTest, StreamDestructorWaitsForQueuedWork) {
  PinnedBuffer src = Pinned(64 << 10, 5);
  PinnedBuffer dst = Pinned(64 << 10, 6);
  DeviceMemory mem = Memory(src.size());
  ASSERT_TRUE(src.valid() && dst.valid() && mem.valid());
  auto stream = NewStream("drain");
  ASSERT_NE(stream, nullptr);
  Gate gate;
  BlockOn(*stream, gate);
  ASSERT_TRUE(EnqueueRoundTrip(src.data(), mem.data(), dst.data(), src.size(), *stream).ok());
  std::thread opener([&gate] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate.Open();
  });
  stream.reset();  // must return only after the copies ran
  opener.join();
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), src.size()), 0);
}

TEST_P(DeviceConformanceTest, ManyThreadsCopyConcurrentlyFromPageableMemory) {
  constexpr int kThreads = 4;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Result<std::unique_ptr<Stream>> s = dev_->CreateStream("t");
      Result<DeviceMemory> mem = dev_->Allocate(64 << 10);
      if (!s.ok() || !mem.ok()) return void(++failures);
      for (int i = 0; i < 20; ++i) {
        const std::vector<std::byte> src = Pattern(64 << 10, t * 40 + i);
        std::vector<std::byte> back(src.size());
        if (!EnqueueRoundTrip(src.data(), mem->data(), back.data(), src.size(), **s).ok() ||
            !dev_->Synchronize(**s).ok() || back != src) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(dev_->used_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(RegisteredKinds, DeviceConformanceTest,
                         ::testing::ValuesIn(RegisteredDeviceKinds()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace strata
