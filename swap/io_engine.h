// Internal: the machinery shared by the io_uring, libaio and POSIX backends and the fault injector.
//
// Two pieces live here so that they exist once:
//   * Transfer + AdvanceTransfer: what to do after one attempt of one piece returned `res` (bytes,
//     or -errno): done, continue a short transfer, retry EINTR/EAGAIN, or fail with a Status that
//     names the file, offset, length and errno. Every completion of every backend goes through it.
//   * RingEngine (MakeRingEngine): an IoBackend built from N `Ring`s (one per intra-op worker). It
//     splits requests into block_size pieces, distributes them, enforces queue_depth, implements
//     overlap_events / single_submit, runs one completion thread per ring, and completes each
//     request exactly once. A backend only has to provide the Ring: how to queue one operation,
//     submit what is queued, and wait for completions.
//
// Not part of the public surface: include swap/io_backend.h instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "swap/io_backend.h"

namespace strata::internal {

// One contiguous piece of a request, as it progresses through attempts.
struct Transfer {
  IoOp op = IoOp::kRead;
  int fd = -1;
  uint64_t offset = 0;        // file offset of byte 0 of the piece
  std::byte* data = nullptr;  // memory of byte 0 of the piece
  size_t length = 0;          // bytes in the piece
  size_t done = 0;            // bytes transferred so far
  uint32_t retries = 0;       // EINTR/EAGAIN/zero-progress attempts so far

  // What the next attempt should transfer.
  uint64_t next_offset() const { return offset + done; }
  std::byte* next_data() const { return data + done; }
  size_t remaining() const { return length - done; }
};

enum class Step : uint8_t {
  kDone,      // the piece is complete
  kContinue,  // resubmit the remaining bytes (short transfer or retryable error)
  kFailed,    // *error holds why
};

// Attempts at EINTR/EAGAIN (or a write that made no progress) before giving up.
inline constexpr uint32_t kMaxRetries = 64;

// Applies the result of one attempt (`res` >= 0: bytes moved; < 0: -errno) to `t`.
// A read that returns 0 bytes before the piece is complete is an OutOfRange error (end of file):
// nothing is zero-filled. `note` (e.g. " [injected]") is appended to error messages.
Step AdvanceTransfer(Transfer& t, int64_t res, Status* error, std::string_view note = {});

// "read /path/to/file offset 4096 length 8192" (the path is found from the fd via /proc).
std::string DescribeTransfer(IoOp op, int fd, uint64_t offset, size_t length);
// The path behind `fd`, or "fd N" if it cannot be found.
std::string PathOfFd(int fd);

// Checks a request before it is accepted: fd >= 0, buffer non-null when non-empty, and for an
// O_DIRECT fd the address, offset and length aligned to `alignment`.
Status ValidateRequest(const IoRequest& request, uint32_t alignment);

// A completed attempt, as reported by a Ring.
struct RingCompletion {
  void* tag;    // as given to Prepare
  int64_t res;  // bytes, or -errno
};

// One submission/completion queue, owned by one worker of a RingEngine.
// Prepare and Flush are called only with the worker's lock held (never concurrently with each
// other); Wait is called only from the worker's completion thread, possibly concurrently with
// Prepare/Flush. The engine never has more than queue_depth operations prepared or in flight.
class Ring {
 public:
  virtual ~Ring() = default;
  // Queues one operation (not yet visible to the kernel). An error fails just this operation.
  virtual Status Prepare(IoOp op, int fd, uint64_t offset, std::byte* data, size_t length,
                         void* tag) = 0;
  // Submits everything prepared. Operations that could not be submitted are appended to `failed`
  // with a negative errno; every other prepared operation is reported once by Wait.
  virtual void Flush(std::vector<RingCompletion>* failed) = 0;
  // Blocks until at least one submitted operation completes and appends up to `max` of them.
  // Called only while at least one operation is in flight.
  virtual Status Wait(std::vector<RingCompletion>* out, size_t max) = 0;
  // Optional features (see IoBackend). Called with no operation in flight.
  virtual Status RegisterBuffers(std::span<const std::span<std::byte>> regions) {
    return Status::Ok();
  }
  virtual Status RegisterFiles(std::span<const int> fds) { return Status::Ok(); }
};

using RingFactory = std::function<Result<std::unique_ptr<Ring>>(const IoOptions& options)>;

// Builds an IoBackend named `name` from options.intra_op_parallelism rings made by `factory`.
// Fails if options are invalid or a ring cannot be created.
Result<std::unique_ptr<IoBackend>> MakeRingEngine(std::string name, const IoOptions& options,
                                                  IoCapabilities capabilities,
                                                  const RingFactory& factory);

// The backend factories, each in its own .cc (uring and aio compiled only when found).
Result<std::unique_ptr<IoBackend>> OpenUringBackend(const IoOptions& options);
Result<std::unique_ptr<IoBackend>> OpenAioBackend(const IoOptions& options);
Result<std::unique_ptr<IoBackend>> OpenPosixBackend(const IoOptions& options);

}  // namespace strata::internal
