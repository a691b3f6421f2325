// IoBackend: asynchronous file I/O with one completion per request.
//
// strata moves model state between pinned host memory and NVMe through this interface. Three
// implementations are chosen at run time (OpenIoBackend): "uring" (liburing), "aio" (libaio) and
// "posix" (a pool of threads calling pread/pwrite). A fourth, FaultInjectingBackend
// (fault_injecting_backend.h), wraps any of them for tests.
//
// Contract of a request (IoRequest):
//   * The caller owns `buffer` and the file descriptor and keeps both alive and untouched (for a
//     read: unread; for a write: unmodified) until the request completes.
//   * `done` is invoked exactly once, with OK and `buffer.size()` bytes, or with an error and the
//     number of bytes known to have been transferred. It runs on a backend thread, except for a
//     request rejected by Submit itself (bad arguments, backend shut down) or an empty one, whose
//     `done` runs on the calling thread before Submit returns. `done` must not throw and must not
//     block for long (it delays other completions of the same worker); it may call Submit.
//   * The returned IoTicket becomes Ready() after `done` has returned.
//   * Nothing is silently truncated: short transfers are continued, EINTR/EAGAIN are retried, and
//     every other failure (EIO, ENOSPC, EBADF, a read past the end of the file...) fails the
//     request with a Status naming the operation, the file, the offset, the length and the errno.
//   * For a file opened with O_DIRECT, the buffer address, the offset and the length must be
//     multiples of IoOptions::alignment; otherwise Submit rejects the request (InvalidArgument).
//
// Splitting: a request is cut into pieces of at most `block_size` bytes, spread round-robin over
// `intra_op_parallelism` workers (one ring, libaio context or thread group each, with its own
// completion thread), each keeping at most `queue_depth` pieces in flight. With `overlap_events`
// a worker refills its queue as each piece completes (a sliding window); without it, it submits a
// batch of up to `queue_depth` pieces and waits for all of them before the next batch (DeepSpeed's
// sequential mode). `single_submit` submits one piece per system call instead of one batch.
//
// Thread-safety: Submit, name, capabilities and options may be called from any thread at once.
// Destroying a backend waits for every request already submitted to complete (their callbacks
// run); no request may be submitted during or after destruction.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace strata {

enum class IoOp : uint8_t { kRead, kWrite };
std::string_view IoOpName(IoOp op);  // "read" / "write"

// Invoked exactly once per request: the final status and the bytes transferred.
using IoCallback = std::function<void(Status status, size_t bytes)>;

struct IoRequest {
  IoOp op = IoOp::kRead;
  int fd = -1;
  uint64_t offset = 0;
  std::span<std::byte> buffer;  // the bytes to write, or where to read into
  IoCallback done;              // may be empty: then only the ticket reports the result
};

namespace internal {
struct TicketState;
}

// A move-only handle on one request's completion. A default-constructed ticket is invalid.
// Dropping a ticket does not cancel the request. Wait/Ready may be called from any thread, but one
// ticket object must not be used by two threads at once.
class IoTicket {
 public:
  IoTicket() = default;
  explicit IoTicket(std::shared_ptr<internal::TicketState> state);
  IoTicket(IoTicket&&) noexcept = default;
  IoTicket& operator=(IoTicket&&) noexcept = default;
  IoTicket(const IoTicket&) = delete;
  IoTicket& operator=(const IoTicket&) = delete;
  ~IoTicket();

  bool valid() const { return state_ != nullptr; }
  // True once the request has completed and its callback has returned. REQUIRES: valid().
  bool Ready() const;
  // Blocks until Ready(); returns the request's status (may be called again). REQUIRES: valid().
  Status Wait() const;
  // Bytes transferred. REQUIRES: Ready().
  size_t bytes() const;

 private:
  std::shared_ptr<internal::TicketState> state_;
};

// The DeepSpeed `aio` config section, plus strata's direct-I/O settings.
struct IoOptions {
  uint64_t block_size = 1 << 20;      // aio.block_size: bytes per submitted piece
  uint32_t queue_depth = 8;           // aio.queue_depth: pieces in flight per worker
  uint32_t intra_op_parallelism = 1;  // aio.intra_op_parallelism (legacy: thread_count)
  bool single_submit = false;         // aio.single_submit: one system call per piece
  bool overlap_events = true;         // aio.overlap_events: sliding window instead of batches
  bool use_direct = true;             // open swap files with O_DIRECT where the filesystem allows
  bool require_direct = false;        // fail instead of falling back to buffered I/O
  uint32_t alignment = 4096;          // required for O_DIRECT fds; max(logical block, 4 KiB)
  bool register_buffers = false;      // io_uring: honour RegisterBuffers (fixed buffers)
};

// Checks ranges: block_size a positive multiple of alignment and at most 1 GiB; queue_depth in
// [1, 4096]; intra_op_parallelism in [1, 64]; alignment a power of two >= 512.
Status ValidateIoOptions(const IoOptions& options);

struct IoCapabilities {
  bool direct_io = false;        // O_DIRECT file descriptors are supported
  bool fixed_buffers = false;    // RegisterBuffers makes a difference
  bool fixed_files = false;      // RegisterFiles makes a difference
  uint32_t max_queue_depth = 0;  // the largest queue_depth this backend accepts
};

class IoBackend {
 public:
  virtual ~IoBackend() = default;

  // "uring", "aio", "posix", or "fault(<inner>)".
  virtual std::string_view name() const = 0;
  virtual IoCapabilities capabilities() const = 0;
  virtual const IoOptions& options() const = 0;

  // Starts `request` and returns its ticket (see the contract at the top of this file).
  virtual IoTicket Submit(IoRequest request) = 0;

  // Registers memory for zero-copy fixed-buffer I/O (io_uring). Requests whose buffer lies inside
  // a registered region use it. REQUIRES: no request in flight; regions outlive the backend or a
  // later RegisterBuffers({}). Backends without the feature return OK and ignore it.
  virtual Status RegisterBuffers(std::span<const std::span<std::byte>> regions) {
    return Status::Ok();
  }
  // Registers file descriptors (io_uring fixed files), same rules as RegisterBuffers.
  virtual Status RegisterFiles(std::span<const int> fds) { return Status::Ok(); }

  // Convenience: Submit and Wait. Blocks the calling thread.
  Status Read(int fd, uint64_t offset, std::span<std::byte> buffer);
  Status Write(int fd, uint64_t offset, std::span<const std::byte> buffer);
};

// The backends compiled into this build, in probe order: some of "uring", "aio", then "posix".
std::vector<std::string> CompiledIoBackends();

// Opens a backend by name: "uring", "aio", "posix", or "auto".
//   * "auto" (or empty) first looks at the environment variable STRATA_IO_BACKEND; if it names a
//     backend, that one is forced. Otherwise it probes uring, then aio, then posix, and logs which
//     one it chose and why the others were skipped.
//   * Probing = creating the ring/context and, if `probe_dir` is not empty, writing and reading
//     back one aligned block through the backend in a temporary file there (O_DIRECT where the
//     directory allows it), so a kernel or container that blocks a backend is detected.
//   * A backend asked for by name (argument or environment) that is not compiled in or fails its
//     probe is an UnavailableError saying why; there is no silent fallback.
//   * With STRATA_IO_FAULTS set (a test hook, swap/fault_spec.h) the backend comes wrapped in a
//     FaultInjectingBackend that fails the requests the variable names.
Result<std::unique_ptr<IoBackend>> OpenIoBackend(std::string_view name, const IoOptions& options,
                                                 const std::string& probe_dir = "");

namespace internal {

// Shared by every backend and the fault injector: the completion state behind an IoTicket.
std::shared_ptr<TicketState> NewTicketState();
// Marks `state` complete. Called exactly once per request, after the user callback returned.
void CompleteTicket(TicketState& state, Status status, size_t bytes);

// Runs `request.done` (if any) and completes a fresh ticket, on the calling thread. For requests
// that fail (or finish) before reaching a backend.
IoTicket CompleteNow(IoRequest& request, Status status, size_t bytes);

}  // namespace internal
}  // namespace strata
