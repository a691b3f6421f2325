// The shared I/O engine behind the uring, aio and posix backends.
//
// Algorithm. Submit validates a request, cuts it into ceil(length / block_size) pieces and hands
// them round-robin to the W = intra_op_parallelism workers (a global counter picks the first
// worker, so single-piece requests spread too). Each worker owns a Ring, a FIFO of pending pieces
// and one completion thread. Under the worker's lock, Pump moves pending pieces into the ring
// while fewer than queue_depth are in flight (with overlap_events off, only when none is in
// flight: batches), then flushes them with one submission (or one per piece with single_submit).
// The completion thread blocks in Ring::Wait while something is submitted, runs each result
// through AdvanceTransfer (done / continue the short remainder / retry EINTR-EAGAIN / fail),
// requeues continuations at the front of the FIFO, and pumps again. When the last piece of a
// request finishes, the request's callback runs once with the first error (if any) and the bytes
// moved, then its ticket is completed. The destructor waits until every accepted request has
// completed, then stops and joins the completion threads.
//
// Two counters per worker: `inflight` (pieces holding a queue_depth slot, including ones whose
// submission failed and that are being failed on the submitting thread) and `submitted` (pieces
// the ring will report through Wait). The completion thread only waits in the kernel while
// `submitted` > 0, so it can always be woken by the condition variable for shutdown.
#include "swap/io_engine.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <deque>
#include <thread>

#include "base/logging.h"
#include "base/mutex.h"
#include "swap/direct_io.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace strata::internal {
namespace {

// A piece goes to the kernel (Prepare) and comes back from the ring's completion queue on another
// thread: the kernel orders the two, but ThreadSanitizer cannot see it and would report the
// completion thread's read of the piece as a race with its submitter. These tell it.
void HandToKernel([[maybe_unused]] void* piece) {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(piece);
#endif
}
void TakeFromKernel([[maybe_unused]] void* piece) {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(piece);
#endif
}

}  // namespace

std::string PathOfFd(int fd) {
  char link[64];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  char target[PATH_MAX];
  const ssize_t n = readlink(link, target, sizeof(target) - 1);
  if (n <= 0) return "fd " + std::to_string(fd);
  return std::string(target, static_cast<size_t>(n));
}

std::string DescribeTransfer(IoOp op, int fd, uint64_t offset, size_t length) {
  std::string out(IoOpName(op));
  out += ' ';
  out += PathOfFd(fd);
  out += " offset ";
  out += std::to_string(offset);
  out += " length ";
  out += std::to_string(length);
  return out;
}

Step AdvanceTransfer(Transfer& t, int64_t res, Status* error, std::string_view note) {
  if (res > 0) {
    if (static_cast<uint64_t>(res) > t.remaining()) {
      *error =
          InternalError(DescribeTransfer(t.op, t.fd, t.next_offset(), t.remaining()) +
                        ": backend reported " + std::to_string(res) + " bytes" + std::string(note));
      return Step::kFailed;
    }
    t.done += static_cast<size_t>(res);
    return t.done == t.length ? Step::kDone : Step::kContinue;
  }
  if (res == 0) {
    if (t.op == IoOp::kRead) {
      struct stat st {};
      std::string size = fstat(t.fd, &st) == 0 ? std::to_string(st.st_size) : "unknown";
      *error = OutOfRangeError(DescribeTransfer(t.op, t.fd, t.offset, t.length) +
                               ": unexpected end of file after " + std::to_string(t.done) +
                               " bytes (file size " + size + ")" + std::string(note));
      return Step::kFailed;
    }
    if (++t.retries > kMaxRetries) {
      *error = IoErrorFromErrno(EIO, DescribeTransfer(t.op, t.fd, t.next_offset(), t.remaining()) +
                                         ": no progress after " + std::to_string(kMaxRetries) +
                                         " attempts" + std::string(note));
      return Step::kFailed;
    }
    return Step::kContinue;
  }
  const int err = static_cast<int>(-res);
  if (err == EINTR || err == EAGAIN) {
    if (++t.retries > kMaxRetries) {
      *error = IoErrorFromErrno(err, DescribeTransfer(t.op, t.fd, t.next_offset(), t.remaining()) +
                                         " (still failing after " + std::to_string(kMaxRetries) +
                                         " retries)" + std::string(note));
      return Step::kFailed;
    }
    return Step::kContinue;
  }
  *error = IoErrorFromErrno(
      err, DescribeTransfer(t.op, t.fd, t.next_offset(), t.remaining()) + std::string(note));
  return Step::kFailed;
}

Status ValidateRequest(const IoRequest& request, uint32_t alignment) {
  if (request.fd < 0) {
    return InvalidArgumentError(std::string(IoOpName(request.op)) + ": invalid file descriptor " +
                                std::to_string(request.fd));
  }
  if (request.buffer.data() == nullptr && !request.buffer.empty()) {
    return InvalidArgumentError(std::string(IoOpName(request.op)) + ": null buffer");
  }
  const int flags = fcntl(request.fd, F_GETFL);
  if (flags < 0) {
    const int err = errno;  // before DescribeTransfer's readlink can change it
    return IoErrorFromErrno(
        err, DescribeTransfer(request.op, request.fd, request.offset, request.buffer.size()));
  }
  if ((flags & O_DIRECT) != 0) {
    Status st = CheckDirectAlignment(request.buffer.data(), request.offset, request.buffer.size(),
                                     alignment);
    if (!st.ok()) {
      return std::move(st).WithContext(
          DescribeTransfer(request.op, request.fd, request.offset, request.buffer.size()) +
          ": O_DIRECT");
    }
  }
  return Status::Ok();
}

namespace {

struct RequestState;

struct Piece {
  Transfer t;
  RequestState* request = nullptr;
};

struct RequestState {
  IoRequest request;
  std::shared_ptr<TicketState> ticket;
  std::vector<Piece> pieces;
  std::atomic<size_t> remaining{0};
  std::atomic<size_t> bytes{0};
  Mutex error_mu;
  Status error GUARDED_BY(error_mu);  // the first error of any piece
};

class RingEngine final : public IoBackend {
 public:
  RingEngine(std::string name, const IoOptions& options, IoCapabilities capabilities)
      : name_(std::move(name)), options_(options), capabilities_(capabilities) {}

  ~RingEngine() override {
    {
      MutexLock lock(&drain_mu_);
      shutting_down_ = true;
      while (outstanding_ != 0) drain_cv_.Wait(&drain_mu_);
    }
    for (auto& w : workers_) {
      {
        MutexLock lock(&w->mu);
        w->stop = true;
      }
      w->cv.SignalAll();
    }
    for (auto& w : workers_) {
      if (w->thread.joinable()) w->thread.join();
    }
  }

  Status Start(const RingFactory& factory) {
    for (uint32_t i = 0; i < options_.intra_op_parallelism; ++i) {
      auto w = std::make_unique<Worker>();
      STRATA_ASSIGN_OR_RETURN(w->ring, factory(options_));
      workers_.push_back(std::move(w));
    }
    for (auto& w : workers_) {
      Worker* raw = w.get();
      raw->thread = std::thread([this, raw] { CompletionLoop(*raw); });
    }
    return Status::Ok();
  }

  std::string_view name() const override { return name_; }
  IoCapabilities capabilities() const override { return capabilities_; }
  const IoOptions& options() const override { return options_; }

  IoTicket Submit(IoRequest request) override {
    Status st = ValidateRequest(request, options_.alignment);
    if (!st.ok()) return CompleteNow(request, std::move(st), 0);
    if (request.buffer.empty()) return CompleteNow(request, Status::Ok(), 0);
    {
      MutexLock lock(&drain_mu_);
      if (shutting_down_) {
        return CompleteNow(request, FailedPreconditionError("io backend is shutting down"), 0);
      }
      ++outstanding_;
    }

    auto* r = new RequestState;
    r->ticket = NewTicketState();
    IoTicket ticket(r->ticket);
    const uint64_t length = request.buffer.size();
    const uint64_t block = options_.block_size;
    const size_t n = static_cast<size_t>((length + block - 1) / block);
    r->pieces.resize(n);
    r->remaining.store(n, std::memory_order_relaxed);
    for (size_t i = 0; i < n; ++i) {
      Piece& p = r->pieces[i];
      p.request = r;
      p.t.op = request.op;
      p.t.fd = request.fd;
      p.t.offset = request.offset + i * block;
      p.t.data = request.buffer.data() + i * block;
      p.t.length = static_cast<size_t>(std::min<uint64_t>(block, length - i * block));
    }
    r->request = std::move(request);

    const size_t workers = workers_.size();
    const size_t first = next_worker_.fetch_add(n, std::memory_order_relaxed);
    // `r` may be freed by a completion thread as soon as its last piece is handed over, so the
    // loop reads `r` only under the lock of the worker receiving pieces (before the last hand-over
    // completes) and afterwards touches only pieces that failed to submit (still unfinished).
    std::vector<RingCompletion> failed;
    for (size_t k = 0; k < std::min(n, workers); ++k) {
      Worker& w = *workers_[(first + k) % workers];
      {
        MutexLock lock(&w.mu);
        for (size_t i = k; i < n; i += workers) w.pending.push_back(&r->pieces[i]);
        Pump(w, &failed);
      }
      if (!failed.empty()) {
        ProcessCompletions(w, &failed, /*from_ring=*/false);
      }
    }
    return ticket;
  }

  Status RegisterBuffers(std::span<const std::span<std::byte>> regions) override {
    STRATA_RETURN_IF_ERROR(CheckIdle("RegisterBuffers"));
    for (auto& w : workers_) STRATA_RETURN_IF_ERROR(w->ring->RegisterBuffers(regions));
    return Status::Ok();
  }
  Status RegisterFiles(std::span<const int> fds) override {
    STRATA_RETURN_IF_ERROR(CheckIdle("RegisterFiles"));
    for (auto& w : workers_) STRATA_RETURN_IF_ERROR(w->ring->RegisterFiles(fds));
    return Status::Ok();
  }

 private:
  struct Worker {
    std::unique_ptr<Ring> ring;
    Mutex mu;
    CondVar cv;  // the completion thread waits for submitted > 0 or stop
    std::deque<Piece*> pending GUARDED_BY(mu);
    uint32_t inflight GUARDED_BY(mu) = 0;   // pieces holding a queue slot
    uint32_t submitted GUARDED_BY(mu) = 0;  // pieces the ring will report through Wait
    bool stop GUARDED_BY(mu) = false;
    std::thread thread;
  };

  Status CheckIdle(const char* what) EXCLUDES(drain_mu_) {
    // A request's ticket becomes ready just before the engine stops counting it, so a caller that
    // waited for all its tickets may still see a few outstanding for a moment: allow for that.
    MutexLock lock(&drain_mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (outstanding_ != 0 && drain_cv_.WaitUntil(&drain_mu_, deadline)) {
    }
    if (outstanding_ != 0) {
      return FailedPreconditionError(std::string(what) + " with " + std::to_string(outstanding_) +
                                     " requests in flight");
    }
    return Status::Ok();
  }

  // Moves pending pieces into the ring within the queue depth and submits them. Pieces the ring
  // could not submit are appended to `failed` (still counted in inflight).
  void Pump(Worker& w, std::vector<RingCompletion>* failed) REQUIRES(w.mu) {
    if (!options_.overlap_events && w.inflight > 0) return;
    const size_t failed_before = failed->size();
    uint32_t prepared = 0;
    uint32_t prepare_failures = 0;
    while (w.inflight < options_.queue_depth && !w.pending.empty()) {
      Piece* p = w.pending.front();
      w.pending.pop_front();
      ++w.inflight;
      Status st = w.ring->Prepare(p->t.op, p->t.fd, p->t.next_offset(), p->t.next_data(),
                                  p->t.remaining(), p);
      HandToKernel(p);  // after Prepare read it, before Flush submits it
      if (!st.ok()) {
        failed->push_back({p, -(st.sys_errno() != 0 ? st.sys_errno() : EIO)});
        ++prepare_failures;
        continue;
      }
      ++prepared;
      if (options_.single_submit) w.ring->Flush(failed);
    }
    if (prepared > 0 && !options_.single_submit) w.ring->Flush(failed);
    // Pieces that failed to flush were prepared but will not be reported by Wait.
    const auto flush_failures =
        static_cast<uint32_t>(failed->size() - failed_before) - prepare_failures;
    w.submitted += prepared - flush_failures;
    if (w.submitted > 0) w.cv.Signal();
  }

  // Handles results: finishes, fails or requeues each piece, then refills the ring. Loops while
  // refilling produces immediate failures. `from_ring`: the results came from Ring::Wait.
  void ProcessCompletions(Worker& w, std::vector<RingCompletion>* results, bool from_ring) {
    std::vector<Piece*> requeue;
    std::vector<RingCompletion> next;
    while (!results->empty()) {
      requeue.clear();
      for (const RingCompletion& c : *results) {
        Piece* p = static_cast<Piece*>(c.tag);
        TakeFromKernel(p);
        Status error;
        switch (AdvanceTransfer(p->t, c.res, &error)) {
          case Step::kDone:
            FinishPiece(p, Status::Ok());
            break;
          case Step::kContinue:
            if (c.res < 0 && p->t.retries > 2) {
              std::this_thread::sleep_for(
                  std::chrono::microseconds(std::min<uint32_t>(2000, 50 * p->t.retries)));
            }
            requeue.push_back(p);
            break;
          case Step::kFailed:
            FinishPiece(p, std::move(error));
            break;
        }
      }
      next.clear();
      {
        MutexLock lock(&w.mu);
        w.inflight -= static_cast<uint32_t>(results->size());
        if (from_ring) w.submitted -= static_cast<uint32_t>(results->size());
        for (auto it = requeue.rbegin(); it != requeue.rend(); ++it) w.pending.push_front(*it);
        Pump(w, &next);
      }
      results->swap(next);
      from_ring = false;
    }
  }

  void CompletionLoop(Worker& w) {
    std::vector<RingCompletion> results;
    results.reserve(options_.queue_depth);
    for (;;) {
      {
        MutexLock lock(&w.mu);
        while (w.submitted == 0 && !w.stop) w.cv.Wait(&w.mu);
        if (w.submitted == 0) return;  // stop requested and nothing left in the ring
      }
      results.clear();
      Status st = w.ring->Wait(&results, options_.queue_depth);
      if (!st.ok()) {
        STRATA_LOG(kError) << "io backend " << name_
                           << ": waiting for completions failed: " << st.ToString() << "; retrying";
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      ProcessCompletions(w, &results, /*from_ring=*/true);
    }
  }

  void FinishPiece(Piece* p, Status status) {
    RequestState* r = p->request;
    if (!status.ok()) {
      MutexLock lock(&r->error_mu);
      if (r->error.ok()) r->error = std::move(status);
    }
    r->bytes.fetch_add(p->t.done, std::memory_order_relaxed);
    if (r->remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    // Last piece: complete the request exactly once.
    Status final_status;
    {
      MutexLock lock(&r->error_mu);
      final_status = std::move(r->error);
    }
    const size_t bytes = r->bytes.load(std::memory_order_relaxed);
    if (r->request.done) r->request.done(final_status, bytes);
    CompleteTicket(*r->ticket, std::move(final_status), bytes);
    delete r;
    MutexLock lock(&drain_mu_);
    if (--outstanding_ == 0) drain_cv_.SignalAll();
  }

  const std::string name_;
  const IoOptions options_;
  const IoCapabilities capabilities_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<size_t> next_worker_{0};

  Mutex drain_mu_;
  CondVar drain_cv_;
  size_t outstanding_ GUARDED_BY(drain_mu_) = 0;  // accepted requests not yet completed
  bool shutting_down_ GUARDED_BY(drain_mu_) = false;
};

}  // namespace

Result<std::unique_ptr<IoBackend>> MakeRingEngine(std::string name, const IoOptions& options,
                                                  IoCapabilities capabilities,
                                                  const RingFactory& factory) {
  STRATA_RETURN_IF_ERROR(ValidateIoOptions(options));
  if (options.queue_depth > capabilities.max_queue_depth) {
    return InvalidArgumentError("io backend " + name + ": queue_depth " +
                                std::to_string(options.queue_depth) + " exceeds its maximum " +
                                std::to_string(capabilities.max_queue_depth));
  }
  auto engine = std::make_unique<RingEngine>(std::move(name), options, capabilities);
  STRATA_RETURN_IF_ERROR(engine->Start(factory));
  return std::unique_ptr<IoBackend>(std::move(engine));
}

}  // namespace strata::internal
