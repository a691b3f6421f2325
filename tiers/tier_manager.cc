// TierManager.
//
// State: per block, one Copy per tier (device, pinned, nvme) with a valid flag, a pin count, the
// Completion of a fetch into it (null when none is in flight), a busy_out flag while it is being
// written back, and the error of its last failed fetch. All of it is guarded by one mutex, mu_;
// data moves outside the lock.
//
// Fetches are chains of asynchronous steps whose completions run on I/O or copy threads:
//   pinned <- nvme:   IoBackend read; its callback marks the pinned copy valid.
//   pinned <- device: D2H copy + host function on the d2h stream.
//   device <- pinned: H2D copy + host function on the h2d stream; the pinned copy stays pinned
//                     (as staging) until the host function runs. If the pinned copy is itself not
//                     valid yet, the H2D step is a continuation of the pinned fetch.
// A Completion collects continuations; whoever finishes it runs them after dropping the lock.
//
// Eviction runs in the thread that needs space (EnsureStorage): it asks the policy for a victim
// among copies that are unpinned, not being fetched, not being written back and not already being
// evicted. A clean victim is freed at once. A dirty victim (the only valid copy) gets its
// write-back started with `evicting` set: pinned -> NVMe is an IoBackend write whose callback
// marks the NVMe copy valid; device -> pinned is a pinned fetch from the device. Either completion
// frees the evicting copy if nobody pinned, fetched into or rewrote it meanwhile (FinishEviction).
// The evicting thread goes on to the next candidate (at most kEvictionWriteDepth dirty ones per
// tier/pool), then waits for a transfer to finish; with nothing in flight and everything pinned
// it fails. While a copy is written back it is busy_out: not evictable, not written back twice,
// and writers' Acquires wait for it (its bytes are being read).
//
// Never call IoBackend::Submit with mu_ held: a request it rejects completes on the calling thread,
// and its callback takes mu_.
//
// Checksums: a block's io_bytes (the length transferred) are hashed in chunks of checksum_chunk_
// bytes (XXH3-64 each; the last chunk may be shorter). A write-back to NVMe hashes the pinned
// bytes while its write is in flight; both only read the buffer, which nobody may modify meanwhile
// (busy_out; a writer's MarkDirty bumps the version, which voids the NVMe copy anyway). The sums
// are stored only if the write succeeded and still counts (the version check). A verified read is
// one request per chunk, each hashed in its own completion (without mu_) as it lands, so hashing
// overlaps the rest of the read instead of following it; the last chunk to finish completes the
// fetch with the error of the lowest failed chunk, if any. The expected sums are captured when the
// read is submitted: the NVMe copy cannot be rewritten while a fetch from it is in flight
// (write-backs come from a valid pinned copy, and this one is being fetched).
#include "tiers/tier_manager.h"

#include <xxhash.h>
// Debian's libxxhash exports XXH3 built for baseline x86-64 (SSE2) and, beside it, a variant that
// picks AVX2/AVX-512 at run time: 3x faster on 4 MiB chunks here, the same sums.
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#define STRATA_XXH3_64 XXH3_64bits_dispatch
#else
#define STRATA_XXH3_64 XXH3_64bits
#endif

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <thread>
#include <utility>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/logging.h"
#include "base/trace.h"
#include "swap/io_backend.h"
#include "swap/io_engine.h"  // PathOfFd, to name the file in a checksum mismatch

namespace strata {

struct Pin::Completion {
  bool done = false;  // guarded by the manager's mu_ (as everything in a Block)
  Status status;
  std::vector<std::function<void(const Status&)>> then;  // run once, without the lock
};

struct TierManager::BlockCopy {
  bool valid = false;
  int pins = 0;
  bool busy_out = false;  // a write-back reads this copy (pinned -> NVMe)
  // An eviction started a write-back of this copy: when it lands and nobody pinned or rewrote
  // the copy meanwhile, the copy's storage is freed right there (the eviction completes).
  bool evicting = false;
  std::shared_ptr<Pin::Completion> fetch;
  Status last_error;
  // The error of this copy's last write-back to the next tier, until a caller is told (Flush, or
  // an eviction that picks the copy again). Cleared when a new write-back starts.
  Status writeback_error;
};

struct TierManager::Block {
  using Copy = BlockCopy;
  std::string name;
  uint64_t bytes = 0;
  uint64_t io_bytes = 0;  // bytes rounded up to the arena/I-O alignment
  bool has_nvme = false;
  NvmeLocation nvme;
  DeviceMemory dev;
  PinnedBuffer host;
  PinnedArena* pool = nullptr;  // where `host` comes from (the manager's arena or a pool of it)
  Copy copy[3];                 // indexed by TierIndex: device, pinned, nvme
  uint64_t last_use = 0;
  bool awaiting_use = false;  // prefetched, not acquired since
  // Bumped by every MarkDirty. A write-back that ran while the block was written again copied
  // stale (or torn) bytes: it must not mark its destination valid.
  uint64_t version = 0;
  // XXH3-64 of each checksum chunk of the io_bytes last written to the NVMe copy; empty for a
  // copy this manager never wrote (or wrote unverified), and while a write to it is in flight.
  std::vector<uint64_t> checksums;

  bool HasStorage(int t) const { return t == 0 ? dev.valid() : t == 1 ? host.valid() : has_nvme; }
  bool ValidElsewhere(int t) const {
    for (int i = 0; i < 3; ++i) {
      if (i != t && copy[i].valid) return true;
    }
    return false;
  }
  // Evicting copy t must write it back first: it is the only valid copy, or (pinned, with an NVMe
  // home) NVMe's is stale. A pinned copy newer than NVMe is written there even when the device
  // holds the same bytes: dropped, it would leave the device copy the only one, whose eviction
  // (or flush) then needs a pinned buffer again; with the pinned slots all held by users that
  // wait for one (an optimizer's write-behind queue), that wait never ends.
  bool WriteBeforeEvict(int t) const {
    if (!copy[t].valid) return false;
    if (t == 1 && has_nvme) return !copy[2].valid;  // the pinned copy; NVMe's
    return !ValidElsewhere(t);
  }
};

namespace {

// Counts an I/O completion callback as running from its first statement to its last: declared
// first in the callback, it is destroyed after the callback's MutexLock has released mu_.
class CallbackScope {
 public:
  explicit CallbackScope(std::atomic<int>& running) : running_(running) {
    running_.fetch_add(1, std::memory_order_relaxed);
  }
  ~CallbackScope() { running_.fetch_sub(1, std::memory_order_release); }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;

 private:
  std::atomic<int>& running_;
};

constexpr int kDev = 0, kPin = 1, kNvm = 2;

// What EnsureStorage returns to a prefetch that would have to evict a copy awaiting use; Prefetch
// turns it into Ok. Never seen outside the TierManager.
constexpr std::string_view kPrefetchSkipped =
    "prefetch skipped: no room without evicting a prefetch";
Status PrefetchSkippedError() {
  return Status(StatusCode::kCancelled, std::string(kPrefetchSkipped));
}
// A fetch into a copy of `b` other than `t` is in flight (it reads the block's bytes, or lands a
// copy that a write must invalidate after it).
template <class Block>
bool FetchIntoOtherTier(const Block& b, int t) {
  for (int i = 0; i < 3; ++i) {
    if (i != t && b.copy[i].fetch) return true;
  }
  return false;
}

bool IsPrefetchSkipped(const Status& s) {
  return s.code() == StatusCode::kCancelled && s.message() == kPrefetchSkipped;
}

const char* LinkName(int from, int to) {
  if (from == kNvm) return "nvme->pinned";
  if (from == kPin && to == kDev) return "pinned->device";
  if (from == kDev) return "device->pinned";
  return "pinned->nvme";
}

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

// One verified NVMe read: its chunks' requests complete in any order on I/O threads.
struct ChunkedRead {
  std::atomic<size_t> left{0};  // chunks not completed yet
  Mutex mu;
  Status error GUARDED_BY(mu);  // of the lowest failed chunk
  size_t error_chunk GUARDED_BY(mu) = SIZE_MAX;
};

// The error of a read whose bytes hash to `read` where `stored` was written.
Status ChecksumMismatch(int fd, uint64_t offset, uint64_t length, const std::string& block,
                        uint64_t stored, uint64_t read) {
  return DataLossError("checksum mismatch: " + internal::PathOfFd(fd) + " offset " +
                       std::to_string(offset) + " length " + std::to_string(length) + " (block " +
                       block + "): stored " + Hex(stored) + " read " + Hex(read));
}

void RecordTransfer(int from, int to, const std::string& block, int64_t start_us, uint64_t bytes) {
  TraceRecorder& t = TraceRecorder::Global();
  if (!t.enabled()) return;
  t.Record(LinkName(from, to), block, start_us, NowMicros() - start_us, FormatBytes(bytes));
}

}  // namespace

// ---- Pin --------------------------------------------------------------------------------------

Pin::Pin(Pin&& other) noexcept
    : manager_(std::exchange(other.manager_, nullptr)),
      id_(other.id_),
      tier_(other.tier_),
      completion_(std::move(other.completion_)) {}

Pin& Pin::operator=(Pin&& other) noexcept {
  if (this != &other) {
    Release();
    manager_ = std::exchange(other.manager_, nullptr);
    id_ = other.id_;
    tier_ = other.tier_;
    completion_ = std::move(other.completion_);
  }
  return *this;
}

Status Pin::Wait() const {
  if (completion_ == nullptr) return Status::Ok();
  MutexLock lock(&manager_->mu_);
  if (!completion_->done) {
    Stopwatch watch;
    while (!completion_->done) manager_->cv_.Wait(&manager_->mu_);
    manager_->wait_us_.fetch_add(static_cast<int64_t>(watch.Seconds() * 1e6));
  }
  return completion_->status;
}

bool Pin::Ready() const {
  if (completion_ == nullptr) return true;
  MutexLock lock(&manager_->mu_);
  return completion_->done;
}

void* Pin::data() const {
  MutexLock lock(&manager_->mu_);
  const TierManager::Block& b = *manager_->blocks_[id_];
  return tier_ == Tier::kDevice ? b.dev.data() : static_cast<void*>(b.host.data());
}

uint64_t Pin::size() const { return manager_->BlockSize(id_); }

void Pin::MarkDirty() { manager_->MarkDirty(id_, tier_); }

void Pin::Release() {
  if (manager_ != nullptr) manager_->Unpin(id_, tier_);
  manager_ = nullptr;
  completion_.reset();
}

// ---- TierManager ------------------------------------------------------------------------------

Result<std::unique_ptr<TierManager>> TierManager::Create(TierManagerOptions options) {
  if (options.arena == nullptr) return InvalidArgumentError("TierManager needs a pinned arena");
  std::unique_ptr<TierManager> m(new TierManager(std::move(options)));
  if (m->device_ != nullptr) {
    STRATA_ASSIGN_OR_RETURN(m->h2d_, m->device_->CreateStream("h2d"));
    STRATA_ASSIGN_OR_RETURN(m->d2h_, m->device_->CreateStream("d2h"));
  }
  return m;
}

TierManager::TierManager(TierManagerOptions options)
    : device_(options.device),
      arena_(options.arena),
      io_(options.io),
      verify_checksums_(options.verify_checksums),
      pin_wait_(options.pin_wait),
      checksum_chunk_(std::max<uint64_t>(
          kMinChecksumChunk, options.io != nullptr ? options.io->options().block_size : 0)),
      policy_(options.policy ? std::move(options.policy) : std::make_unique<LruPolicy>()) {}

TierManager::~TierManager() {
  {
    MutexLock lock(&mu_);
    while (in_flight_ > 0) cv_.Wait(&mu_);
  }
  // The last callback signalled in_flight_ == 0 under mu_ and may still be returning (releasing
  // mu_, dropping its captures) on the I/O thread: wait until it has, before mu_ is freed.
  while (io_callbacks_running_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
  h2d_.reset();  // streams drain their queues
  d2h_.reset();
}

int TierManager::TierIndex(Tier tier) const {
  switch (tier) {
    case Tier::kDevice:
      return kDev;
    case Tier::kPinned:
      return kPin;
    case Tier::kNvme:
      return kNvm;
    case Tier::kHost:
      break;
  }
  return -1;
}

Status TierManager::CheckTier(BlockId id, Tier tier) const {
  if (id >= blocks_.size()) return NotFoundError("no block with id " + std::to_string(id));
  if (tier == Tier::kDevice && device_ == nullptr) {
    return FailedPreconditionError("block " + blocks_[id]->name +
                                   ": the tier manager has no device");
  }
  if (tier != Tier::kDevice && tier != Tier::kPinned) {
    return InvalidArgumentError("block " + blocks_[id]->name + ": cannot acquire in tier " +
                                std::string(TierName(tier)) + " (use device or pinned)");
  }
  return Status::Ok();
}

Result<BlockId> TierManager::AddBlock(std::string name, uint64_t bytes, const NvmeLocation* nvme,
                                      bool nvme_valid, PinnedArena* pool) {
  if (bytes == 0) return InvalidArgumentError("block " + name + " has 0 bytes");
  auto b = std::make_unique<Block>();
  b->name = std::move(name);
  b->bytes = bytes;
  b->pool = pool != nullptr ? pool : arena_;
  if (pool != nullptr && pool->slot_bytes() != 0 &&
      AlignUp(bytes, arena_->alignment()) > pool->slot_bytes()) {
    return InvalidArgumentError("block " + b->name + " (" + FormatBytes(bytes) +
                                ") is larger than a slot of its pinned pool (" +
                                FormatBytes(pool->slot_bytes()) + ")");
  }
  b->io_bytes = AlignUp(bytes, arena_->alignment());
  if (nvme != nullptr) {
    if (io_ == nullptr)
      return FailedPreconditionError("block " + b->name + ": no I/O backend for NVMe");
    if (nvme->fd < 0 || nvme->length < b->io_bytes ||
        !IsAligned(nvme->offset, arena_->alignment())) {
      return InvalidArgumentError(
          "block " + b->name + ": NVMe location (fd " + std::to_string(nvme->fd) + ", offset " +
          std::to_string(nvme->offset) + ", length " + std::to_string(nvme->length) +
          ") cannot hold " + std::to_string(b->io_bytes) + " aligned bytes");
    }
    b->has_nvme = true;
    b->nvme = *nvme;
    b->copy[kNvm].valid = nvme_valid;
  }
  MutexLock lock(&mu_);
  blocks_.push_back(std::move(b));
  return static_cast<BlockId>(blocks_.size() - 1);
}

Result<Pin> TierManager::Acquire(BlockId id, Tier tier, Access access) {
  MutexLock lock(&mu_);
  STRATA_RETURN_IF_ERROR(CheckTier(id, tier));
  const int t = TierIndex(tier);
  Block& b = *blocks_[id];
  b.last_use = ++clock_;
  b.awaiting_use = false;
  b.copy[t].pins++;  // from here on the copy is not evictable
  if (access == Access::kOverwrite) {
    // A fetch landing after the caller's writes would clobber them: let it finish first.
    while (b.copy[t].fetch) cv_.Wait(&mu_);
    if (!b.copy[t].valid) {
      Status s = EnsureStorage(id, tier);
      if (!s.ok()) {
        b.copy[t].pins--;
        cv_.SignalAll();
        return s;
      }
      // Storage with unspecified contents; the caller's MarkDirty makes it the only valid copy.
      if (!b.copy[t].fetch) b.copy[t].valid = true;
    }
  }
  if (!b.copy[t].valid && !b.copy[t].fetch) {
    Status s = StartFetch(id, tier);
    if (!s.ok()) {
      b.copy[t].pins--;
      cv_.SignalAll();
      return s;
    }
  }
  if (access != Access::kRead) {
    // Transfers out of the block (a fetch into another tier, a write-back of this copy) may be
    // reading these bytes: let them finish before the caller writes. They finish on their own,
    // and the pin taken above keeps new write-backs of this copy from starting.
    while (b.copy[t].busy_out || FetchIntoOtherTier(b, t)) cv_.Wait(&mu_);
  }
  if (b.copy[t].valid) return Pin(this, id, tier, nullptr);
  if (b.copy[t].fetch) return Pin(this, id, tier, b.copy[t].fetch);
  // The fetch finished and failed while the lock was released.
  b.copy[t].pins--;
  cv_.SignalAll();
  return b.copy[t].last_error;
}

Status TierManager::Prefetch(BlockId id, Tier tier) {
  MutexLock lock(&mu_);
  STRATA_RETURN_IF_ERROR(CheckTier(id, tier));
  const int t = TierIndex(tier);
  Block& b = *blocks_[id];
  if (b.copy[t].valid || b.copy[t].fetch) return Status::Ok();
  b.last_use = ++clock_;
  b.awaiting_use = true;
  Status s = StartFetch(id, tier, /*prefetch=*/true);
  if (IsPrefetchSkipped(s)) {
    // Nothing started: the block is not on its way anywhere, so it awaits nothing.
    if (!b.copy[t].valid && !b.copy[t].fetch) b.awaiting_use = false;
    return Status::Ok();
  }
  return s;
}

Status TierManager::StartFetch(BlockId id, Tier tier, bool prefetch) {
  // A fetch into a copy whose last fetch failed is a retry (a failed prefetch, read again now
  // that the block is used): said, with the error that names the file, offset and errno, and
  // counted. A retry that fails too is the caller's error.
  BlockCopy& copy = blocks_[id]->copy[tier == Tier::kDevice ? kDev : kPin];
  if (!copy.last_error.ok()) {
    ++read_retries_;
    STRATA_LOG(kWarning) << "reading block " << blocks_[id]->name << " into "
                         << (tier == Tier::kDevice ? "device" : "pinned")
                         << " memory again after a failed read: " << copy.last_error.ToString();
    copy.last_error = Status::Ok();
  }
  return tier == Tier::kDevice ? StartDeviceFetch(id, prefetch) : StartPinnedFetch(id, prefetch);
}

// Finishes the fetch into `copy` with `status`; runs its continuations with mu_ released (held
// again before returning).
void TierManager::FinishFetch(BlockCopy& copy, Status status) {
  std::shared_ptr<Pin::Completion> c = std::move(copy.fetch);
  copy.fetch.reset();
  if (status.ok()) {
    copy.valid = true;
    copy.last_error = Status::Ok();
  } else {
    copy.last_error = status;
  }
  c->done = true;
  c->status = status;
  --in_flight_;
  auto then = std::move(c->then);
  cv_.SignalAll();
  if (!then.empty()) {
    mu_.Unlock();
    for (auto& fn : then) fn(status);
    mu_.Lock();
  }
}

Status TierManager::StartPinnedFetch(BlockId id, bool prefetch) {
  STRATA_RETURN_IF_ERROR(EnsureStorage(id, Tier::kPinned, prefetch));
  Block& b = *blocks_[id];
  Block::Copy& p = b.copy[kPin];
  if (p.valid || p.fetch) return Status::Ok();  // done by another thread meanwhile
  if (!b.copy[kDev].valid && !b.copy[kNvm].valid) {
    p.valid = true;  // a new block: storage with unspecified contents
    return Status::Ok();
  }
  p.fetch = std::make_shared<Pin::Completion>();
  ++in_flight_;
  const int64_t start = NowMicros();

  if (b.copy[kDev].valid) {  // the device holds the newest bytes
    b.copy[kDev].pins++;
    Status s =
        device_->CopyAsync(b.host.data(), b.dev.data(), b.bytes, CopyKind::kDeviceToHost, *d2h_);
    if (s.ok()) {
      s = device_->LaunchHostFunc(*d2h_, [this, id, start, version = b.version] {
        MutexLock l(&mu_);
        Block& blk = *blocks_[id];
        blk.copy[kDev].pins--;
        blk.copy[kDev].busy_out = false;  // a write-back from the device is this copy
        bytes_device_to_pinned_ += blk.bytes;
        RecordTransfer(kDev, kPin, blk.name, start, blk.bytes);
        FinishFetch(blk.copy[kPin], Status::Ok());
        FinishEviction(id, kDev, version);
      });
    }
    if (!s.ok()) {
      b.copy[kDev].pins--;
      b.copy[kDev].busy_out = false;
      b.copy[kDev].evicting = false;
      Status err = s.WithContext("fetching block " + b.name + " from the device");
      FinishFetch(p, err);
      return err;
    }
    return Status::Ok();
  }

  // Unverified: one request for the whole block. Verified: one per checksum chunk.
  const std::vector<uint64_t> stored = verify_checksums_ ? b.checksums : std::vector<uint64_t>();
  const uint64_t chunk = stored.empty() ? b.io_bytes : checksum_chunk_;
  const size_t chunks = stored.empty() ? 1 : stored.size();
  auto read = std::make_shared<ChunkedRead>();
  read->left = chunks;
  std::vector<IoRequest> requests(chunks);
  for (size_t c = 0; c < chunks; ++c) {
    IoRequest& req = requests[c];
    req.op = IoOp::kRead;
    req.fd = b.nvme.fd;
    req.offset = b.nvme.offset + c * chunk;
    req.buffer = std::span<std::byte>(b.host.data() + c * chunk,
                                      std::min<uint64_t>(chunk, b.io_bytes - c * chunk));
    const uint64_t expected = stored.empty() ? 0 : stored[c];
    req.done = [this, id, start, read, c, expected, verify = !stored.empty(), fd = req.fd,
                offset = req.offset, buffer = req.buffer](Status s, size_t) {
      CallbackScope running(io_callbacks_running_);
      // Hashed before taking mu_: the buffer is this fetch's alone until FinishFetch.
      if (s.ok() && verify) {
        const uint64_t got = Hash(buffer);
        if (got != expected) {
          s = ChecksumMismatch(fd, offset, buffer.size(), BlockName(id), expected, got);
        }
      }
      if (!s.ok()) {
        MutexLock g(&read->mu);
        if (c < read->error_chunk) {
          read->error = std::move(s);
          read->error_chunk = c;
        }
      }
      if (read->left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
      Status result;
      {
        MutexLock g(&read->mu);
        result = std::move(read->error);
      }
      MutexLock l(&mu_);
      Block& blk = *blocks_[id];
      if (result.ok()) {
        bytes_nvme_to_pinned_ += blk.io_bytes;
        RecordTransfer(kNvm, kPin, blk.name, start, blk.io_bytes);
      } else {
        result = std::move(result).WithContext("fetching block " + blk.name + " from NVMe");
      }
      FinishFetch(blk.copy[kPin], std::move(result));
    };
  }
  mu_.Unlock();
  // The tickets are not needed: the callbacks report.
  for (IoRequest& req : requests) io_->Submit(std::move(req));
  mu_.Lock();
  return Status::Ok();
}

uint64_t TierManager::Hash(std::span<const std::byte> bytes) {
  const int64_t start = NowMicros();
  const uint64_t sum = STRATA_XXH3_64(bytes.data(), bytes.size());
  checksum_us_ += NowMicros() - start;
  checksum_bytes_ += bytes.size();
  return sum;
}

void TierManager::IssueHostToDevice(BlockId id) {
  // Called with mu_ held. CopyAsync and LaunchHostFunc never run callbacks inline.
  Block& b = *blocks_[id];
  const int64_t start = NowMicros();
  Status s =
      device_->CopyAsync(b.dev.data(), b.host.data(), b.bytes, CopyKind::kHostToDevice, *h2d_);
  if (s.ok()) {
    s = device_->LaunchHostFunc(*h2d_, [this, id, start] {
      MutexLock l(&mu_);
      Block& blk = *blocks_[id];
      blk.copy[kPin].pins--;  // staging done
      bytes_pinned_to_device_ += blk.bytes;
      RecordTransfer(kPin, kDev, blk.name, start, blk.bytes);
      FinishFetch(blk.copy[kDev], Status::Ok());
    });
  }
  if (!s.ok()) {
    b.copy[kPin].pins--;
    // A device fetch has no continuations, so it can be failed here without unlocking.
    std::shared_ptr<Pin::Completion> c = std::move(b.copy[kDev].fetch);
    b.copy[kDev].fetch.reset();
    b.copy[kDev].last_error = s.WithContext("copying block " + b.name + " to the device");
    c->done = true;
    c->status = b.copy[kDev].last_error;
    --in_flight_;
    cv_.SignalAll();
  }
}

Status TierManager::StartDeviceFetch(BlockId id, bool prefetch) {
  STRATA_RETURN_IF_ERROR(EnsureStorage(id, Tier::kDevice, prefetch));
  Block& b = *blocks_[id];
  Block::Copy& d = b.copy[kDev];
  if (d.valid || d.fetch) return Status::Ok();
  if (!b.copy[kPin].valid && !b.copy[kNvm].valid && !b.copy[kPin].fetch) {
    d.valid = true;  // a new block
    return Status::Ok();
  }
  // The pinned copy is the staging buffer until the H2D copy is done. It is pinned, and its fetch
  // started, before this fetch counts as in flight: EnsureStorage waits on transfers in flight,
  // and must never wait on this one, which cannot progress until the staging buffer exists.
  Block::Copy& p = b.copy[kPin];
  p.pins++;
  if (!p.valid && !p.fetch) {
    Status s = StartPinnedFetch(id, prefetch);
    if (!s.ok()) {
      p.pins--;
      cv_.SignalAll();
      return s;
    }
  }
  if (d.valid || d.fetch) {  // another thread got there while the lock was released
    p.pins--;
    cv_.SignalAll();
    return Status::Ok();
  }
  if (!p.valid && !p.fetch) {  // the pinned fetch already failed
    p.pins--;
    cv_.SignalAll();
    return p.last_error;
  }
  d.fetch = std::make_shared<Pin::Completion>();
  ++in_flight_;
  if (p.valid) {
    IssueHostToDevice(id);
    return Status::Ok();
  }
  p.fetch->then.push_back([this, id](const Status& s) {
    MutexLock l(&mu_);
    Block& blk = *blocks_[id];
    if (s.ok()) {
      IssueHostToDevice(id);
    } else {
      blk.copy[kPin].pins--;
      FinishFetch(blk.copy[kDev], s);
    }
  });
  return Status::Ok();
}

Status TierManager::EnsureStorage(BlockId id, Tier tier, bool prefetch) {
  const int t = TierIndex(tier);
  // TierManagerOptions::pin_wait: long enough for another thread's write-back to drop its pin.
  const auto pin_deadline = std::chrono::steady_clock::now() + pin_wait_;
  for (;;) {
    Block& b = *blocks_[id];
    if (b.HasStorage(t)) return Status::Ok();
    Status failure;
    if (t == kDev) {
      Result<DeviceMemory> mem = device_->Allocate(b.bytes);
      if (mem.ok()) {
        b.dev = std::move(*mem);
        return Status::Ok();
      }
      failure = mem.status();
    } else {
      Result<PinnedBuffer> buf = b.pool->Allocate(b.io_bytes);
      if (buf.ok()) {
        b.host = std::move(*buf);
        return Status::Ok();
      }
      failure = buf.status();
    }
    if (failure.code() != StatusCode::kResourceExhausted) return failure;
    bool progress = false;
    int spared = 0;
    STRATA_RETURN_IF_ERROR(EvictOne(tier, id, &progress, prefetch, &spared));
    if (progress) continue;
    // Only copies awaiting use could go: a prefetch does not throw another prefetch's read away,
    // nor wait (its caller may be the compute thread) for room to appear.
    if (spared > 0) return PrefetchSkippedError();
    if (in_flight_ > 0) {
      cv_.Wait(&mu_);  // a transfer finishing may unpin or free something
      continue;
    }
    // Everything is pinned. Another thread may be about to drop a pin (a hand-off finishing):
    // wait a little for one before failing. Bounded, since the pins may be the caller's own.
    if (std::chrono::steady_clock::now() < pin_deadline) {
      (void)cv_.WaitUntil(&mu_, pin_deadline);
      continue;
    }
    return ResourceExhaustedError(std::string(TierName(tier)) + " tier cannot hold block " +
                                  b.name + " (" + FormatBytes(b.bytes) +
                                  "): everything resident there is pinned or in use (" +
                                  std::string(failure.message()) + ")");
  }
}

Status TierManager::EvictOne(Tier tier, BlockId for_block, bool* progress, bool spare_awaiting,
                             int* spared) {
  *progress = false;
  const int t = TierIndex(tier);
  std::vector<EvictionCandidate> candidates;
  std::vector<bool> dirty;
  int writing = 0;  // evictions of this tier (pool) waiting for their write-back
  for (BlockId i = 0; i < blocks_.size(); ++i) {
    const Block& b = *blocks_[i];
    const Block::Copy& c = b.copy[t];
    if (i == for_block || !b.HasStorage(t)) continue;
    // Room in a pool is made only by evicting from the same pool.
    if (t == kPin && b.pool != blocks_[for_block]->pool) continue;
    if (c.evicting) ++writing;
    if (c.pins > 0 || c.fetch || c.busy_out || c.evicting) continue;
    const bool only = b.WriteBeforeEvict(t);
    // A pinned-tier copy that is the only valid one and has no NVMe home cannot be written back.
    if (t == kPin && only && !b.has_nvme) continue;
    if (spare_awaiting && b.awaiting_use && c.valid) {
      ++*spared;
      continue;
    }
    candidates.push_back({i, b.last_use, b.awaiting_use});
    dirty.push_back(only);
  }
  if (writing >= kEvictionWriteDepth) {
    // Enough write-backs are on their way to free space: take only what can go at once.
    size_t kept = 0;
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (!dirty[i]) candidates[kept++] = candidates[i];
    }
    candidates.resize(kept);
  }
  if (candidates.empty()) return Status::Ok();
  const BlockId victim = candidates[policy_->ChooseVictim(tier, candidates)].id;
  Block& v = *blocks_[victim];
  Block::Copy& vc = v.copy[t];
  if (v.WriteBeforeEvict(t)) {
    // The only valid copy (or newer than NVMe): write it back first. The eviction finishes when
    // the write lands.
    if (!vc.writeback_error.ok()) {  // it failed before: the caller is told, not looped
      Status e = std::exchange(vc.writeback_error, Status::Ok());
      return e;
    }
    STRATA_RETURN_IF_ERROR(StartWriteBack(victim, tier, /*evict=*/true));
    *progress = true;
    return Status::Ok();
  }
  DropCopy(victim, t);
  *progress = true;
  return Status::Ok();
}

void TierManager::DropCopy(BlockId id, int t) {
  Block& b = *blocks_[id];
  if (t == kDev) {
    b.dev.Reset();
  } else {
    b.host.Reset();
  }
  b.copy[t].valid = false;
  b.copy[t].evicting = false;
  ++evictions_;
  cv_.SignalAll();
}

void TierManager::FinishEviction(BlockId id, int t, uint64_t version) {
  Block& b = *blocks_[id];
  Block::Copy& c = b.copy[t];
  if (!c.evicting) return;
  c.evicting = false;
  // Pinned again, being fetched or read, or rewritten since: the copy stays.
  if (c.pins > 0 || c.fetch || c.busy_out || b.version != version || !b.ValidElsewhere(t)) {
    cv_.SignalAll();
    return;
  }
  DropCopy(id, t);
}

Status TierManager::StartWriteBack(BlockId id, Tier from, bool evict) {
  const int f = TierIndex(from);
  Block& b = *blocks_[id];
  Block::Copy& src = b.copy[f];
  if (!src.valid || src.busy_out) return Status::Ok();  // nothing to write, or on its way
  src.writeback_error = Status::Ok();
  if (f == kDev) {
    // Device -> pinned is exactly a pinned fetch from the device (its completion finishes the
    // eviction). Joining a fetch in flight, or starting one, guarantees that two copies never
    // target the same pinned buffer, where the later one could land after newer bytes.
    // The device copy is busy_out meanwhile, so a writer's Acquire waits for the copy to land.
    Block::Copy& p = b.copy[kPin];
    if (p.valid) return Status::Ok();
    src.evicting = src.evicting || evict;
    src.busy_out = true;
    if (p.fetch) return Status::Ok();  // its completion clears busy_out and finishes the eviction
    Status s = StartPinnedFetch(id);
    Block::Copy& d = blocks_[id]->copy[kDev];
    if (!s.ok() || !blocks_[id]->copy[kPin].fetch) {  // failed, or nothing left in flight
      d.busy_out = false;
      d.evicting = false;
      cv_.SignalAll();
    }
    if (!s.ok()) return s.WithContext("writing back block " + blocks_[id]->name + " from device");
    return Status::Ok();
  }
  // Pinned -> NVMe: submitted here, completed by the I/O callback. The pinned bytes are hashed on
  // this thread while the write is in flight; whichever of the two finishes last publishes.
  src.busy_out = true;  // not evictable, not written twice, not writable (Acquire waits)
  src.evicting = evict;
  ++in_flight_;
  b.checksums.clear();  // the NVMe bytes are about to change
  struct Pending {
    std::atomic<int> left{2};
    Status status;
    std::vector<uint64_t> checksums;
  };
  auto pending = std::make_shared<Pending>();
  const uint64_t version = b.version;
  const int64_t start = NowMicros();
  std::span<std::byte> bytes(b.host.data(), b.io_bytes);
  auto finish = [this, id, version, start, pending] {
    MutexLock l(&mu_);
    Block& blk = *blocks_[id];
    Block::Copy& pc = blk.copy[kPin];
    pc.busy_out = false;
    --in_flight_;
    ++writebacks_;
    if (pending->status.ok() && blk.version == version) {
      blk.copy[kNvm].valid = true;
      blk.checksums = std::move(pending->checksums);
      bytes_pinned_to_nvme_ += blk.io_bytes;
      RecordTransfer(kPin, kNvm, blk.name, start, blk.io_bytes);
    } else if (!pending->status.ok()) {
      pc.writeback_error =
          pending->status.WithContext("writing back block " + blk.name + " from pinned");
    }
    FinishEviction(id, kPin, version);
    cv_.SignalAll();
  };
  IoRequest req{IoOp::kWrite, b.nvme.fd, b.nvme.offset, bytes, nullptr};
  req.done = [this, pending, finish](Status s, size_t) {
    CallbackScope running(io_callbacks_running_);
    pending->status = std::move(s);
    if (pending->left.fetch_sub(1, std::memory_order_acq_rel) == 1) finish();
  };
  mu_.Unlock();
  (void)io_->Submit(std::move(req));  // the callback reports
  std::vector<uint64_t> checksums;
  if (verify_checksums_) {
    for (uint64_t at = 0; at < bytes.size(); at += checksum_chunk_) {
      checksums.push_back(Hash(bytes.subspan(at, std::min(checksum_chunk_, bytes.size() - at))));
    }
  }
  pending->checksums = std::move(checksums);
  if (pending->left.fetch_sub(1, std::memory_order_acq_rel) == 1) finish();
  mu_.Lock();
  return Status::Ok();
}

Status TierManager::StartFlush(BlockId id) {
  Block& b = *blocks_[id];
  if (!b.has_nvme || b.copy[kNvm].valid) return Status::Ok();
  Block::Copy& p = b.copy[kPin];
  if (p.busy_out) return Status::Ok();
  if (p.valid) return StartWriteBack(id, Tier::kPinned, /*evict=*/false);
  if (b.copy[kDev].valid && !p.fetch) {
    // Device -> pinned first; the pinned -> NVMe write follows when the copy lands.
    STRATA_RETURN_IF_ERROR(StartWriteBack(id, Tier::kDevice, /*evict=*/false));
  }
  if (p.fetch && b.copy[kDev].valid) {
    p.fetch->then.push_back([this, id](const Status& s) {
      if (!s.ok()) return;
      MutexLock l(&mu_);
      Block& blk = *blocks_[id];
      if (blk.copy[kPin].valid && !blk.copy[kNvm].valid) {
        Status w = StartWriteBack(id, Tier::kPinned, /*evict=*/false);
        if (!w.ok()) blk.copy[kPin].writeback_error = std::move(w);
      }
    });
  }
  return Status::Ok();
}

Status TierManager::FlushAsync(BlockId id) {
  MutexLock lock(&mu_);
  if (id >= blocks_.size()) return NotFoundError("no block with id " + std::to_string(id));
  return StartFlush(id);
}

Status TierManager::OrderCopiesAfter(const Event& event) {
  if (device_ == nullptr) return Status::Ok();
  STRATA_RETURN_IF_ERROR(device_->StreamWaitEvent(*h2d_, event));
  return device_->StreamWaitEvent(*d2h_, event);
}

Status TierManager::Flush(BlockId id) {
  MutexLock lock(&mu_);
  if (id >= blocks_.size()) return NotFoundError("no block with id " + std::to_string(id));
  return FlushLocked(id);
}

Status TierManager::FlushLocked(BlockId id) {
  Block& b = *blocks_[id];
  if (!b.has_nvme) return Status::Ok();
  for (;;) {
    if (b.copy[kNvm].valid) return Status::Ok();
    // Each branch either makes progress or blocks with the lock released: never spin here
    // holding the lock.
    Block::Copy& p = b.copy[kPin];
    Block::Copy& d = b.copy[kDev];
    if (!p.writeback_error.ok() && !p.busy_out) {
      return std::exchange(p.writeback_error, Status::Ok());
    }
    if (!d.writeback_error.ok() && !p.fetch) {
      return std::exchange(d.writeback_error, Status::Ok());
    }
    if (p.busy_out || p.fetch) {
      cv_.Wait(&mu_);
    } else if (p.valid) {
      STRATA_RETURN_IF_ERROR(StartWriteBack(id, Tier::kPinned, /*evict=*/false));
    } else if (d.valid) {
      STRATA_RETURN_IF_ERROR(StartWriteBack(id, Tier::kDevice, /*evict=*/false));
      if (!b.copy[kPin].fetch && !b.copy[kPin].valid) {  // the device copy failed at once
        return b.copy[kPin].last_error.ok()
                   ? InternalError("block " + b.name + ": no pinned copy to write back")
                   : b.copy[kPin].last_error;
      }
    } else if (d.fetch) {
      cv_.Wait(&mu_);
    } else {
      return Status::Ok();  // never written: nothing to flush
    }
  }
}

Status TierManager::FlushAll() {
  MutexLock lock(&mu_);
  const size_t n = blocks_.size();
  // Start the writes with a bounded number in flight, then collect them.
  for (BlockId i = 0; i < n; ++i) {
    while (in_flight_ >= kFlushAllDepth) cv_.Wait(&mu_);
    STRATA_RETURN_IF_ERROR(StartFlush(i));
  }
  for (BlockId i = 0; i < n; ++i) STRATA_RETURN_IF_ERROR(FlushLocked(i));
  return Status::Ok();
}

void TierManager::Unpin(BlockId id, Tier tier) {
  MutexLock lock(&mu_);
  blocks_[id]->copy[TierIndex(tier)].pins--;
  cv_.SignalAll();
}

void TierManager::MarkDirty(BlockId id, Tier tier) {
  MutexLock lock(&mu_);
  Block& b = *blocks_[id];
  const int t = TierIndex(tier);
  // A fetch into another tier that started before this write (a prefetch, say) would mark its
  // stale copy valid when it lands. Let it land first, then invalidate it. Fetches finish on
  // their own, and the caller's pin keeps this copy in place meanwhile.
  while (FetchIntoOtherTier(b, t)) cv_.Wait(&mu_);
  for (int i = 0; i < 3; ++i) b.copy[i].valid = (i == t);
  ++b.version;
}

void TierManager::NotNeeded(BlockId id) {
  MutexLock lock(&mu_);
  if (id >= blocks_.size()) return;
  Block& b = *blocks_[id];
  b.awaiting_use = false;
  b.last_use = 0;
}

bool TierManager::IsValid(BlockId id, Tier tier) const {
  MutexLock lock(&mu_);
  return id < blocks_.size() && TierIndex(tier) >= 0 && blocks_[id]->copy[TierIndex(tier)].valid;
}

bool TierManager::IsResident(BlockId id, Tier tier) const {
  MutexLock lock(&mu_);
  return id < blocks_.size() && TierIndex(tier) >= 0 && blocks_[id]->HasStorage(TierIndex(tier));
}

std::string TierManager::BlockName(BlockId id) const {
  MutexLock lock(&mu_);
  return id < blocks_.size() ? blocks_[id]->name : std::string();
}

uint64_t TierManager::BlockSize(BlockId id) const {
  MutexLock lock(&mu_);
  return id < blocks_.size() ? blocks_[id]->bytes : 0;
}

TierTelemetry TierManager::telemetry() const {
  TierTelemetry t;
  t.nvme_to_pinned = bytes_nvme_to_pinned_;
  t.pinned_to_device = bytes_pinned_to_device_;
  t.device_to_pinned = bytes_device_to_pinned_;
  t.pinned_to_nvme = bytes_pinned_to_nvme_;
  t.evictions = evictions_;
  t.writebacks = writebacks_;
  t.wait_seconds = static_cast<double>(wait_us_.load()) * 1e-6;
  t.checksum_bytes = checksum_bytes_;
  t.checksum_seconds = static_cast<double>(checksum_us_.load()) * 1e-6;
  t.read_retries = read_retries_;
  t.device_peak_bytes = device_ ? device_->peak_bytes() : 0;
  t.pinned_peak_bytes = arena_->peak_bytes();
  return t;
}

}  // namespace strata
