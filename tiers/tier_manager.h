// TierManager: knows where every block of model state lives and moves it between the device,
// pinned host memory and NVMe, asynchronously, within each tier's budget.
//
// A block is one tensor partition (a unit's flat 16-bit parameters, a sub-group's fp32 master...).
// Each tier holds at most one copy of it; a copy is either valid (equal to the block's current
// contents) or not. Writing a copy (MarkDirty) makes it the only valid one. The tiers form a chain
// device <-> pinned <-> NVMe: a fetch to the device goes through a pinned copy, and a write-back
// from the device goes to the pinned tier, from the pinned tier to NVMe.
//
// Eviction: when a tier is full, an unpinned copy with no transfer in flight is dropped. If it is
// the only valid copy (dirty), or a pinned copy newer than the block's NVMe copy (even with the
// device holding the same bytes: the device copy alone could only be written back through a
// pinned buffer again), its write-back to the next tier is started instead and the eviction
// completes when the write lands (the copy is freed then, unless it was pinned or rewritten
// meanwhile); up to kEvictionWriteDepth such write-backs per tier (per pool) are in flight while
// the caller waits, so the disk keeps writing while the next copy is made. A clean copy is just
// dropped (parameters are read-only during forward and backward). Pinned copies and copies with a
// transfer in flight are never evicted. Which copy goes is the EvictionPolicy's choice: least
// recently used by default, or "needed furthest in the future" when the caller supplies the
// upcoming use order (FutureUsePolicy); both spare a copy that was prefetched and not used yet
// while any other candidate exists. If nothing can be evicted and nothing is in flight, the
// request fails with kResourceExhausted naming the tier, its budget and the block.
//
// Errors: a failed fetch (an NVMe read error, say) is reported by Pin::Wait to every waiter; the
// copy stays invalid and the other copies keep their state, so a later Acquire retries. A failed
// write-back leaves the dirty copy resident and valid; its error is kept with the copy and returned
// by the next call that needs the write: the block's Flush, or an eviction that picks the copy.
//
// Checksums (TierManagerOptions::verify_checksums, on by default): every write of a block to NVMe
// records the XXH3-64 of the bytes written, in memory beside the block; every read of that copy
// hashes the bytes read and, if they differ, fails the fetch with DataLoss "checksum mismatch:
// <file> offset <o> length <n> (block <name>): stored <hex> read <hex>" before the pinned copy
// becomes valid, so bits flipped on the drive (or by anything else writing the swap file) never
// reach training. An NVMe copy this manager did not write (AddBlock's nvme_valid) has no checksum
// and is not verified. Sums are kept per chunk of max(4 MiB, the I/O block size): the hashes of
// a write run on the writing thread while the write is in flight; a verified read is one request
// per chunk, each hashed on the I/O completion thread as it lands, so hashing overlaps the rest
// of the read. A mismatch names the chunk's offset and length.
//
// Thread-safety: every method may be called from any thread. Writers must be exclusive: a caller
// that will MarkDirty a block acquires it with Access::kWrite (which waits for transfers reading
// the block) and must be its only user while it writes (the manager does not lock contents). The
// device, arena and I/O backend must outlive the manager; the manager must outlive its pins.
// Flush, FlushAsync and FlushAll read the blocks they write back: a block that a thread holds for
// writing (Access::kWrite/kOverwrite, until its MarkDirty and release) is that thread's alone, so
// other threads flush it only after the hand-off (a FlushAll of other threads' blocks races with
// their writers; the torn write-back would be discarded, but the bytes race).
// Lock order: mu_ is taken before the arena's, the device's and the policy's locks (which never
// call back into the manager); it is never held across IoBackend::Submit, nor while continuations
// or the device's host functions run (those take it themselves). The device contract
// (tiers/device.h) guarantees host functions never run on the thread that launched them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "tiers/device.h"
#include "tiers/eviction_policy.h"  // EvictionPolicy, LruPolicy, FutureUsePolicy
#include "tiers/pin.h"
#include "tiers/pinned_arena.h"
#include "tiers/tier.h"

namespace strata {

class IoBackend;
class TierManager;

// Where a block's NVMe copy lives: `length` bytes at `offset` of an open fd (from SwapSpace).
// REQUIRES: length >= the block's size rounded up to the I/O alignment; offset aligned.
struct NvmeLocation {
  int fd = -1;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Bytes moved per link and time spent waiting, since the manager was made.
struct TierTelemetry {
  uint64_t nvme_to_pinned = 0;
  uint64_t pinned_to_device = 0;
  uint64_t device_to_pinned = 0;
  uint64_t pinned_to_nvme = 0;
  uint64_t evictions = 0;
  uint64_t writebacks = 0;
  double wait_seconds = 0;  // time callers spent in Pin::Wait
  uint64_t device_peak_bytes = 0;
  uint64_t pinned_peak_bytes = 0;
  // Swap checksums: bytes hashed (writes and verified reads) and the time spent hashing, summed
  // over the threads that hashed (writers and I/O completion threads).
  uint64_t checksum_bytes = 0;
  double checksum_seconds = 0;
  // Fetches started again after the previous fetch of the same copy failed (typically a
  // prefetch's NVMe read: the block is read again when used). Each is logged with the error.
  uint64_t read_retries = 0;
};

struct TierManagerOptions {
  DeviceBackend* device = nullptr;         // required to use Tier::kDevice
  PinnedArena* arena = nullptr;            // required
  IoBackend* io = nullptr;                 // required to use Tier::kNvme
  std::unique_ptr<EvictionPolicy> policy;  // default: LruPolicy
  // Checksum every NVMe copy written and verify it on every read (see the file comment). Off:
  // nothing is hashed and corrupt bytes on NVMe are returned as the block's contents.
  bool verify_checksums = true;
  // How long a request that finds everything in its tier pinned (and no transfer in flight) waits
  // for another thread to drop a pin before failing with kResourceExhausted: long enough for
  // another thread's write-back of a large block to finish and drop its pin. Tests that expect the
  // failure set it short.
  std::chrono::milliseconds pin_wait{std::chrono::seconds(10)};
};

class TierManager {
 public:
  static Result<std::unique_ptr<TierManager>> Create(TierManagerOptions options);
  ~TierManager();  // waits for transfers in flight

  TierManager(const TierManager&) = delete;
  TierManager& operator=(const TierManager&) = delete;

  // Registers a block of `bytes`. With `nvme`, the block has an NVMe home; `nvme_valid` says the
  // bytes there are already its contents (e.g. reopened swap files). A new block is valid
  // nowhere: the first Acquire gives storage with unspecified contents, to be written and marked
  // dirty.
  // `pool`: the pinned copies of this block come from that pool (PinnedArena::CarvePool of the
  // manager's arena) instead of the arena itself, and making room for one evicts only copies of
  // the same pool. Blocks of one kind share a pool so their pinned copies never fragment the
  // arena; null: the arena. REQUIRES: the pool outlives the manager.
  Result<BlockId> AddBlock(std::string name, uint64_t bytes, const NvmeLocation* nvme = nullptr,
                           bool nvme_valid = false, PinnedArena* pool = nullptr) EXCLUDES(mu_);

  enum class Access : uint8_t {
    kRead,   // the caller only reads the copy
    kWrite,  // the caller will write it (then MarkDirty): waits until no transfer reads the block
    // The caller will overwrite every byte (then MarkDirty): as kWrite, but an invalid copy gets
    // storage without being fetched (e.g. a gradient accumulator's first micro-batch).
    kOverwrite,
  };
  // Pins a copy of `id` in `tier` (kDevice or kPinned), starting a fetch if it is not valid there.
  // May evict other copies first (writing dirty ones back, which can block).
  Result<Pin> Acquire(BlockId id, Tier tier, Access access = Access::kRead) EXCLUDES(mu_);
  // Starts moving `id` into `tier` without pinning it; no-op if valid or already on its way.
  // A prefetch never makes room by evicting another copy that was prefetched and not used yet
  // (that read would be thrown away and done again): where nothing else can go, it starts nothing
  // and returns Ok (prefetching is best effort; the later Acquire fetches the block).
  Status Prefetch(BlockId id, Tier tier) EXCLUDES(mu_);
  // The caller will not use `id` soon after all (a speculative prefetch that guessed wrong): its
  // copies stop being spared as awaiting use and become the least recently used, so the next
  // eviction takes them first instead of a copy that is needed. A fetch in flight completes.
  void NotNeeded(BlockId id) EXCLUDES(mu_);
  // Makes every copy the manager issues from now on wait for `event` first: its device streams
  // wait on it (nothing waits on the host). Before releasing a pin whose device memory other work
  // may still read (libtorch computing on a gathered unit on its own stream), a caller records an
  // event on that work and passes it here, so a copy into the memory once reused lands after it.
  Status OrderCopiesAfter(const Event& event);
  // Makes the NVMe copy valid (writing the newest copy there). Blocks until the write landed and
  // returns its error (or that of an earlier asynchronous write-back of the block not reported
  // yet). No-op without NVMe home.
  Status Flush(BlockId id) EXCLUDES(mu_);
  // Starts making the NVMe copy valid and returns without waiting; the copies stay resident (and
  // become clean, hence evictable without a write). A failure is kept with the block and returned
  // by its next Flush, or by the eviction that picks it. The copy being written cannot be
  // acquired for writing until the write lands.
  Status FlushAsync(BlockId id) EXCLUDES(mu_);
  // Flush of every block, with up to kFlushAllDepth transfers in flight.
  Status FlushAll() EXCLUDES(mu_);

  // Where `id` is valid now (for tests and reports).
  bool IsValid(BlockId id, Tier tier) const EXCLUDES(mu_);
  bool IsResident(BlockId id, Tier tier) const EXCLUDES(mu_);
  std::string BlockName(BlockId id) const EXCLUDES(mu_);
  uint64_t BlockSize(BlockId id) const EXCLUDES(mu_);

  EvictionPolicy& policy() { return *policy_; }
  TierTelemetry telemetry() const;

 private:
  friend class Pin;
  struct Block;
  struct BlockCopy;
  explicit TierManager(TierManagerOptions options);

  // The private methods that REQUIRE mu_ may release it while they wait or submit I/O, and hold it
  // again when they return (each says so); callers re-read what the lock guards afterwards.
  // Finishes the fetch into `copy` with `status`; runs its continuations with mu_ released.
  void FinishFetch(BlockCopy& copy, Status status) REQUIRES(mu_);
  // `prefetch`: started by Prefetch, which must not evict copies awaiting use (see Prefetch).
  Status StartFetch(BlockId id, Tier tier, bool prefetch = false) REQUIRES(mu_);
  Status StartPinnedFetch(BlockId id, bool prefetch = false) REQUIRES(mu_);
  Status StartDeviceFetch(BlockId id, bool prefetch = false) REQUIRES(mu_);
  void IssueHostToDevice(BlockId id) REQUIRES(mu_);
  // Gets storage for `id` in `tier`, evicting as needed. With `prefetch`, returns
  // kPrefetchSkipped's status instead of evicting a copy awaiting use.
  Status EnsureStorage(BlockId id, Tier tier, bool prefetch = false) REQUIRES(mu_);
  // Frees one copy in `tier` (or its pool) if one can go now, or starts the write-back of a dirty
  // one that ends in its eviction; *progress says whether either happened. With
  // `spare_awaiting`, copies awaiting use are not candidates; *spared counts those left out.
  Status EvictOne(Tier tier, BlockId for_block, bool* progress, bool spare_awaiting, int* spared)
      REQUIRES(mu_);
  void DropCopy(BlockId id, int t) REQUIRES(mu_);
  // After a write-back of an evicting copy landed: frees it unless it was used meanwhile.
  void FinishEviction(BlockId id, int t, uint64_t version) REQUIRES(mu_);
  // Starts writing `from`'s copy to the next tier (asynchronous; see the .cc).
  Status StartWriteBack(BlockId id, Tier from, bool evict) REQUIRES(mu_);
  Status StartFlush(BlockId id) REQUIRES(mu_);
  Status FlushLocked(BlockId id) REQUIRES(mu_);
  Status CheckTier(BlockId id, Tier tier) const REQUIRES(mu_);
  void Unpin(BlockId id, Tier tier) EXCLUDES(mu_);
  void MarkDirty(BlockId id, Tier tier) EXCLUDES(mu_);
  int TierIndex(Tier tier) const;
  uint64_t Hash(std::span<const std::byte> bytes);  // XXH3-64, counted in the telemetry

  DeviceBackend* const device_;
  PinnedArena* const arena_;
  IoBackend* const io_;
  const bool verify_checksums_;
  const std::chrono::milliseconds pin_wait_;
  // Bytes per checksum: large enough that a chunk's request is not cut below the I/O block size.
  static constexpr uint64_t kMinChecksumChunk = 4ull << 20;
  // Write-backs that evictions of one tier (one pool) keep in flight: enough to keep the disk
  // busy while the next copy to the device or pinned tier is made.
  static constexpr int kEvictionWriteDepth = 2;
  static constexpr int kFlushAllDepth = 4;
  const uint64_t checksum_chunk_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::unique_ptr<Stream> h2d_;
  std::unique_ptr<Stream> d2h_;

  mutable Mutex mu_;
  CondVar cv_;  // signalled whenever a transfer completes or a pin is dropped
  // The blocks and everything in them (copies, their flags, completions) are guarded by mu_.
  std::vector<std::unique_ptr<Block>> blocks_ GUARDED_BY(mu_);
  uint64_t clock_ GUARDED_BY(mu_) = 0;
  int in_flight_ GUARDED_BY(mu_) = 0;  // transfers running
  // I/O completion callbacks running on the backend's threads, counted from their first statement
  // to their last (CallbackScope in tier_manager.cc), so that the destructor also waits for a
  // callback that has finished its transfer but is still releasing mu_.
  std::atomic<int> io_callbacks_running_{0};

  std::atomic<uint64_t> bytes_nvme_to_pinned_{0}, bytes_pinned_to_device_{0},
      bytes_device_to_pinned_{0}, bytes_pinned_to_nvme_{0}, evictions_{0}, writebacks_{0};
  std::atomic<int64_t> wait_us_{0};
  std::atomic<uint64_t> checksum_bytes_{0};
  std::atomic<int64_t> checksum_us_{0};
  std::atomic<uint64_t> read_retries_{0};
};

}  // namespace strata
