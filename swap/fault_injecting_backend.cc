// FaultInjectingBackend: see the header for the faults.
//
// Algorithm. A request with no rule is forwarded as is. A faulted request becomes an Op holding a
// Transfer (io_engine.h). Attempt() decides what the next attempt does: forward some or all of the
// remaining bytes to the inner backend (a real transfer), or produce an injected result (-EIO,
// -ENOSPC, -EAGAIN, 0) without I/O. Either way the result goes to OnResult, which applies the
// shared AdvanceTransfer: done finishes the request, continue calls Attempt again, failed finishes
// it with the error. Injected results and delays are handed to one timer thread (a deadline-ordered
// queue), so callbacks never run inside Submit and Attempt never recurses. A flipped write points
// its Transfer at a private copy of the request's bytes (with the bit flipped), so every attempt
// writes from the copy; a flipped read flips the bit in the caller's buffer once the read is done.
//
// Counting: one counter per (direction filter, file prefix) pair, each advanced for every request
// it matches; a rule is keyed by its pair and index. The file name of a request's fd is looked up
// (readlink) only while some rule names a file.
#include "swap/fault_injecting_backend.h"

#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "base/mutex.h"
#include "swap/direct_io.h"
#include "swap/io_engine.h"

namespace strata {

std::string_view FaultKindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kEio:
      return "eio";
    case FaultKind::kEnospc:
      return "enospc";
    case FaultKind::kEagain:
      return "eagain";
    case FaultKind::kShortTransfer:
      return "short";
    case FaultKind::kEof:
      return "eof";
    case FaultKind::kLatency:
      return "latency";
    case FaultKind::kFlip:
      return "flip";
  }
  return "unknown";
}

struct FaultInjectingBackend::Impl {
  struct Op {
    IoRequest request;
    std::shared_ptr<internal::TicketState> ticket;
    internal::Transfer t;
    FaultRule rule;
    uint32_t affected = 0;
    bool delayed = false;
    AlignedBuffer flipped;  // kFlip on a write: the bytes that go to disk instead
  };
  struct Timed {
    std::chrono::steady_clock::time_point when;
    Op* op;
    bool deliver;  // true: deliver `res` as an injected result; false: run Attempt
    int64_t res;
  };

  explicit Impl(IoBackend* inner) : inner(inner) {
    timer = std::thread([this] { TimerLoop(); });
  }

  ~Impl() {
    {
      MutexLock lock(&mu);
      while (outstanding != 0) drain_cv.Wait(&mu);
      stop = true;
      timer_cv.SignalAll();
    }
    timer.join();
  }

  void Schedule(Op* op, std::chrono::microseconds delay, bool deliver, int64_t res) {
    {
      MutexLock lock(&mu);
      ++injected;
      queue.emplace(std::chrono::steady_clock::now() + delay, Timed{{}, op, deliver, res});
    }
    timer_cv.SignalAll();
  }

  void TimerLoop() EXCLUDES(mu) {
    MutexLock lock(&mu);
    for (;;) {
      if (queue.empty()) {
        if (stop) return;
        timer_cv.Wait(&mu);
        continue;
      }
      auto it = queue.begin();
      if (it->first > std::chrono::steady_clock::now()) {
        (void)timer_cv.WaitUntil(&mu, it->first);
        continue;
      }
      Timed item = it->second;
      queue.erase(it);
      lock.Unlock();
      if (item.deliver) {
        OnResult(item.op, item.res, /*injected=*/true);
      } else {
        Attempt(item.op);
      }
      lock.Lock();
    }
  }

  void Forward(Op* op, size_t length) {
    IoRequest piece;
    piece.op = op->t.op;
    piece.fd = op->t.fd;
    piece.offset = op->t.next_offset();
    piece.buffer = std::span<std::byte>(op->t.next_data(), length);
    piece.done = [this, op](Status st, size_t bytes) {
      if (!st.ok()) {
        op->t.done += bytes;
        Finish(op, std::move(st));
        return;
      }
      OnResult(op, static_cast<int64_t>(bytes), /*injected=*/false);
    };
    inner->Submit(std::move(piece));
  }

  void Attempt(Op* op) {
    const FaultRule& r = op->rule;
    const size_t remaining = op->t.remaining();
    switch (r.kind) {
      case FaultKind::kLatency:
        if (!op->delayed) {
          op->delayed = true;
          Schedule(op, r.latency, /*deliver=*/false, 0);
          return;
        }
        break;
      case FaultKind::kEio:
      case FaultKind::kEnospc:
        if (op->t.done < r.after_bytes) {
          Forward(op,
                  static_cast<size_t>(std::min<uint64_t>(remaining, r.after_bytes - op->t.done)));
        } else {
          Schedule(op, {}, true, r.kind == FaultKind::kEio ? -EIO : -ENOSPC);
        }
        return;
      case FaultKind::kEagain:
        if (op->affected < r.times) {
          ++op->affected;
          Schedule(op, {}, true, -EAGAIN);
          return;
        }
        break;
      case FaultKind::kShortTransfer:
        if (op->affected < r.times && r.short_bytes < remaining && r.short_bytes > 0) {
          ++op->affected;
          {
            MutexLock lock(&mu);
            ++injected;
          }
          Forward(op, static_cast<size_t>(r.short_bytes));
          return;
        }
        break;
      case FaultKind::kEof:
        if (op->affected == 0) {
          ++op->affected;
          Schedule(op, {}, true, op->t.op == IoOp::kRead ? 0 : -EIO);
          return;
        }
        break;
      case FaultKind::kFlip:
        break;  // set up in Submit (write) or applied in Finish (read)
    }
    Forward(op, remaining);
  }

  // Flips the rule's bit of `bytes` (the last bit if the rule's is past the end).
  static void FlipBit(std::span<std::byte> bytes, uint64_t bit) {
    if (bytes.empty()) return;
    bit = std::min<uint64_t>(bit, bytes.size() * 8 - 1);
    bytes[bit / 8] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
  }

  // kFlip on a write: the Transfer writes from a private copy with the bit flipped.
  Status PrepareFlippedWrite(Op* op, uint32_t alignment) {
    Result<AlignedBuffer> copy = AlignedBuffer::Allocate(op->t.length, alignment);
    if (!copy.ok()) return copy.status().WithContext("copying a write to flip a bit in it");
    op->flipped = std::move(copy).value();
    std::memcpy(op->flipped.data(), op->t.data, op->t.length);
    FlipBit(op->flipped.span(), op->rule.flip_bit);
    op->t.data = op->flipped.data();
    MutexLock lock(&mu);
    ++injected;
    return Status::Ok();
  }

  void OnResult(Op* op, int64_t res, bool injected_result) {
    Status error;
    switch (internal::AdvanceTransfer(op->t, res, &error, injected_result ? " [injected]" : "")) {
      case internal::Step::kDone:
        Finish(op, Status::Ok());
        return;
      case internal::Step::kContinue:
        Attempt(op);
        return;
      case internal::Step::kFailed:
        Finish(op, std::move(error));
        return;
    }
  }

  void Finish(Op* op, Status status) {
    if (status.ok() && op->rule.kind == FaultKind::kFlip && op->t.op == IoOp::kRead) {
      FlipBit(op->request.buffer, op->rule.flip_bit);
      MutexLock lock(&mu);
      ++injected;
    }
    if (op->request.done) op->request.done(status, op->t.done);
    internal::CompleteTicket(*op->ticket, std::move(status), op->t.done);
    delete op;
    Release();
  }

  void Release() {
    MutexLock lock(&mu);
    if (--outstanding == 0) drain_cv.SignalAll();
  }

  IoBackend* inner;
  Mutex mu;
  CondVar drain_cv;
  CondVar timer_cv;
  // A counter: (direction filter, file prefix). Direction 0 numbers every request, 1 the reads,
  // 2 the writes; an empty prefix matches every file.
  static int Counter(const std::optional<IoOp>& op) { return op ? 1 + static_cast<int>(*op) : 0; }
  using CounterKey = std::pair<int, std::string>;
  using RuleKey = std::tuple<int, std::string, uint64_t>;
  std::map<RuleKey, FaultRule> rules GUARDED_BY(mu);
  std::multimap<std::chrono::steady_clock::time_point, Timed> queue GUARDED_BY(mu);
  uint64_t next_request GUARDED_BY(mu) = 0;
  std::map<CounterKey, uint64_t> next_of GUARDED_BY(mu);
  std::set<std::string> files GUARDED_BY(mu);  // prefixes named by rules so far
  uint64_t injected GUARDED_BY(mu) = 0;
  size_t outstanding GUARDED_BY(mu) = 0;
  bool stop GUARDED_BY(mu) = false;
  std::thread timer;
};

FaultInjectingBackend::FaultInjectingBackend(std::unique_ptr<IoBackend> inner,
                                             std::vector<FaultRule> rules)
    : inner_(std::move(inner)),
      name_("fault(" + std::string(inner_->name()) + ")"),
      impl_(std::make_unique<Impl>(inner_.get())) {
  for (const FaultRule& r : rules) AddRule(r);
}

FaultInjectingBackend::~FaultInjectingBackend() {
  impl_.reset();  // drains our requests while the inner backend still exists
}

void FaultInjectingBackend::AddRule(const FaultRule& rule) {
  MutexLock lock(&impl_->mu);
  impl_->rules[{Impl::Counter(rule.op), rule.file, rule.request}] = rule;
  if (!rule.file.empty()) impl_->files.insert(rule.file);
}

uint64_t FaultInjectingBackend::requests() const {
  MutexLock lock(&impl_->mu);
  return impl_->next_request;
}

uint64_t FaultInjectingBackend::injected() const {
  MutexLock lock(&impl_->mu);
  return impl_->injected;
}

IoTicket FaultInjectingBackend::Submit(IoRequest request) {
  bool named_files;
  {
    MutexLock lock(&impl_->mu);
    named_files = !impl_->files.empty();
  }
  std::string file;  // the basename of the request's file, when some rule filters by file
  if (named_files) {
    file = internal::PathOfFd(request.fd);
    file.erase(0, file.rfind('/') + 1);
  }
  bool has_rule = false;
  FaultRule rule;
  {
    MutexLock lock(&impl_->mu);
    ++impl_->next_request;
    // Every counter this request matches advances; the first rule found for it applies.
    auto count = [&](int counter, const std::string& prefix) REQUIRES(impl_->mu) {
      const uint64_t index = impl_->next_of[{counter, prefix}]++;
      if (has_rule) return;
      auto it = impl_->rules.find({counter, prefix, index});
      if (it == impl_->rules.end()) return;
      has_rule = true;
      rule = it->second;
      impl_->rules.erase(it);
    };
    const int by_op = Impl::Counter(request.op);
    count(0, "");
    count(by_op, "");
    for (const std::string& prefix : impl_->files) {
      if (!file.starts_with(prefix)) continue;
      count(0, prefix);
      count(by_op, prefix);
    }
  }
  if (!has_rule) return inner_->Submit(std::move(request));

  Status st = internal::ValidateRequest(request, inner_->options().alignment);
  if (!st.ok()) return internal::CompleteNow(request, std::move(st), 0);
  if (request.buffer.empty()) return internal::CompleteNow(request, Status::Ok(), 0);

  auto* op = new Impl::Op;
  op->ticket = internal::NewTicketState();
  IoTicket ticket(op->ticket);
  op->t.op = request.op;
  op->t.fd = request.fd;
  op->t.offset = request.offset;
  op->t.data = request.buffer.data();
  op->t.length = request.buffer.size();
  op->rule = rule;
  op->request = std::move(request);
  {
    MutexLock lock(&impl_->mu);
    ++impl_->outstanding;
  }
  if (rule.kind == FaultKind::kFlip && op->t.op == IoOp::kWrite) {
    Status flipped = impl_->PrepareFlippedWrite(op, inner_->options().alignment);
    if (!flipped.ok()) {
      impl_->Finish(op, std::move(flipped));  // on this thread, as for a rejected request
      return ticket;
    }
  }
  impl_->Attempt(op);
  return ticket;
}

}  // namespace strata
