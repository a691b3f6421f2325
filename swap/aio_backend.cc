// The libaio backend: one io_context_t per intra-op worker (see io_engine.cc for the engine).
//
// Each context is created with io_setup(queue_depth) and owns queue_depth iocbs on a free list.
// Prepare fills an iocb (pread/pwrite) and stages it; Flush hands the staged iocbs to io_submit,
// which may accept fewer than given: the rest are resubmitted, EAGAIN is retried with a short
// sleep, and an iocb the kernel rejects outright (e.g. EBADF, EINVAL) is reported as a failed
// completion with that errno while the ones after it are still submitted. Wait calls
// io_getevents(min 1) and turns each event's `res` (bytes or -errno) into a RingCompletion.
// Unlike DeepSpeed, every event's result is checked by the engine.
#include <libaio.h>

#include <cerrno>
#include <thread>

#include "base/mutex.h"
#include "swap/io_engine.h"

namespace strata::internal {
namespace {

class AioRing final : public Ring {
 public:
  ~AioRing() override {
    if (ctx_ != nullptr) io_destroy(ctx_);
  }

  Status Init(uint32_t depth) {
    const int rc = io_setup(static_cast<int>(depth), &ctx_);
    if (rc < 0) {
      ctx_ = nullptr;
      return IoErrorFromErrno(
          -rc, "io_setup(" + std::to_string(depth) + ") (see /proc/sys/fs/aio-max-nr)");
    }
    iocbs_.resize(depth);
    events_.resize(depth);
    MutexLock lock(&free_mu_);
    for (auto& cb : iocbs_) free_.push_back(&cb);
    return Status::Ok();
  }

  Status Prepare(IoOp op, int fd, uint64_t offset, std::byte* data, size_t length,
                 void* tag) override {
    iocb* cb;
    {
      MutexLock lock(&free_mu_);
      if (free_.empty()) return InternalError("libaio: more than queue_depth operations prepared");
      cb = free_.back();
      free_.pop_back();
    }
    if (op == IoOp::kRead) {
      io_prep_pread(cb, fd, data, length, static_cast<long long>(offset));
    } else {
      io_prep_pwrite(cb, fd, data, length, static_cast<long long>(offset));
    }
    cb->data = tag;
    staged_.push_back(cb);
    return Status::Ok();
  }

  void Flush(std::vector<RingCompletion>* failed) override {
    size_t i = 0;
    int transient = 0;
    while (i < staged_.size()) {
      const int rc = io_submit(ctx_, static_cast<long>(staged_.size() - i), staged_.data() + i);
      if (rc > 0) {
        i += static_cast<size_t>(rc);
        transient = 0;
        continue;
      }
      if ((rc == -EAGAIN || rc == -EINTR || rc == 0) && ++transient < 10000) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        continue;
      }
      // The first iocb was rejected: fail it alone and go on with the others.
      iocb* cb = staged_[i++];
      failed->push_back({cb->data, rc < 0 ? rc : -EIO});
      Release(cb);
      transient = 0;
    }
    staged_.clear();
  }

  Status Wait(std::vector<RingCompletion>* out, size_t max) override {
    const long n_max = static_cast<long>(std::min(max, events_.size()));
    int rc;
    do {
      rc = io_getevents(ctx_, 1, n_max, events_.data(), nullptr);
    } while (rc == -EINTR);
    if (rc < 0) return IoErrorFromErrno(-rc, "io_getevents");
    for (int k = 0; k < rc; ++k) {
      const io_event& ev = events_[k];
      // res is unsigned long in the ABI; a negative errno arrives as its two's complement.
      out->push_back({ev.data, static_cast<int64_t>(static_cast<long>(ev.res))});
      Release(ev.obj);
    }
    return Status::Ok();
  }

 private:
  void Release(iocb* cb) EXCLUDES(free_mu_) {
    MutexLock lock(&free_mu_);
    free_.push_back(cb);
  }

  io_context_t ctx_ = nullptr;
  std::vector<iocb> iocbs_;
  std::vector<io_event> events_;  // used only by the completion thread
  Mutex free_mu_;
  std::vector<iocb*> free_ GUARDED_BY(free_mu_);
  std::vector<iocb*> staged_;  // prepared, not yet submitted (worker lock)
};

}  // namespace

Result<std::unique_ptr<IoBackend>> OpenAioBackend(const IoOptions& options) {
  IoCapabilities caps;
  caps.direct_io = true;
  caps.max_queue_depth = 4096;
  return MakeRingEngine("aio", options, caps,
                        [](const IoOptions& o) -> Result<std::unique_ptr<Ring>> {
                          auto ring = std::make_unique<AioRing>();
                          STRATA_RETURN_IF_ERROR(ring->Init(o.queue_depth));
                          return std::unique_ptr<Ring>(std::move(ring));
                        });
}

}  // namespace strata::internal
