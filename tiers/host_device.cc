// HostDevice. Each HostStream owns a worker thread and a FIFO of tasks. A task returns a Status;
// the first failure becomes the stream's sticky error, which every later event on the stream
// reports (CUDA's behaviour after a failed async operation). Events are completion flags with a
// condition variable; StreamWaitEvent enqueues a task that blocks the worker on another stream's
// event, which orders the streams without blocking the caller.
#include "tiers/host_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <thread>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/logging.h"

namespace strata {
namespace {

// Device blocks whose size class is this large get their own mapping (HostDevice::TakeBlock).
constexpr uint64_t kMapThreshold = uint64_t{1} << 20;

uint64_t PageSize() {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// The size class of a request: what the block holding it occupies, and the key of the cache.
// Whether a block is a mapping is a function of its class alone, so a cached block's class says
// how to release it.
uint64_t SizeClass(uint64_t bytes) {
  const uint64_t small = AlignUp(bytes, 256);
  return small < kMapThreshold ? small : AlignUp(bytes, std::max<uint64_t>(PageSize(), 4096));
}
bool IsMapped(uint64_t size_class) { return size_class >= kMapThreshold; }

void* MapFresh(uint64_t size) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void ReleaseBlock(void* p, uint64_t size_class) {
  if (IsMapped(size_class)) {
    munmap(p, size_class);
  } else {
    std::free(p);
  }
}

class HostEventState final : public EventState {
 public:
  bool Query() const override {
    MutexLock lock(&mu_);
    return done_;
  }
  Status Wait() const override {
    MutexLock lock(&mu_);
    while (!done_) cv_.Wait(&mu_);
    return status_;
  }
  void Complete(Status status) {
    {
      MutexLock lock(&mu_);
      status_ = std::move(status);
      done_ = true;
    }
    cv_.SignalAll();
  }

 private:
  mutable Mutex mu_;
  mutable CondVar cv_;
  bool done_ GUARDED_BY(mu_) = false;
  Status status_ GUARDED_BY(mu_);
};

class HostStream final : public Stream {
 public:
  explicit HostStream(std::string name) : name_(std::move(name)), worker_([this] { Run(); }) {}

  ~HostStream() override {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    cv_.SignalAll();
    worker_.join();  // drains the queue first
  }

  std::string_view name() const override { return name_; }

  // The task receives the stream's sticky error so far and returns its own result.
  void Enqueue(std::function<Status(const Status& sticky)> task) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      queue_.push_back(std::move(task));
    }
    cv_.Signal();
  }

 private:
  void Run() EXCLUDES(mu_) {
    Status sticky;
    for (;;) {
      std::function<Status(const Status&)> task;
      {
        MutexLock lock(&mu_);
        while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
        if (queue_.empty()) return;  // stopping and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      Status s = task(sticky);
      if (!s.ok() && sticky.ok()) sticky = std::move(s);
    }
  }

  const std::string name_;
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<Status(const Status&)>> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread worker_;  // last: starts after the other members exist
};

HostStream& AsHost(Stream& stream) { return static_cast<HostStream&>(stream); }

}  // namespace

HostDevice::HostDevice(HostDeviceOptions options) : options_(options) {}

HostDevice::~HostDevice() {
  if (used_bytes() != 0) {
    STRATA_LOG(kError) << "HostDevice destroyed with " << FormatBytes(used_bytes())
                       << " still allocated";
  }
  for (const auto& [size, p] : cache_) ReleaseBlock(p, size);
}

DeviceInfo HostDevice::info() const {
  return DeviceInfo{"host-emulated", options_.budget_bytes, options_.budget_bytes,
                    /*host_addressable=*/true};
}

Result<void*> HostDevice::AllocateRaw(uint64_t bytes) {
  void* p = nullptr;
  {
    MutexLock lock(&alloc_mu_);
    const uint64_t used = used_.load();
    if (bytes > options_.budget_bytes || used > options_.budget_bytes - bytes) {
      return ResourceExhaustedError("device (host-emulated) allocation of " + FormatBytes(bytes) +
                                    " exceeds the budget: " + FormatBytes(used) + " of " +
                                    FormatBytes(options_.budget_bytes) + " in use");
    }
    p = TakeBlock(SizeClass(bytes));
    if (p == nullptr)
      return ResourceExhaustedError("host memory exhausted allocating " + FormatBytes(bytes));
    used_.store(used + bytes);
    if (used + bytes > peak_.load()) peak_.store(used + bytes);
  }
  // Outside the lock: the block is the caller's alone now.
  if (options_.poison) std::memset(p, 0xA5, bytes);
  return p;
}

void* HostDevice::TakeBlock(uint64_t size) {
  const uint64_t budget = options_.budget_bytes;
  // 1. A cached block of this class: no syscall, no new page.
  if (auto it = cache_.find(size); it != cache_.end()) {
    void* p = it->second;
    cache_.erase(it);
    return p;  // reserved_ already counts it
  }
  const bool room = reserved_.load() <= budget && size <= budget - reserved_.load();
  if (!room && IsMapped(size)) {
    // 2. No room for a new block: cut a cached mapping of at most twice the size down to this one
    //    (its pages stay; the tail goes back to the system). A much larger one is left for a
    //    request of its own size, whose pages it would otherwise have to touch anew.
    if (auto it = cache_.lower_bound(size); it != cache_.end() && it->first / 2 <= size) {
      const auto [have, p] = *it;
      cache_.erase(it);
      if (have > size) munmap(static_cast<char*>(p) + size, have - size);
      reserved_.fetch_sub(have - size);
      return p;
    }
    // 3. Grow the largest smaller cached mapping: mremap moves its pages, only the tail is new.
    if (auto it = cache_.lower_bound(size);
        it != cache_.begin() && IsMapped(std::prev(it)->first)) {
      --it;
      const auto [have, p] = *it;
      cache_.erase(it);
      ReleaseCached(size - have);
      void* q = mremap(p, have, size, MREMAP_MAYMOVE);
      if (q != MAP_FAILED) {
        reserved_.fetch_add(size - have);
        return q;
      }
      munmap(p, have);  // could not grow it (address space): start over with a new mapping
      reserved_.fetch_sub(have);
    }
  }
  // 4. A new block, after releasing cached ones to make room.
  ReleaseCached(size);
  // Large blocks are mapped for themselves, as a GPU's memory is apart from the host heap: when
  // released they go back to the system at once instead of staying in glibc's heap (whose mmap
  // threshold rises as large blocks are freed), so the emulated device never holds more host
  // memory than its budget (tests/integration/hf_rss_test.cc).
  void* p = IsMapped(size) ? MapFresh(size) : std::aligned_alloc(256, size);
  if (p == nullptr && !cache_.empty()) {  // the system is short of memory: give back the cache
    ReleaseCached(std::numeric_limits<uint64_t>::max());
    p = IsMapped(size) ? MapFresh(size) : std::aligned_alloc(256, size);
  }
  if (p != nullptr) reserved_.fetch_add(size);
  return p;
}

void HostDevice::ReleaseCached(uint64_t extra) {
  const uint64_t budget = options_.budget_bytes;
  while (!cache_.empty() && (reserved_.load() > budget || extra > budget - reserved_.load())) {
    const auto [size, p] = *cache_.begin();
    cache_.erase(cache_.begin());
    ReleaseBlock(p, size);
    reserved_.fetch_sub(size);
  }
}

void HostDevice::FreeRaw(void* ptr, uint64_t bytes) {
  if (options_.poison) std::memset(ptr, 0xDD, bytes);
  MutexLock lock(&alloc_mu_);
  used_.fetch_sub(bytes);
  cache_.emplace(SizeClass(bytes), ptr);
  // Live blocks rounded to their classes may alone exceed the budget by a little; then the cache
  // keeps nothing.
  ReleaseCached(0);
}

Result<std::unique_ptr<Stream>> HostDevice::CreateStream(std::string_view name) {
  return std::unique_ptr<Stream>(std::make_unique<HostStream>(std::string(name)));
}

Status HostDevice::CopyAsync(void* dst, const void* src, uint64_t bytes, CopyKind kind,
                             Stream& stream) {
  if (bytes > 0 && (dst == nullptr || src == nullptr)) {
    return InvalidArgumentError("CopyAsync of " + FormatBytes(bytes) + " with a null pointer");
  }
  const uint32_t delay_us = options_.copy_delay_us;
  const double rate = options_.copy_bytes_per_second;
  AsHost(stream).Enqueue([=](const Status& sticky) {
    if (!sticky.ok()) return Status::Ok();  // a failed stream runs no more copies
    Stopwatch watch;
    if (delay_us) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    std::memcpy(dst, src, bytes);
    if (rate > 0) {
      const double target = static_cast<double>(bytes) / rate;
      const double left = target - watch.Seconds();
      if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
    }
    return Status::Ok();
  });
  return Status::Ok();
}

Status HostDevice::LaunchHostFunc(Stream& stream, std::function<void()> fn) {
  AsHost(stream).Enqueue([fn = std::move(fn)](const Status&) {
    fn();
    return Status::Ok();
  });
  return Status::Ok();
}

Result<Event> HostDevice::RecordEvent(Stream& stream) {
  auto state = std::make_shared<HostEventState>();
  AsHost(stream).Enqueue([state](const Status& sticky) {
    state->Complete(sticky);
    return Status::Ok();
  });
  return Event(state);
}

Status HostDevice::StreamWaitEvent(Stream& stream, const Event& event) {
  AsHost(stream).Enqueue([event](const Status&) { return event.Wait(); });
  return Status::Ok();
}

Status HostDevice::Synchronize(Stream& stream) {
  STRATA_ASSIGN_OR_RETURN(Event e, RecordEvent(stream));
  return e.Wait();
}

}  // namespace strata
