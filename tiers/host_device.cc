// HostDevice. Each HostStream owns a worker thread and a FIFO of tasks. A task returns a Status;
// the first failure becomes the stream's sticky error, which every later event on the stream
// reports (CUDA's behaviour after a failed async operation). Events are completion flags with a
// condition variable; StreamWaitEvent enqueues a task that blocks the worker on another stream's
// event, which orders the streams without blocking the caller.
#include "tiers/host_device.h"

#include <sys/mman.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/logging.h"

namespace strata {
namespace {

// Device blocks this large get their own mapping (HostDevice::AllocateRaw).
constexpr uint64_t kMapThreshold = uint64_t{1} << 20;

class HostEventState final : public EventState {
 public:
  bool Query() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  Status Wait() const override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return status_;
  }
  void Complete(Status status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = std::move(status);
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

class HostStream final : public Stream {
 public:
  explicit HostStream(std::string name) : name_(std::move(name)), worker_([this] { Run(); }) {}

  ~HostStream() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();  // drains the queue first
  }

  std::string_view name() const override { return name_; }

  // The task receives the stream's sticky error so far and returns its own result.
  void Enqueue(std::function<Status(const Status& sticky)> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void Run() {
    Status sticky;
    for (;;) {
      std::function<Status(const Status&)> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      Status s = task(sticky);
      if (!s.ok() && sticky.ok()) sticky = std::move(s);
    }
  }

  const std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<Status(const Status&)>> queue_;
  bool stopping_ = false;
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
}

DeviceInfo HostDevice::info() const {
  return DeviceInfo{"host-emulated", options_.budget_bytes, options_.budget_bytes};
}

Result<void*> HostDevice::AllocateRaw(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  const uint64_t used = used_.load();
  if (bytes > options_.budget_bytes || used > options_.budget_bytes - bytes) {
    return ResourceExhaustedError("device (host-emulated) allocation of " + FormatBytes(bytes) +
                                  " exceeds the budget: " + FormatBytes(used) + " of " +
                                  FormatBytes(options_.budget_bytes) + " in use");
  }
  // Large blocks are mapped for themselves, as a GPU's memory is apart from the host heap: freed,
  // they go back to the system at once instead of staying in glibc's heap (whose mmap threshold
  // rises as large blocks are freed), so the emulated device never inflates host memory beyond
  // what it holds now (tests/integration/hf_rss_test.cc).
  void* p = nullptr;
  if (bytes >= kMapThreshold) {
    p = mmap(nullptr, AlignUp(bytes, 4096), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
             -1, 0);
    if (p == MAP_FAILED) p = nullptr;
  } else {
    p = std::aligned_alloc(256, AlignUp(bytes, 256));
  }
  if (p == nullptr)
    return ResourceExhaustedError("host memory exhausted allocating " + FormatBytes(bytes));
  if (options_.poison) std::memset(p, 0xA5, bytes);
  used_.store(used + bytes);
  if (used + bytes > peak_.load()) peak_.store(used + bytes);
  return p;
}

void HostDevice::FreeRaw(void* ptr, uint64_t bytes) {
  if (options_.poison) std::memset(ptr, 0xDD, bytes);
  if (bytes >= kMapThreshold) {
    munmap(ptr, AlignUp(bytes, 4096));
  } else {
    std::free(ptr);
  }
  std::lock_guard<std::mutex> lock(alloc_mu_);
  used_.fetch_sub(bytes);
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
