// The POSIX backend: pread/pwrite on a bounded thread pool per intra-op worker.
//
// A PosixRing looks like a kernel queue to the engine (io_engine.cc): Prepare stages a job, Flush
// publishes the staged jobs to min(queue_depth, 64) I/O threads, each of which performs exactly
// one pread/pwrite attempt per job and posts (tag, bytes or -errno) to a completion list that Wait
// drains. Short transfers and EINTR/EAGAIN are handled by the engine like for io_uring and libaio,
// so the three backends share one retry and error path. Works on any filesystem, with or without
// O_DIRECT; needs no kernel feature, which makes it the last resort of "auto".
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <thread>

#include "base/mutex.h"
#include "swap/io_engine.h"

namespace strata::internal {
namespace {

class PosixRing final : public Ring {
 public:
  explicit PosixRing(uint32_t threads) {
    for (uint32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }

  ~PosixRing() override {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    jobs_cv_.SignalAll();
    for (auto& t : threads_) t.join();
  }

  Status Prepare(IoOp op, int fd, uint64_t offset, std::byte* data, size_t length,
                 void* tag) override {
    staged_.push_back({op, fd, offset, data, length, tag});
    return Status::Ok();
  }

  void Flush(std::vector<RingCompletion>* failed) override {
    if (staged_.empty()) return;
    {
      MutexLock lock(&mu_);
      for (const Job& j : staged_) jobs_.push_back(j);
    }
    if (staged_.size() == 1) {
      jobs_cv_.Signal();
    } else {
      jobs_cv_.SignalAll();
    }
    staged_.clear();
  }

  Status Wait(std::vector<RingCompletion>* out, size_t max) override {
    MutexLock lock(&mu_);
    while (done_.empty()) done_cv_.Wait(&mu_);
    size_t n = 0;
    while (!done_.empty() && n < max) {
      out->push_back(done_.front());
      done_.pop_front();
      ++n;
    }
    return Status::Ok();
  }

 private:
  struct Job {
    IoOp op;
    int fd;
    uint64_t offset;
    std::byte* data;
    size_t length;
    void* tag;
  };

  void Run() EXCLUDES(mu_) {
    for (;;) {
      Job job;
      {
        MutexLock lock(&mu_);
        while (!stop_ && jobs_.empty()) jobs_cv_.Wait(&mu_);
        if (jobs_.empty()) return;
        job = jobs_.front();
        jobs_.pop_front();
      }
      const ssize_t rc = job.op == IoOp::kRead
                             ? pread(job.fd, job.data, job.length, static_cast<off_t>(job.offset))
                             : pwrite(job.fd, job.data, job.length, static_cast<off_t>(job.offset));
      const int64_t res = rc >= 0 ? static_cast<int64_t>(rc) : -static_cast<int64_t>(errno);
      {
        MutexLock lock(&mu_);
        done_.push_back({job.tag, res});
      }
      done_cv_.Signal();
    }
  }

  std::vector<Job> staged_;  // worker lock
  Mutex mu_;
  CondVar jobs_cv_;
  CondVar done_cv_;
  std::deque<Job> jobs_ GUARDED_BY(mu_);
  std::deque<RingCompletion> done_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace

Result<std::unique_ptr<IoBackend>> OpenPosixBackend(const IoOptions& options) {
  IoCapabilities caps;
  caps.direct_io = true;
  caps.max_queue_depth = 4096;
  return MakeRingEngine("posix", options, caps,
                        [](const IoOptions& o) -> Result<std::unique_ptr<Ring>> {
                          const uint32_t threads = std::min<uint32_t>(o.queue_depth, 64);
                          return std::unique_ptr<Ring>(std::make_unique<PosixRing>(threads));
                        });
}

}  // namespace strata::internal
