// FaultInjectingBackend: wraps any IoBackend and makes chosen requests misbehave, to test that
// every fault surfaces as the right error (or is absorbed) and that no other request is harmed.
//
//   auto inner = OpenIoBackend("uring", options).value();
//   FaultInjectingBackend io(std::move(inner), {{.request = 3, .kind = FaultKind::kEio}});
//   // the 4th request submitted through `io` fails with EIO naming its file, offset and length.
//
// Requests are numbered 0, 1, 2... in the order Submit accepts them (rejected requests included);
// a rule with `op` set counts only the requests of that direction (its 0, 1, 2... are the reads,
// or the writes), for tests that know "the 5th read" but not how writes interleave with it. A rule
// with `file` set counts only the requests whose fd's file name (basename, found through /proc)
// starts with it, e.g. "optimizer" for a SwapSpace's optimizer.swp; those are counted from the
// time the first rule naming that `file` was added.
// A request without a rule is passed to the inner backend unchanged. A request with a rule is
// served attempt by attempt, like a device, and each attempt's result goes through the same
// AdvanceTransfer (swap/io_engine.h) as the real backends, so:
//   kEio, kEnospc   fail the request with that errno once `after_bytes` bytes have really been
//                   transferred (0: at the first attempt); the callback reports those bytes.
//   kEagain         the first `times` attempts return EAGAIN; the request is retried and succeeds
//                   (with times > kMaxRetries it fails with EAGAIN, as a real backend would).
//   kShortTransfer  the first `times` attempts transfer only `short_bytes` (keep it aligned for
//                   O_DIRECT); the remainder is continued and the request succeeds.
//   kEof            a read returns 0 bytes at its first attempt: an OutOfRange error (end of file).
//   kLatency        the request is delayed by `latency` before it is served.
//   kFlip           silent corruption, the request succeeds: a write puts its bytes on disk with
//                   bit `flip_bit` of the request flipped (from a private copy: the caller's
//                   buffer is untouched); a read delivers the bytes with that bit flipped (the
//                   file is untouched). A bit past the request's end flips its last bit.
// Injected errors carry " [injected]" in their message. Injected results are delivered on the
// wrapper's own thread; results of real I/O on the inner backend's threads.
//
// Thread-safety: as IoBackend; AddRule may be called from any thread. The destructor waits for
// every request, then destroys the inner backend.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "swap/io_backend.h"

namespace strata {

enum class FaultKind : uint8_t { kEio, kEnospc, kEagain, kShortTransfer, kEof, kLatency, kFlip };
std::string_view FaultKindName(FaultKind kind);

struct FaultRule {
  uint64_t request = 0;  // which request (0-based submission index, among `op`'s if set)
  FaultKind kind = FaultKind::kEio;
  uint32_t times = 1;           // kEagain, kShortTransfer: attempts affected
  uint64_t short_bytes = 4096;  // kShortTransfer: bytes per affected attempt
  uint64_t after_bytes = 0;     // kEio, kEnospc: bytes transferred before the error hits
  std::chrono::microseconds latency{1000};  // kLatency
  // kFlip: the bit of the request to flip (byte flip_bit / 8, bit flip_bit % 8). The default is
  // the top exponent bit of the first fp32 value, or of the second bf16/fp16 one.
  uint64_t flip_bit = 30;
  std::optional<IoOp> op;  // set: `request` counts only reads (or only writes)
  std::string file;        // not empty: `request` counts only requests to files named file*
};

class FaultInjectingBackend final : public IoBackend {
 public:
  // REQUIRES: inner != nullptr.
  explicit FaultInjectingBackend(std::unique_ptr<IoBackend> inner,
                                 std::vector<FaultRule> rules = {});
  ~FaultInjectingBackend() override;

  // Adds a rule for a request not submitted yet (a later rule for the same request and `op`
  // replaces it).
  void AddRule(const FaultRule& rule);
  // Requests accepted so far, and faults actually injected (an attempt altered or delayed).
  uint64_t requests() const;
  uint64_t injected() const;

  std::string_view name() const override { return name_; }
  IoCapabilities capabilities() const override { return inner_->capabilities(); }
  const IoOptions& options() const override { return inner_->options(); }
  IoTicket Submit(IoRequest request) override;
  Status RegisterBuffers(std::span<const std::span<std::byte>> regions) override {
    return inner_->RegisterBuffers(regions);
  }
  Status RegisterFiles(std::span<const int> fds) override { return inner_->RegisterFiles(fds); }

 private:
  struct Impl;
  std::unique_ptr<IoBackend> inner_;
  std::string name_;
  std::unique_ptr<Impl> impl_;  // declared after inner_: destroyed (and drained) first
};

}  // namespace strata
