// Tickets, option checks and the backend registry (OpenIoBackend: names, STRATA_IO_BACKEND,
// "auto" probing uring -> aio -> posix with a real aligned write/read in the target directory).
#include "swap/io_backend.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "base/env.h"
#include "base/logging.h"
#include "base/mutex.h"
#include "strata/config.h"
#include "swap/direct_io.h"
#include "swap/fault_spec.h"
#include "swap/io_engine.h"

namespace strata {

std::string_view IoOpName(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

namespace internal {

struct TicketState {
  mutable Mutex mu;
  mutable CondVar cv;
  bool done GUARDED_BY(mu) = false;
  Status status GUARDED_BY(mu);
  size_t bytes GUARDED_BY(mu) = 0;
};

std::shared_ptr<TicketState> NewTicketState() { return std::make_shared<TicketState>(); }

void CompleteTicket(TicketState& state, Status status, size_t bytes) {
  MutexLock lock(&state.mu);
  state.status = std::move(status);
  state.bytes = bytes;
  state.done = true;
  state.cv.SignalAll();  // under the lock: a waiter may free the state once it sees `done`
}

IoTicket CompleteNow(IoRequest& request, Status status, size_t bytes) {
  auto state = NewTicketState();
  if (request.done) request.done(status, bytes);
  CompleteTicket(*state, std::move(status), bytes);
  return IoTicket(std::move(state));
}

}  // namespace internal

IoTicket::IoTicket(std::shared_ptr<internal::TicketState> state) : state_(std::move(state)) {}
IoTicket::~IoTicket() = default;

bool IoTicket::Ready() const {
  MutexLock lock(&state_->mu);
  return state_->done;
}

Status IoTicket::Wait() const {
  MutexLock lock(&state_->mu);
  while (!state_->done) state_->cv.Wait(&state_->mu);
  return state_->status;
}

size_t IoTicket::bytes() const {
  MutexLock lock(&state_->mu);
  return state_->bytes;
}

Status ValidateIoOptions(const IoOptions& o) {
  if (o.alignment < 512 || (o.alignment & (o.alignment - 1)) != 0) {
    return InvalidArgumentError("aio alignment " + std::to_string(o.alignment) +
                                " must be a power of two >= 512");
  }
  if (o.block_size == 0 || o.block_size % o.alignment != 0 || o.block_size > (1ull << 30)) {
    return InvalidArgumentError("aio.block_size " + std::to_string(o.block_size) +
                                " must be a positive multiple of " + std::to_string(o.alignment) +
                                " and at most 1 GiB");
  }
  if (o.queue_depth < 1 || o.queue_depth > 4096) {
    return InvalidArgumentError("aio.queue_depth " + std::to_string(o.queue_depth) +
                                " must be in [1, 4096]");
  }
  if (o.intra_op_parallelism < 1 || o.intra_op_parallelism > 64) {
    return InvalidArgumentError("aio.intra_op_parallelism " +
                                std::to_string(o.intra_op_parallelism) + " must be in [1, 64]");
  }
  return Status::Ok();
}

Status IoBackend::Read(int fd, uint64_t offset, std::span<std::byte> buffer) {
  return Submit(IoRequest{IoOp::kRead, fd, offset, buffer, nullptr}).Wait();
}

Status IoBackend::Write(int fd, uint64_t offset, std::span<const std::byte> buffer) {
  // The backend only reads from a write request's buffer.
  std::span<std::byte> mutable_view(const_cast<std::byte*>(buffer.data()), buffer.size());
  return Submit(IoRequest{IoOp::kWrite, fd, offset, mutable_view, nullptr}).Wait();
}

std::vector<std::string> CompiledIoBackends() {
  std::vector<std::string> out;
#if STRATA_HAVE_URING
  out.push_back("uring");
#endif
#if STRATA_HAVE_AIO
  out.push_back("aio");
#endif
  out.push_back("posix");
  return out;
}

namespace {

Result<std::unique_ptr<IoBackend>> OpenByName(std::string_view name, const IoOptions& options) {
  if (name == "uring") {
#if STRATA_HAVE_URING
    return internal::OpenUringBackend(options);
#else
    return UnavailableError(
        "io backend 'uring' is not compiled in (liburing was not found at configure time; "
        "install liburing-dev and reconfigure)");
#endif
  }
  if (name == "aio") {
#if STRATA_HAVE_AIO
    return internal::OpenAioBackend(options);
#else
    return UnavailableError(
        "io backend 'aio' is not compiled in (libaio was not found at configure time; install "
        "libaio-dev and reconfigure)");
#endif
  }
  if (name == "posix") return internal::OpenPosixBackend(options);
  return InvalidArgumentError("unknown io backend '" + std::string(name) +
                              "' (expected auto, uring, aio or posix)");
}

// Writes one aligned block through `backend` into a temporary file in `dir` and reads it back.
Status ProbeBackendIo(IoBackend& backend, const std::string& dir) {
  STRATA_ASSIGN_OR_RETURN(DirectIoSupport support, ProbeDirectIo(dir));
  static std::atomic<uint64_t> counter{0};
  const std::string path = dir + "/.strata-io-probe-" + std::to_string(getpid()) + "-" +
                           std::to_string(counter.fetch_add(1));
  const int fd = open(
      path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | (support.direct ? O_DIRECT : 0), 0600);
  if (fd < 0) return IoErrorFromErrno(errno, "create " + path);
  unlink(path.c_str());
  const size_t n = std::max<size_t>(support.alignment, backend.options().alignment);
  Result<AlignedBuffer> out = AlignedBuffer::Allocate(n, n);
  Result<AlignedBuffer> in = AlignedBuffer::Allocate(n, n, /*zero=*/true);
  Status st = out.ok() ? in.status() : out.status();
  if (out.ok() && in.ok()) {
    for (size_t i = 0; i < n; ++i) out->data()[i] = static_cast<std::byte>(i * 7 + 3);
    st = backend.Write(fd, 0, out->span());
    if (st.ok()) st = backend.Read(fd, 0, in->span());
    if (st.ok() && std::memcmp(in->data(), out->data(), n) != 0) {
      st = DataLossError("probe read back different bytes than it wrote in " + dir);
    }
  }
  close(fd);
  return st;
}

Result<std::unique_ptr<IoBackend>> OpenAndProbe(std::string_view name, const IoOptions& options,
                                                const std::string& probe_dir) {
  STRATA_ASSIGN_OR_RETURN(auto backend, OpenByName(name, options));
  if (!probe_dir.empty()) {
    Status st = ProbeBackendIo(*backend, probe_dir);
    if (!st.ok()) {
      return UnavailableError("io backend '" + std::string(name) + "' failed its probe in " +
                              probe_dir + ": " + st.ToString());
    }
  }
  return backend;
}

Result<std::unique_ptr<IoBackend>> OpenWithoutFaults(std::string_view name,
                                                     const IoOptions& options,
                                                     const std::string& probe_dir) {
  std::string chosen(name);
  if (chosen.empty() || chosen == "auto") {
    const char* env = GetEnv("STRATA_IO_BACKEND");
    if (env != nullptr && env[0] != '\0' && std::string_view(env) != "auto") {
      chosen = env;
      STRATA_LOG(kInfo) << "io backend: " << chosen << " (forced by STRATA_IO_BACKEND)";
      Result<std::unique_ptr<IoBackend>> forced = OpenAndProbe(chosen, options, probe_dir);
      if (!forced.ok()) return forced.status().WithContext("STRATA_IO_BACKEND=" + chosen);
      return forced;
    }
    std::string skipped;
    for (const std::string& candidate : CompiledIoBackends()) {
      Result<std::unique_ptr<IoBackend>> b = OpenAndProbe(candidate, options, probe_dir);
      if (b.ok()) {
        STRATA_LOG(kInfo) << "io backend: auto chose " << candidate
                          << (skipped.empty() ? "" : " (skipped: " + skipped + ")");
        return b;
      }
      if (!skipped.empty()) skipped += "; ";
      skipped += candidate + ": " + b.status().ToString();
    }
    return UnavailableError("no io backend works here: " + skipped);
  }
  return OpenAndProbe(chosen, options, probe_dir);
}

}  // namespace

Result<std::unique_ptr<IoBackend>> OpenIoBackend(std::string_view name, const IoOptions& options,
                                                 const std::string& probe_dir) {
  STRATA_RETURN_IF_ERROR(ValidateIoOptions(options));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<IoBackend> backend,
                          OpenWithoutFaults(name, options, probe_dir));
  return WrapWithFaultsFromEnv(std::move(backend));  // the STRATA_IO_FAULTS test hook
}

}  // namespace strata
