// The io_uring backend: one ring per intra-op worker (see io_engine.cc for the engine).
//
// Each ring has queue_depth submission entries (the engine never has more pieces prepared or in
// flight). Prepare fills one SQE (READ/WRITE, or READ_FIXED/WRITE_FIXED when the buffer lies in a
// registered region, IOSQE_FIXED_FILE when the fd is registered); Flush calls io_uring_submit until
// every prepared SQE is consumed, retrying EINTR/EAGAIN/EBUSY. Submission happens under the
// worker's lock while the completion thread waits on the CQ: liburing allows one submitter and
// one reaper to use a ring concurrently (no SQPOLL, no SINGLE_ISSUER). If submission fails hard,
// the ring reports the unsubmitted pieces as failed and refuses further work.
#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "swap/io_engine.h"

namespace strata::internal {
namespace {

class UringRing final : public Ring {
 public:
  ~UringRing() override {
    if (initialized_) io_uring_queue_exit(&ring_);
  }

  Status Init(uint32_t entries, bool honour_buffers) {
    honour_buffers_ = honour_buffers;
    const int rc = io_uring_queue_init(entries, &ring_, 0);
    if (rc < 0)
      return IoErrorFromErrno(-rc, "io_uring_queue_init(" + std::to_string(entries) + ")");
    initialized_ = true;
    io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
    if (probe == nullptr) return UnavailableError("io_uring: cannot probe supported operations");
    const bool ok = io_uring_opcode_supported(probe, IORING_OP_READ) &&
                    io_uring_opcode_supported(probe, IORING_OP_WRITE);
    io_uring_free_probe(probe);
    if (!ok) return UnavailableError("io_uring: the kernel lacks IORING_OP_READ/WRITE");
    return Status::Ok();
  }

  Status Prepare(IoOp op, int fd, uint64_t offset, std::byte* data, size_t length,
                 void* tag) override {
    if (!broken_.ok()) return broken_;
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      return InternalError("io_uring: submission queue full (more than queue_depth prepared)");
    }
    const int buf_index = FindBuffer(data, length);
    const auto len = static_cast<unsigned>(length);
    if (buf_index >= 0) {
      if (op == IoOp::kRead) {
        io_uring_prep_read_fixed(sqe, fd, data, len, offset, buf_index);
      } else {
        io_uring_prep_write_fixed(sqe, fd, data, len, offset, buf_index);
      }
    } else if (op == IoOp::kRead) {
      io_uring_prep_read(sqe, fd, data, len, offset);
    } else {
      io_uring_prep_write(sqe, fd, data, len, offset);
    }
    if (!file_index_.empty()) {
      auto it = file_index_.find(fd);
      if (it != file_index_.end()) {
        sqe->fd = it->second;
        sqe->flags |= IOSQE_FIXED_FILE;
      }
    }
    io_uring_sqe_set_data(sqe, tag);
    unsubmitted_.push_back(tag);
    return Status::Ok();
  }

  void Flush(std::vector<RingCompletion>* failed) override {
    int transient = 0;
    while (!unsubmitted_.empty()) {
      const int rc = io_uring_submit(&ring_);
      if (rc > 0) {
        const size_t n = std::min<size_t>(static_cast<size_t>(rc), unsubmitted_.size());
        unsubmitted_.erase(unsubmitted_.begin(), unsubmitted_.begin() + n);
        transient = 0;
        continue;
      }
      if ((rc == -EINTR || rc == -EAGAIN || rc == -EBUSY || rc == 0) && ++transient < 10000) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        continue;
      }
      // The SQEs stay in the ring; never submitting again keeps them from running.
      broken_ = IoErrorFromErrno(rc < 0 ? -rc : EIO, "io_uring_submit");
      for (void* tag : unsubmitted_) failed->push_back({tag, rc < 0 ? rc : -EIO});
      unsubmitted_.clear();
      return;
    }
  }

  Status Wait(std::vector<RingCompletion>* out, size_t max) override {
    io_uring_cqe* cqe = nullptr;
    int rc;
    do {
      rc = io_uring_wait_cqe(&ring_, &cqe);
    } while (rc == -EINTR || rc == -EAGAIN);
    if (rc < 0) return IoErrorFromErrno(-rc, "io_uring_wait_cqe");
    unsigned head;
    size_t n = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      out->push_back({io_uring_cqe_get_data(cqe), static_cast<int64_t>(cqe->res)});
      if (++n == max) break;
    }
    io_uring_cq_advance(&ring_, static_cast<unsigned>(n));
    return Status::Ok();
  }

  Status RegisterBuffers(std::span<const std::span<std::byte>> regions) override {
    if (!honour_buffers_) return Status::Ok();
    if (!buffers_.empty()) {
      io_uring_unregister_buffers(&ring_);
      buffers_.clear();
    }
    if (regions.empty()) return Status::Ok();
    std::vector<iovec> iov;
    for (const auto& r : regions) iov.push_back({r.data(), r.size()});
    const int rc = io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(iov.size()));
    if (rc < 0) return IoErrorFromErrno(-rc, "io_uring_register_buffers");
    buffers_.assign(regions.begin(), regions.end());
    return Status::Ok();
  }

  Status RegisterFiles(std::span<const int> fds) override {
    if (!file_index_.empty()) {
      io_uring_unregister_files(&ring_);
      file_index_.clear();
    }
    if (fds.empty()) return Status::Ok();
    const int rc = io_uring_register_files(&ring_, fds.data(), static_cast<unsigned>(fds.size()));
    if (rc < 0) return IoErrorFromErrno(-rc, "io_uring_register_files");
    for (size_t i = 0; i < fds.size(); ++i) file_index_[fds[i]] = static_cast<int>(i);
    return Status::Ok();
  }

 private:
  int FindBuffer(const std::byte* data, size_t length) const {
    for (size_t i = 0; i < buffers_.size(); ++i) {
      const std::byte* b = buffers_[i].data();
      if (data >= b && data + length <= b + buffers_[i].size()) return static_cast<int>(i);
    }
    return -1;
  }

  io_uring ring_{};
  bool initialized_ = false;
  bool honour_buffers_ = false;
  Status broken_;
  std::vector<void*> unsubmitted_;  // tags prepared but not yet consumed by the kernel, in order
  std::vector<std::span<std::byte>> buffers_;
  std::unordered_map<int, int> file_index_;
};

}  // namespace

Result<std::unique_ptr<IoBackend>> OpenUringBackend(const IoOptions& options) {
  IoCapabilities caps;
  caps.direct_io = true;
  caps.fixed_buffers = options.register_buffers;
  caps.fixed_files = true;
  caps.max_queue_depth = 4096;
  return MakeRingEngine("uring", options, caps,
                        [](const IoOptions& o) -> Result<std::unique_ptr<Ring>> {
                          auto ring = std::make_unique<UringRing>();
                          STRATA_RETURN_IF_ERROR(ring->Init(o.queue_depth, o.register_buffers));
                          return std::unique_ptr<Ring>(std::move(ring));
                        });
}

}  // namespace strata::internal
