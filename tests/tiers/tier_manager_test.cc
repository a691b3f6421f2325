// TierManager: exact contents across tiers under tiny budgets, budgets never exceeded, faults
// surfacing with the block's state left consistent, and eviction policies.
#include "tiers/tier_manager.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "swap/fault_injecting_backend.h"
#include "swap/io_backend.h"
#include "swap/swap_space.h"
#include "tests/testing/pattern.h"
#include "tests/testing/temp_dir.h"
#include "tiers/host_device.h"

namespace strata {
namespace {

// The contents of version `version` of block `id`: distinct for every block and every version,
// so a stale copy or another block's bytes never pass for the expected ones.
uint64_t Seed(BlockId id, uint32_t version) { return (uint64_t{id} << 32) | version; }

void Fill(void* p, uint64_t bytes, BlockId id, uint32_t version) {
  testing::FillPattern(p, bytes, Seed(id, version));
}

// Returns the index of the first wrong byte, or -1.
int64_t Check(const void* p, uint64_t bytes, BlockId id, uint32_t version) {
  return testing::FirstPatternMismatch(p, bytes, Seed(id, version));
}

// A HostDevice, a pinned arena, a swap space in a temp dir and an I/O backend, wired together.
struct Rig {
  Rig(uint64_t device_budget, uint64_t pinned_bytes, std::unique_ptr<IoBackend> io_override = {},
      uint32_t copy_delay_us = 0)
      : device(HostDeviceOptions{
            .budget_bytes = device_budget, .copy_delay_us = copy_delay_us, .poison = true}) {
    EXPECT_TRUE(dir.ok());
    auto sw = SwapSpace::Create({.nvme_path = dir.path(), .handle_signals = false});
    EXPECT_TRUE(sw.ok()) << sw.status().ToString();
    swap = std::move(*sw);
    if (io_override) {
      io = std::move(io_override);
    } else {
      auto b = OpenIoBackend("posix", IoOptions{.queue_depth = 8, .intra_op_parallelism = 2});
      EXPECT_TRUE(b.ok()) << b.status().ToString();
      io = std::move(*b);
    }
    auto a = PinnedArena::Create({.bytes = pinned_bytes, .device = &device});
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    arena = std::move(*a);
  }
  // TierManagerOptions::pin_wait of the next MakeManager.
  std::chrono::milliseconds pin_wait{std::chrono::seconds(10)};
  ~Rig() {
    manager.reset();
    arena.reset();
    io.reset();
    swap.reset();
  }
  void MakeManager(std::unique_ptr<EvictionPolicy> policy = {}, bool verify_checksums = true) {
    auto m = TierManager::Create({.device = &device,
                                  .arena = arena.get(),
                                  .io = io.get(),
                                  .policy = std::move(policy),
                                  .verify_checksums = verify_checksums,
                                  .pin_wait = pin_wait});
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    manager = std::move(*m);
  }
  BlockId Add(const std::string& name, uint64_t bytes) {
    auto ext = swap->Allocate(name, "params", bytes);
    EXPECT_TRUE(ext.ok()) << ext.status().ToString();
    NvmeLocation loc{ext->fd, ext->offset, ext->padded_length};
    auto id = manager->AddBlock(name, bytes, &loc);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return *id;
  }
  void CheckBudgets() const {
    ASSERT_LE(device.used_bytes(), device.info().budget_bytes);
    ASSERT_LE(arena->used_bytes(), arena->capacity());
  }

  testing::TempDir dir;  // first: removed after everything that uses it
  HostDevice device;
  std::unique_ptr<SwapSpace> swap;
  std::unique_ptr<IoBackend> io;
  std::unique_ptr<PinnedArena> arena;
  std::unique_ptr<TierManager> manager;
};

TEST(TierManagerTest, WriteFlushEvictRefetchToDevice) {
  Rig rig(/*device_budget=*/64 << 10, /*pinned_bytes=*/64 << 10);
  rig.MakeManager();
  const BlockId a = rig.Add("blocks.0.w", 40 << 10);
  const BlockId b = rig.Add("blocks.1.w", 40 << 10);
  {
    auto pin = rig.manager->Acquire(a, Tier::kPinned);
    ASSERT_TRUE(pin.ok());
    ASSERT_TRUE(pin->Wait().ok());
    Fill(pin->data(), 40 << 10, a, 1);
    pin->MarkDirty();
  }
  // b needs the pinned space: a is dirty there and must be written to NVMe first.
  {
    auto pin = rig.manager->Acquire(b, Tier::kPinned);
    ASSERT_TRUE(pin.ok()) << pin.status().ToString();
    ASSERT_TRUE(pin->Wait().ok());
    Fill(pin->data(), 40 << 10, b, 1);
    pin->MarkDirty();
  }
  EXPECT_TRUE(rig.manager->IsValid(a, Tier::kNvme));
  EXPECT_FALSE(rig.manager->IsResident(a, Tier::kPinned));
  // a to the device: NVMe -> pinned (evicting b, written back) -> device.
  auto dev = rig.manager->Acquire(a, Tier::kDevice);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  ASSERT_TRUE(dev->Wait().ok());
  EXPECT_EQ(Check(dev->data(), 40 << 10, a, 1), -1);
  EXPECT_TRUE(rig.manager->IsValid(b, Tier::kNvme));
  const TierTelemetry t = rig.manager->telemetry();
  EXPECT_EQ(t.pinned_to_device, 40u << 10);
  EXPECT_EQ(t.nvme_to_pinned, 40u << 10);
  EXPECT_EQ(t.pinned_to_nvme, 80u << 10);
  EXPECT_LE(t.pinned_peak_bytes, 64u << 10);
}

// OrderCopiesAfter: a copy the manager starts after it waits, on the device, for the event (work
// on another stream: a GPU still computing on a released unit's memory); nothing waits on the host.
TEST(TierManagerTest, CopiesStartedAfterOrderCopiesAfterWaitForTheEvent) {
  Rig rig(64 << 10, 64 << 10);
  rig.MakeManager();
  const BlockId a = rig.Add("a", 32 << 10);
  {
    auto pin = rig.manager->Acquire(a, Tier::kPinned, TierManager::Access::kOverwrite);
    ASSERT_TRUE(pin.ok());
    ASSERT_TRUE(pin->Wait().ok());
    Fill(pin->data(), 32 << 10, a, 3);
    pin->MarkDirty();
  }
  auto compute = rig.device.CreateStream("compute");
  ASSERT_TRUE(compute.ok());
  std::promise<void> go;
  std::shared_future<void> released = go.get_future().share();
  ASSERT_TRUE(rig.device.LaunchHostFunc(**compute, [released] { released.wait(); }).ok());
  auto computed = rig.device.RecordEvent(**compute);
  ASSERT_TRUE(computed.ok());
  ASSERT_TRUE(rig.manager->OrderCopiesAfter(*computed).ok());  // returns at once
  auto dev = rig.manager->Acquire(a, Tier::kDevice);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(dev->Ready()) << "the copy ran before the compute it was ordered after";
  go.set_value();
  ASSERT_TRUE(dev->Wait().ok());
  EXPECT_EQ(Check(dev->data(), 32 << 10, a, 3), -1);
}

TEST(TierManagerTest, DeviceWriteGoesBackThroughPinnedToNvme) {
  Rig rig(64 << 10, 64 << 10);
  rig.MakeManager();
  const BlockId a = rig.Add("a", 32 << 10);
  {
    auto pin = rig.manager->Acquire(a, Tier::kDevice);
    ASSERT_TRUE(pin.ok());
    ASSERT_TRUE(pin->Wait().ok());
    Fill(pin->data(), 32 << 10, a, 7);  // HostDevice memory is host-addressable
    pin->MarkDirty();
  }
  EXPECT_TRUE(rig.manager->IsValid(a, Tier::kDevice));
  EXPECT_FALSE(rig.manager->IsValid(a, Tier::kPinned));
  ASSERT_TRUE(rig.manager->Flush(a).ok());
  EXPECT_TRUE(rig.manager->IsValid(a, Tier::kNvme));
  // Read the NVMe copy directly.
  auto ext = rig.swap->Find("a");
  ASSERT_TRUE(ext.ok());
  std::vector<std::byte> raw(ext->padded_length);
  auto aligned = rig.arena->Allocate(ext->padded_length);
  ASSERT_TRUE(aligned.ok());
  ASSERT_TRUE(rig.io->Read(ext->fd, ext->offset, {aligned->data(), ext->padded_length}).ok());
  EXPECT_EQ(Check(aligned->data(), 32 << 10, a, 7), -1);
}

TEST(TierManagerTest, FailsClearlyWhenEverythingIsPinned) {
  Rig rig(32 << 10, 64 << 10);
  rig.pin_wait = std::chrono::milliseconds(50);  // the pins are this thread's: nobody drops one
  rig.MakeManager();
  const BlockId a = rig.Add("a", 24 << 10);
  const BlockId b = rig.Add("b", 24 << 10);
  auto pa = rig.manager->Acquire(a, Tier::kDevice);
  ASSERT_TRUE(pa.ok());
  auto pb = rig.manager->Acquire(b, Tier::kDevice);
  ASSERT_FALSE(pb.ok());
  EXPECT_EQ(pb.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(pb.status().message()).find("device tier cannot hold block b"),
            std::string::npos)
      << pb.status().message();
  pa->Release();
  EXPECT_TRUE(rig.manager->Acquire(b, Tier::kDevice).ok());
}

// The property test: random operations over many blocks and tiny budgets. Every read is checked
// against the last write, and the budgets are checked after every operation.
void RandomOps(Rig& rig, const std::vector<BlockId>& ids, std::vector<uint32_t>& version,
               const std::vector<uint64_t>& sizes, uint32_t seed, int ops, int* exhausted) {
  std::mt19937 rng(seed);
  std::vector<Pin> held;
  for (int op = 0; op < ops; ++op) {
    const size_t k = rng() % ids.size();
    const BlockId id = ids[k];
    const Tier tier = rng() % 2 ? Tier::kDevice : Tier::kPinned;
    const int what = static_cast<int>(rng() % 10);
    if (what < 4 || version[k] == 0) {  // write (first touch is always a write)
      auto pin = rig.manager->Acquire(id, tier, TierManager::Access::kWrite);
      if (!pin.ok()) {
        ASSERT_EQ(pin.status().code(), StatusCode::kResourceExhausted) << pin.status().ToString();
        ++*exhausted;
        held.clear();
        continue;
      }
      ASSERT_TRUE(pin->Wait().ok());
      Fill(pin->data(), sizes[k], id, ++version[k]);
      pin->MarkDirty();
    } else if (what < 8) {  // read and verify; sometimes keep the pin for a while
      auto pin = rig.manager->Acquire(id, tier);
      if (!pin.ok()) {
        ASSERT_EQ(pin.status().code(), StatusCode::kResourceExhausted) << pin.status().ToString();
        ++*exhausted;
        held.clear();
        continue;
      }
      ASSERT_TRUE(pin->Wait().ok());
      ASSERT_EQ(Check(pin->data(), sizes[k], id, version[k]), -1)
          << "block " << id << " version " << version[k] << " in " << TierName(tier);
      if (rng() % 3 == 0 && held.size() < 2) held.push_back(std::move(*pin));
    } else if (what == 8) {
      Status s = rig.manager->Prefetch(id, tier);
      if (!s.ok()) {
        ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
        held.clear();
      }
    } else {
      if (version[k] != 0) {
        ASSERT_TRUE(rig.manager->Flush(id).ok());
      }
      if (!held.empty()) held.erase(held.begin());
    }
    rig.CheckBudgets();
  }
}

TEST(TierManagerPropertyTest, RandomOperationsKeepContentsAndBudgets) {
  // 24 blocks of 4-60 KiB (600 KiB in all); the device holds three or four of them, the pinned
  // tier about six. At most 2 pins are held between operations, so the budgets always fit
  // held + one more (device: 3 x 60 KiB; pinned: the same plus a staging and a write-back buffer).
  Rig rig(/*device_budget=*/192 << 10, /*pinned_bytes=*/384 << 10, {}, /*copy_delay_us=*/0);
  rig.MakeManager();
  std::mt19937 rng(7);
  std::vector<BlockId> ids;
  std::vector<uint64_t> sizes;
  for (int i = 0; i < 24; ++i) {
    sizes.push_back(4096 * (1 + rng() % 15));
    ids.push_back(rig.Add("blocks." + std::to_string(i), sizes.back()));
  }
  std::vector<uint32_t> version(ids.size(), 0);
  int exhausted = 0;
  RandomOps(rig, ids, version, sizes, 11, 4000, &exhausted);
  // Everything flushed to NVMe then read back through both tiers matches the last write.
  ASSERT_TRUE(rig.manager->FlushAll().ok());
  for (size_t k = 0; k < ids.size(); ++k) {
    if (version[k] == 0) continue;
    auto pin = rig.manager->Acquire(ids[k], Tier::kDevice);
    ASSERT_TRUE(pin.ok());
    ASSERT_TRUE(pin->Wait().ok());
    EXPECT_EQ(Check(pin->data(), sizes[k], ids[k], version[k]), -1);
  }
  const TierTelemetry t = rig.manager->telemetry();
  EXPECT_GT(t.evictions, 100u);  // the budgets really forced traffic
  EXPECT_GT(t.nvme_to_pinned, 0u);
  EXPECT_LE(t.device_peak_bytes, 192u << 10);
  EXPECT_LE(t.pinned_peak_bytes, 384u << 10);
  EXPECT_EQ(exhausted, 0);  // see the budgets above
}

TEST(TierManagerPropertyTest, ConcurrentThreadsOnDisjointBlocks) {
  Rig rig(256 << 10, 512 << 10, {}, /*copy_delay_us=*/50);
  rig.MakeManager();
  constexpr int kThreads = 4;
  std::vector<std::vector<BlockId>> ids(kThreads);
  std::vector<std::vector<uint64_t>> sizes(kThreads);
  std::mt19937 rng(3);
  for (int i = 0; i < 32; ++i) {
    const uint64_t bytes = 4096 * (1 + rng() % 8);
    sizes[i % kThreads].push_back(bytes);
    ids[i % kThreads].push_back(rig.Add("b" + std::to_string(i), bytes));
  }
  std::vector<std::thread> threads;
  std::vector<int> exhausted(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint32_t> version(ids[t].size(), 0);
      RandomOps(rig, ids[t], version, sizes[t], 100 + t, 600, &exhausted[t]);
      // Each thread flushes its own blocks: a FlushAll here would write back the blocks another
      // thread is filling (its kWrite pin), reading bytes while they are written (a data race
      // ThreadSanitizer reports, against the contract in tier_manager.h; the torn NVMe copy would
      // be discarded by the version check, but the bytes race all the same).
      for (BlockId id : ids[t]) ASSERT_TRUE(rig.manager->Flush(id).ok());
      for (size_t k = 0; k < ids[t].size(); ++k) {
        if (version[k] == 0) continue;
        auto pin = rig.manager->Acquire(ids[t][k], Tier::kPinned);
        if (!pin.ok()) continue;  // budget contention with other threads: skip, not wrong
        ASSERT_TRUE(pin->Wait().ok());
        EXPECT_EQ(Check(pin->data(), sizes[t][k], ids[t][k], version[k]), -1);
      }
    });
  }
  for (auto& th : threads) th.join();
  rig.CheckBudgets();
  EXPECT_GT(rig.manager->telemetry().evictions, 0u);
}

std::unique_ptr<FaultInjectingBackend> FaultyPosix() {
  auto inner = OpenIoBackend("posix", IoOptions{});
  EXPECT_TRUE(inner.ok());
  return std::make_unique<FaultInjectingBackend>(std::move(*inner));
}

TEST(TierManagerFaultTest, FailedFetchIsReportedAndRetrySucceeds) {
  auto faulty = FaultyPosix();
  FaultInjectingBackend* io = faulty.get();
  Rig rig(64 << 10, 64 << 10, std::move(faulty));
  rig.MakeManager();
  const BlockId a = rig.Add("blocks.7.attn.qkv.weight", 32 << 10);
  {
    auto pin = rig.manager->Acquire(a, Tier::kPinned);
    ASSERT_TRUE(pin.ok());
    Fill(pin->data(), 32 << 10, a, 1);
    pin->MarkDirty();
  }
  ASSERT_TRUE(rig.manager->Flush(a).ok());  // request 0: the write
  // Drop the pinned copy by filling the tier with another block.
  const BlockId b = rig.Add("filler", 48 << 10);
  { ASSERT_TRUE(rig.manager->Acquire(b, Tier::kPinned).ok()); }
  ASSERT_TRUE(rig.manager->Flush(b).ok());  // so that evicting it later needs no write
  ASSERT_FALSE(rig.manager->IsResident(a, Tier::kPinned));
  io->AddRule({.request = io->requests(), .kind = FaultKind::kEio});
  // The NVMe read fails: Acquire reports it if it already happened, else Pin::Wait does.
  Status s;
  {
    auto pin = rig.manager->Acquire(a, Tier::kDevice);
    s = pin.ok() ? pin->Wait() : pin.status();
  }
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.sys_errno(), EIO);
  const std::string msg(s.message());
  EXPECT_NE(msg.find("blocks.7.attn.qkv.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[injected]"), std::string::npos) << msg;
  // Consistent: still valid on NVMe only; a retry succeeds with the right bytes.
  EXPECT_TRUE(rig.manager->IsValid(a, Tier::kNvme));
  EXPECT_FALSE(rig.manager->IsValid(a, Tier::kPinned));
  EXPECT_FALSE(rig.manager->IsValid(a, Tier::kDevice));
  auto again = rig.manager->Acquire(a, Tier::kDevice);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(again->Wait().ok());
  EXPECT_EQ(Check(again->data(), 32 << 10, a, 1), -1);
}

TEST(TierManagerFaultTest, FailedWriteBackKeepsTheDirtyCopy) {
  auto faulty = FaultyPosix();
  FaultInjectingBackend* io = faulty.get();
  Rig rig(64 << 10, 64 << 10, std::move(faulty));
  rig.MakeManager();
  const BlockId a = rig.Add("a", 32 << 10);
  {
    auto pin = rig.manager->Acquire(a, Tier::kPinned);
    ASSERT_TRUE(pin.ok());
    Fill(pin->data(), 32 << 10, a, 3);
    pin->MarkDirty();
  }
  io->AddRule({.request = io->requests(), .kind = FaultKind::kEnospc, .after_bytes = 8192});
  Status s = rig.manager->Flush(a);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.sys_errno(), ENOSPC);
  EXPECT_NE(std::string(s.message()).find("writing back block a from pinned"), std::string::npos)
      << s.message();
  EXPECT_TRUE(rig.manager->IsValid(a, Tier::kPinned));
  EXPECT_FALSE(rig.manager->IsValid(a, Tier::kNvme));
  // Eviction must not drop the only copy either: a second block that needs the space fails the
  // write-back again (next request faulted too), and a stays.
  const BlockId b = rig.Add("b", 48 << 10);
  io->AddRule({.request = io->requests(), .kind = FaultKind::kEio});
  auto pb = rig.manager->Acquire(b, Tier::kPinned);
  ASSERT_FALSE(pb.ok());
  EXPECT_TRUE(rig.manager->IsValid(a, Tier::kPinned));
  // Retry succeeds; the data is intact end to end.
  ASSERT_TRUE(rig.manager->Flush(a).ok());
  { ASSERT_TRUE(rig.manager->Acquire(b, Tier::kPinned).ok()); }
  auto pa = rig.manager->Acquire(a, Tier::kDevice);
  ASSERT_TRUE(pa.ok());
  ASSERT_TRUE(pa->Wait().ok());
  EXPECT_EQ(Check(pa->data(), 32 << 10, a, 3), -1);
}

// Forwards to an inner backend, counting the writes in flight at once.
class WriteOverlapProbe final : public IoBackend {
 public:
  explicit WriteOverlapProbe(std::unique_ptr<IoBackend> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  IoCapabilities capabilities() const override { return inner_->capabilities(); }
  const IoOptions& options() const override { return inner_->options(); }
  IoTicket Submit(IoRequest request) override {
    if (request.op == IoOp::kWrite) {
      const int now = ++writing_;
      int seen = max_writing_.load();
      while (now > seen && !max_writing_.compare_exchange_weak(seen, now)) {
      }
      IoCallback done = std::move(request.done);
      request.done = [this, done = std::move(done)](Status s, size_t n) {
        --writing_;
        if (done) done(std::move(s), n);
      };
    }
    return inner_->Submit(std::move(request));
  }
  int max_writing() const { return max_writing_.load(); }

 private:
  std::unique_ptr<IoBackend> inner_;
  std::atomic<int> writing_{0};
  std::atomic<int> max_writing_{0};
};

// Evicting dirty copies starts their write-backs and goes on: several are in flight at once (the
// disk is kept busy while the next block is made), and every byte still lands intact.
TEST(TierManagerTest, EvictionWriteBacksOverlap) {
  auto inner = OpenIoBackend("posix", IoOptions{.queue_depth = 8, .intra_op_parallelism = 4});
  ASSERT_TRUE(inner.ok());
  // Each write takes 30 ms: long enough that overlapping writes cannot be missed.
  std::vector<FaultRule> slow;
  for (uint64_t r = 0; r < 64; ++r) {
    slow.push_back({.request = r,
                    .kind = FaultKind::kLatency,
                    .latency = std::chrono::milliseconds(30),
                    .op = IoOp::kWrite});
  }
  auto probe = std::make_unique<WriteOverlapProbe>(
      std::make_unique<FaultInjectingBackend>(std::move(*inner), slow));
  WriteOverlapProbe* counter = probe.get();
  Rig rig(64 << 10, 128 << 10, std::move(probe));  // pinned: 4 blocks of 32 KiB
  rig.MakeManager();
  std::vector<BlockId> ids;
  for (int i = 0; i < 12; ++i) ids.push_back(rig.Add("w" + std::to_string(i), 32 << 10));
  for (BlockId id : ids) {
    auto pin = rig.manager->Acquire(id, Tier::kPinned, TierManager::Access::kOverwrite);
    ASSERT_TRUE(pin.ok()) << pin.status().ToString();
    ASSERT_TRUE(pin->Wait().ok());
    Fill(pin->data(), 32 << 10, id, 5);
    pin->MarkDirty();
    rig.CheckBudgets();
  }
  EXPECT_GE(counter->max_writing(), 2);
  ASSERT_TRUE(rig.manager->FlushAll().ok());
  for (BlockId id : ids) {
    ASSERT_TRUE(rig.manager->IsValid(id, Tier::kNvme));
    auto pin = rig.manager->Acquire(id, Tier::kDevice);
    ASSERT_TRUE(pin.ok());
    ASSERT_TRUE(pin->Wait().ok());
    EXPECT_EQ(Check(pin->data(), 32 << 10, id, 5), -1) << rig.manager->BlockName(id);
  }
}

// FlushAsync returns before the write lands; the copy stays resident and a writer waits for it.
TEST(TierManagerTest, FlushAsyncWritesBehindAndWriterWaits) {
  Rig rig(64 << 10, 128 << 10);
  rig.MakeManager();
  const BlockId a = rig.Add("a", 32 << 10);
  {
    auto pin = rig.manager->Acquire(a, Tier::kPinned, TierManager::Access::kOverwrite);
    ASSERT_TRUE(pin.ok());
    Fill(pin->data(), 32 << 10, a, 1);
    pin->MarkDirty();
  }
  ASSERT_TRUE(rig.manager->FlushAsync(a).ok());
  {
    // A writer gets the copy only after the write read it: version 1 reaches NVMe intact.
    auto pin = rig.manager->Acquire(a, Tier::kPinned, TierManager::Access::kWrite);
    ASSERT_TRUE(pin.ok());
    EXPECT_TRUE(rig.manager->IsValid(a, Tier::kNvme));
    EXPECT_EQ(Check(pin->data(), 32 << 10, a, 1), -1);
    Fill(pin->data(), 32 << 10, a, 2);
    pin->MarkDirty();
  }
  EXPECT_FALSE(rig.manager->IsValid(a, Tier::kNvme));
  ASSERT_TRUE(rig.manager->FlushAsync(a).ok());
  ASSERT_TRUE(rig.manager->Flush(a).ok());
  EXPECT_TRUE(rig.manager->IsValid(a, Tier::kNvme));
  EXPECT_TRUE(rig.manager->IsResident(a, Tier::kPinned));
}

// A failed asynchronous write-back is kept and returned by the block's next Flush.
TEST(TierManagerFaultTest, FailedFlushAsyncIsReportedByFlush) {
  auto faulty = FaultyPosix();
  FaultInjectingBackend* io = faulty.get();
  Rig rig(64 << 10, 64 << 10, std::move(faulty));
  rig.MakeManager();
  const BlockId a = rig.Add("grad/blocks.3", 32 << 10);
  {
    auto pin = rig.manager->Acquire(a, Tier::kPinned);
    ASSERT_TRUE(pin.ok());
    Fill(pin->data(), 32 << 10, a, 4);
    pin->MarkDirty();
  }
  io->AddRule({.request = io->requests(), .kind = FaultKind::kEio});
  ASSERT_TRUE(rig.manager->FlushAsync(a).ok());
  Status s = rig.manager->Flush(a);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.sys_errno(), EIO);
  EXPECT_NE(std::string(s.message()).find("grad/blocks.3"), std::string::npos) << s.message();
  EXPECT_TRUE(rig.manager->IsValid(a, Tier::kPinned));
  ASSERT_TRUE(rig.manager->Flush(a).ok());  // reported once; the retry writes it
  EXPECT_TRUE(rig.manager->IsValid(a, Tier::kNvme));
}

TEST(EvictionPolicyTest, LruAndFutureUse) {
  std::vector<EvictionCandidate> c = {{1, 50}, {2, 10}, {3, 30}};
  LruPolicy lru;
  EXPECT_EQ(lru.ChooseVictim(Tier::kDevice, c), 1u);  // block 2, used longest ago
  FutureUsePolicy future;
  future.SetUpcoming({2, 1, 3});
  EXPECT_EQ(future.ChooseVictim(Tier::kDevice, c), 2u);  // block 3 is needed last
  future.SetUpcoming({3, 2});
  EXPECT_EQ(future.ChooseVictim(Tier::kDevice, c), 0u);  // block 1 is not needed again
  // LRU spares a prefetched copy that has not been used yet, however old.
  std::vector<EvictionCandidate> p = {{1, 50}, {2, 10, /*awaiting_use=*/true}, {3, 30}};
  EXPECT_EQ(lru.ChooseVictim(Tier::kDevice, p), 2u);
  // So does the future-use policy when the prefetched copy is outside its window (the optimizer's
  // state blocks while the window lists parameters), and even when it is needed furthest.
  future.SetUpcoming({1, 3});
  EXPECT_EQ(future.ChooseVictim(Tier::kDevice, p), 2u);  // 3 (in the window) over 2 (prefetched)
  future.SetUpcoming({1, 3, 2});
  EXPECT_EQ(future.ChooseVictim(Tier::kDevice, p), 2u);
  // With only prefetched candidates, Belady's rule applies among them.
  std::vector<EvictionCandidate> q = {{1, 50, true}, {2, 10, true}};
  future.SetUpcoming({2, 1});
  EXPECT_EQ(future.ChooseVictim(Tier::kDevice, q), 0u);
}

// Two clients (the parameter coordinator and the optimizer pipeline, on two threads) each set their
// own window; neither overwrites the other's, and a block's next use is its nearest in any window.
TEST(EvictionPolicyTest, FutureUseWindowsPerClient) {
  std::vector<EvictionCandidate> c = {{1, 50}, {2, 10}, {3, 30}, {4, 40}};
  FutureUsePolicy future;
  const FutureUsePolicy::Window params = future.AddWindow();
  const FutureUsePolicy::Window optimizer = future.AddWindow();
  EXPECT_NE(params, optimizer);
  future.SetUpcoming(params, {1, 2});
  EXPECT_EQ(future.ChooseVictim(Tier::kDevice, c), 2u);  // 3 and 4 not needed: 3, used earlier
  future.SetUpcoming(optimizer, {3, 4});  // the other client's window does not replace this one
  EXPECT_EQ(future.ChooseVictim(Tier::kDevice, c), 1u);  // all needed; 2 and 4 at distance 1: LRU
  future.SetUpcoming(optimizer, {3});
  EXPECT_EQ(future.ChooseVictim(Tier::kDevice, c), 3u);  // 4 is in no window now
  future.SetUpcoming(params, {});  // a client whose uses ended empties its window
  EXPECT_EQ(future.ChooseVictim(Tier::kDevice, c), 1u);  // 1, 2, 4 not needed: 2, used first
  // One window set alone decides exactly as a single window did.
  future.SetUpcoming(optimizer, {});
  future.SetUpcoming(params, {2, 1, 3});
  FutureUsePolicy single;
  single.SetUpcoming({2, 1, 3});
  EXPECT_EQ(future.ChooseVictim(Tier::kDevice, c), single.ChooseVictim(Tier::kDevice, c));
}

// Three 32 KiB blocks named PREFIX0..2 (pattern 1) written to NVMe, and a 64 KiB filler taking
// both slots of the 64 KiB pinned pool, flushed: the three are then on NVMe only and the pool
// holds only what the test brings into it. REQUIRES: a Rig(..., 64 << 10) with its manager made.
void AddThreeBlocksOnNvmeOnly(Rig& rig, const std::string& prefix, std::vector<BlockId>* ids) {
  for (int i = 0; i < 3; ++i) {
    const BlockId id = rig.Add(prefix + std::to_string(i), 32 << 10);
    {
      auto pin = rig.manager->Acquire(id, Tier::kPinned);
      ASSERT_TRUE(pin.ok());
      Fill(pin->data(), 32 << 10, id, 1);
      pin->MarkDirty();
    }
    ASSERT_TRUE(rig.manager->Flush(id).ok());
    ids->push_back(id);
  }
  const BlockId filler = rig.Add("filler", 64 << 10);
  { ASSERT_TRUE(rig.manager->Acquire(filler, Tier::kPinned).ok()); }
  ASSERT_TRUE(rig.manager->Flush(filler).ok());
}

TEST(TierManagerTest, FutureUsePolicyKeepsWhatIsNeededNext) {
  auto policy = std::make_unique<FutureUsePolicy>();
  FutureUsePolicy* future = policy.get();
  Rig rig(96 << 10, 256 << 10);
  rig.MakeManager(std::move(policy));
  std::vector<BlockId> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(rig.Add("u" + std::to_string(i), 32 << 10));
  for (BlockId id : ids) {
    auto p = rig.manager->Acquire(id, Tier::kPinned);
    ASSERT_TRUE(p.ok());
    p->MarkDirty();
  }
  for (int i = 0; i < 3; ++i) {
    auto p = rig.manager->Acquire(ids[i], Tier::kDevice);
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(p->Wait().ok());  // a copy still in flight is not an eviction candidate
  }
  // Device holds u0..u2. Next uses: u0, u1 then u3: u2 must be the one to go for u3.
  future->SetUpcoming({ids[0], ids[1], ids[3]});
  ASSERT_TRUE(rig.manager->Acquire(ids[3], Tier::kDevice).ok());
  EXPECT_TRUE(rig.manager->IsResident(ids[0], Tier::kDevice));
  EXPECT_TRUE(rig.manager->IsResident(ids[1], Tier::kDevice));
  EXPECT_FALSE(rig.manager->IsResident(ids[2], Tier::kDevice));
}

// A prefetch that finds the pool full of earlier prefetches not used yet starts nothing rather than
// evicting one of them (whose read would be done again): with 2 pinned slots, prefetching a, b, c
// then using a, b, c reads each block from NVMe exactly once, whatever the policy.
TEST(TierManagerTest, PrefetchNeverEvictsAnotherPrefetch) {
  for (bool future_use : {false, true}) {
    SCOPED_TRACE(future_use ? "FutureUsePolicy" : "LruPolicy");
    Rig rig(256 << 10, 64 << 10);
    rig.MakeManager(future_use ? std::unique_ptr<EvictionPolicy>(new FutureUsePolicy())
                               : std::unique_ptr<EvictionPolicy>());
    std::vector<BlockId> ids;
    ASSERT_NO_FATAL_FAILURE(AddThreeBlocksOnNvmeOnly(rig, "p", &ids));
    for (BlockId id : ids) ASSERT_FALSE(rig.manager->IsResident(id, Tier::kPinned));
    const uint64_t read_before = rig.manager->telemetry().nvme_to_pinned;

    for (BlockId id : ids) ASSERT_TRUE(rig.manager->Prefetch(id, Tier::kPinned).ok());
    for (BlockId id : ids) {
      auto pin = rig.manager->Acquire(id, Tier::kPinned);
      ASSERT_TRUE(pin.ok()) << pin.status().ToString();
      ASSERT_TRUE(pin->Wait().ok());
      EXPECT_EQ(Check(pin->data(), 32 << 10, id, 1), -1);
    }
    EXPECT_EQ(rig.manager->telemetry().nvme_to_pinned - read_before, 3u * (32 << 10));
  }
}

// A pinned copy newer than NVMe whose bytes the device also holds (parameters an optimizer just
// updated, then gathered) is written to NVMe when evicted, not dropped: dropped, the device copy
// would be the only one, and making room for it later (or flushing it) would need a pinned buffer
// again. Here the pinned space holds one block: after the eviction, the device copy can go and
// the block can be flushed while another block holds the only pinned buffer.
TEST(TierManagerTest, PinnedCopyNewerThanNvmeIsWrittenBackWhenEvictedEvenIfOnTheDevice) {
  Rig rig(/*device_budget=*/64 << 10, /*pinned_bytes=*/32 << 10);
  rig.MakeManager();
  const BlockId a = rig.Add("a", 32 << 10);
  const BlockId b = rig.Add("b", 32 << 10);
  {
    auto pin = rig.manager->Acquire(a, Tier::kPinned, TierManager::Access::kOverwrite);
    ASSERT_TRUE(pin.ok());
    Fill(pin->data(), 32 << 10, a, 3);
    pin->MarkDirty();
  }
  {
    auto dev = rig.manager->Acquire(a, Tier::kDevice);  // pinned -> device: both valid
    ASSERT_TRUE(dev.ok() && dev->Wait().ok());
  }
  ASSERT_FALSE(rig.manager->IsValid(a, Tier::kNvme));
  const uint64_t written = rig.manager->telemetry().pinned_to_nvme;
  auto held = rig.manager->Acquire(b, Tier::kPinned);  // needs a's pinned space
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  ASSERT_TRUE(held->Wait().ok());
  EXPECT_TRUE(rig.manager->IsValid(a, Tier::kNvme)) << "a's newer bytes were dropped";
  EXPECT_EQ(rig.manager->telemetry().pinned_to_nvme - written, 32u << 10);
  EXPECT_FALSE(rig.manager->IsResident(a, Tier::kPinned));
  // With b holding the only pinned buffer, a needs none to be flushed.
  ASSERT_TRUE(rig.manager->Flush(a).ok());
  held->Release();
  auto pin = rig.manager->Acquire(a, Tier::kPinned);
  ASSERT_TRUE(pin.ok() && pin->Wait().ok());
  EXPECT_EQ(Check(pin->data(), 32 << 10, a, 3), -1);
}

// NotNeeded: a prefetched copy nobody will use stops being spared (a prefetch may evict it) and
// goes first.
TEST(TierManagerTest, NotNeededCopiesAreEvictedFirstAndNoLongerSpared) {
  Rig rig(256 << 10, 64 << 10);
  rig.MakeManager();
  std::vector<BlockId> ids;
  ASSERT_NO_FATAL_FAILURE(AddThreeBlocksOnNvmeOnly(rig, "n", &ids));
  // Two prefetches fill the two slots; a third is skipped (it would throw one away)...
  ASSERT_TRUE(rig.manager->Prefetch(ids[0], Tier::kPinned).ok());
  ASSERT_TRUE(rig.manager->Prefetch(ids[1], Tier::kPinned).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((!rig.manager->IsValid(ids[0], Tier::kPinned) ||
          !rig.manager->IsValid(ids[1], Tier::kPinned)) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(rig.manager->Prefetch(ids[2], Tier::kPinned).ok());
  EXPECT_FALSE(rig.manager->IsResident(ids[2], Tier::kPinned));
  // ...until ids[0] is not needed: then it is the one a prefetch replaces, and ids[1] stays.
  rig.manager->NotNeeded(ids[0]);
  ASSERT_TRUE(rig.manager->Prefetch(ids[2], Tier::kPinned).ok());
  EXPECT_TRUE(rig.manager->IsResident(ids[2], Tier::kPinned));
  EXPECT_FALSE(rig.manager->IsResident(ids[0], Tier::kPinned));
  EXPECT_TRUE(rig.manager->IsResident(ids[1], Tier::kPinned));
  auto pin = rig.manager->Acquire(ids[2], Tier::kPinned);
  ASSERT_TRUE(pin.ok() && pin->Wait().ok());
  EXPECT_EQ(Check(pin->data(), 32 << 10, ids[2], 1), -1);
}

// ---- Checksums of NVMe copies -------------------------------------------------------------------

// Flips bit `bit` of the byte at `offset` of `path` behind everyone's back (a buffered fd, synced
// so that an O_DIRECT read sees it).
void FlipBitOnDisk(const std::string& path, uint64_t offset, int bit) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  unsigned char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(offset)), 1);
  c ^= static_cast<unsigned char>(1u << bit);
  ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(offset)), 1);
  ASSERT_EQ(::fsync(fd), 0);
  ::close(fd);
}

// Writes block `a` (32 KiB, version 1) to NVMe and drops its pinned copy, so that the next
// Acquire reads it back from the swap file.
BlockId WrittenToNvmeOnly(Rig& rig, const std::string& name) {
  const BlockId a = rig.Add(name, 32 << 10);
  {
    auto pin = rig.manager->Acquire(a, Tier::kPinned);
    EXPECT_TRUE(pin.ok());
    Fill(pin->data(), 32 << 10, a, 1);
    pin->MarkDirty();
  }
  EXPECT_TRUE(rig.manager->Flush(a).ok());
  const BlockId filler = rig.Add(name + ".filler", 48 << 10);  // needs a's pinned space
  { EXPECT_TRUE(rig.manager->Acquire(filler, Tier::kPinned).ok()); }
  EXPECT_TRUE(rig.manager->Flush(filler).ok());  // so that evicting it later needs no write
  EXPECT_FALSE(rig.manager->IsResident(a, Tier::kPinned));
  EXPECT_TRUE(rig.manager->IsValid(a, Tier::kNvme));
  return a;
}

Status Fetch(Rig& rig, BlockId id, Pin* out, Tier tier = Tier::kDevice) {
  auto pin = rig.manager->Acquire(id, tier, TierManager::Access::kWrite);
  if (!pin.ok()) return pin.status();
  Status s = pin->Wait();
  *out = std::move(*pin);
  return s;
}

TEST(TierManagerChecksumTest, IntactRoundTripsVerify) {
  Rig rig(64 << 10, 64 << 10);
  rig.MakeManager();
  const BlockId a = WrittenToNvmeOnly(rig, "blocks.0.w");
  // Read back, rewritten, written back and evicted three times, in the pinned tier only (a device
  // copy would serve the next read without NVMe).
  for (int i = 0; i < 3; ++i) {
    Pin pin;
    ASSERT_TRUE(Fetch(rig, a, &pin, Tier::kPinned).ok());
    ASSERT_EQ(Check(pin.data(), 32 << 10, a, static_cast<uint32_t>(1 + i)), -1);
    Fill(pin.data(), 32 << 10, a, static_cast<uint32_t>(2 + i));
    pin.MarkDirty();
    pin.Release();
    ASSERT_TRUE(rig.manager->Flush(a).ok());
    const BlockId filler = rig.Add("filler" + std::to_string(i), 48 << 10);
    { ASSERT_TRUE(rig.manager->Acquire(filler, Tier::kPinned).ok()); }
    ASSERT_TRUE(rig.manager->Flush(filler).ok());
    ASSERT_FALSE(rig.manager->IsResident(a, Tier::kPinned));
  }
  const TierTelemetry t = rig.manager->telemetry();
  EXPECT_EQ(t.nvme_to_pinned, 3u * (32 << 10));
  // Hashed: a's 4 writes and 3 reads, the 4 fillers' writes.
  EXPECT_EQ(t.checksum_bytes, 7u * (32 << 10) + 4u * (48 << 10));
}

TEST(TierManagerChecksumTest, BitFlippedOnDiskFailsTheFetchNamingFileAndOffset) {
  Rig rig(64 << 10, 64 << 10);
  rig.MakeManager();
  const BlockId a = WrittenToNvmeOnly(rig, "blocks.3.mlp.w1");
  auto ext = rig.swap->Find("blocks.3.mlp.w1");
  ASSERT_TRUE(ext.ok());
  const std::string file = rig.swap->dir() + "/params.swp";
  FlipBitOnDisk(file, ext->offset + 1000, 3);

  Pin pin;
  Status s = Fetch(rig, a, &pin);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  const std::string msg(s.message());
  EXPECT_NE(msg.find("checksum mismatch: " + file + " offset " + std::to_string(ext->offset) +
                     " length " + std::to_string(ext->padded_length) +
                     " (block blocks.3.mlp.w1): stored "),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("fetching block blocks.3.mlp.w1 from NVMe"), std::string::npos) << msg;
  // Nothing became valid from the corrupt bytes, and a retry reads them again and fails again.
  EXPECT_FALSE(rig.manager->IsValid(a, Tier::kPinned));
  EXPECT_FALSE(rig.manager->IsValid(a, Tier::kDevice));
  Pin again;
  EXPECT_EQ(Fetch(rig, a, &again).code(), StatusCode::kDataLoss);
}

// The same corruption with verification off reaches the caller: what the checksum stops.
TEST(TierManagerChecksumTest, WithoutVerificationCorruptBytesAreReturned) {
  Rig rig(64 << 10, 64 << 10);
  rig.MakeManager({}, /*verify_checksums=*/false);
  const BlockId a = WrittenToNvmeOnly(rig, "blocks.3.mlp.w1");
  auto ext = rig.swap->Find("blocks.3.mlp.w1");
  ASSERT_TRUE(ext.ok());
  FlipBitOnDisk(rig.swap->dir() + "/params.swp", ext->offset + 1000, 3);
  Pin pin;
  ASSERT_TRUE(Fetch(rig, a, &pin).ok());
  EXPECT_EQ(Check(pin.data(), 32 << 10, a, 1), 1000);
  EXPECT_EQ(rig.manager->telemetry().checksum_bytes, 0u);
}

// A block of several checksum chunks (4 MiB each with the default 1 MiB I/O blocks): the error
// names the chunk that holds the flipped bit, and intact chunks around it pass.
TEST(TierManagerChecksumTest, MismatchNamesTheChunkOfALargeBlock) {
  constexpr uint64_t kBytes = 10 << 20, kChunk = 4 << 20;
  Rig rig(32 << 20, 16 << 20);
  rig.MakeManager();
  const BlockId a = rig.Add("big", kBytes);
  {
    auto pin = rig.manager->Acquire(a, Tier::kPinned);
    ASSERT_TRUE(pin.ok());
    Fill(pin->data(), kBytes, a, 1);
    pin->MarkDirty();
  }
  ASSERT_TRUE(rig.manager->Flush(a).ok());
  const BlockId filler = rig.Add("filler", 8 << 20);
  { ASSERT_TRUE(rig.manager->Acquire(filler, Tier::kPinned).ok()); }
  ASSERT_TRUE(rig.manager->Flush(filler).ok());
  ASSERT_FALSE(rig.manager->IsResident(a, Tier::kPinned));
  {  // intact: all three chunks verify
    Pin pin;
    ASSERT_TRUE(Fetch(rig, a, &pin, Tier::kPinned).ok());
    EXPECT_EQ(Check(pin.data(), kBytes, a, 1), -1);
  }
  { ASSERT_TRUE(rig.manager->Acquire(filler, Tier::kPinned).ok()); }  // evicts a's clean copy
  ASSERT_FALSE(rig.manager->IsResident(a, Tier::kPinned));
  auto ext = rig.swap->Find("big");
  ASSERT_TRUE(ext.ok());
  const std::string file = rig.swap->dir() + "/params.swp";
  FlipBitOnDisk(file, ext->offset + 9 * (1 << 20) + 17, 0);  // in the third chunk
  Pin pin;
  Status s = Fetch(rig, a, &pin, Tier::kPinned);
  ASSERT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(std::string(s.message())
                .find("checksum mismatch: " + file + " offset " +
                      std::to_string(ext->offset + 2 * kChunk) + " length " +
                      std::to_string(kBytes - 2 * kChunk) + " (block big)"),
            std::string::npos)
      << s.message();
}

// Bytes this manager never wrote (a reopened swap file: nvme_valid) carry no checksum and are
// read as they are.
TEST(TierManagerChecksumTest, CopiesNotWrittenByTheManagerAreNotVerified) {
  Rig rig(64 << 10, 64 << 10);
  rig.MakeManager();
  auto ext = rig.swap->Allocate("reopened", "params", 32 << 10);
  ASSERT_TRUE(ext.ok());
  auto staging = rig.arena->Allocate(32 << 10);
  ASSERT_TRUE(staging.ok());
  Fill(staging->data(), 32 << 10, 77, 1);
  ASSERT_TRUE(rig.io->Write(ext->fd, ext->offset, {staging->data(), 32u << 10}).ok());
  staging->Reset();
  NvmeLocation loc{ext->fd, ext->offset, ext->padded_length};
  auto id = rig.manager->AddBlock("reopened", 32 << 10, &loc, /*nvme_valid=*/true);
  ASSERT_TRUE(id.ok());
  Pin pin;
  ASSERT_TRUE(Fetch(rig, *id, &pin).ok());
  EXPECT_EQ(Check(pin.data(), 32 << 10, 77, 1), -1);
}

}  // namespace
}  // namespace strata
