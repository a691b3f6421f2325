// FaultInjectingBackend: wraps any IoBackend and makes chosen requests misbehave, to test that
// every fault surfaces as the right error (or is absorbed) and that no other request is harmed.
//
//   auto inner = OpenIoBackend("uring", options).value();
//   FaultInjectingBackend io(std::move(inner), {{.request = 3, .kind = FaultKind::kEio}});
//   // the 4th request submitted through `io` fails with EIO naming its file, offset and length.
//
// Requests are numbered 0, 1, 2... in the order Submit accepts them (rejected requests included);
// a rule with `op` set counts only the requests of that direction (its 0, 1, 2... are the reads,
// or the writes), for tests that know "the 5th read" but not how writes interleave with it.
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

enum class FaultKind : uint8_t { kEio, kEnospc, kEagain, kShortTransfer, kEof, kLatency };
std::string_view FaultKindName(FaultKind kind);

struct FaultRule {
  uint64_t request = 0;  // which request (0-based submission index, among `op`'s if set)
  FaultKind kind = FaultKind::kEio;
  uint32_t times = 1;           // kEagain, kShortTransfer: attempts affected
  uint64_t short_bytes = 4096;  // kShortTransfer: bytes per affected attempt
  uint64_t after_bytes = 0;     // kEio, kEnospc: bytes transferred before the error hits
  std::chrono::microseconds latency{1000};  // kLatency
  std::optional<IoOp> op;                   // set: `request` counts only reads (or only writes)
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
