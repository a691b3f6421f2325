#include "swap/direct_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

#include "base/bytes.h"
#include "base/logging.h"

namespace strata {
namespace {

bool ReadSysfsNumber(const std::string& path, uint32_t* out) {
  std::ifstream in(path);
  uint64_t v = 0;
  if (!(in >> v) || v == 0 || v > (1u << 20)) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

}  // namespace

uint32_t LogicalBlockSize(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return 512;
  const std::string dev =
      "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  uint32_t lbs = 0;
  // A whole disk has queue/ itself; a partition's queue/ is its parent's.
  if (ReadSysfsNumber(dev + "/queue/logical_block_size", &lbs)) return lbs;
  if (ReadSysfsNumber(dev + "/../queue/logical_block_size", &lbs)) return lbs;
  return 512;
}

Result<DirectIoSupport> ProbeDirectIo(const std::string& dir) {
  DirectIoSupport out;
  out.logical_block_size = LogicalBlockSize(dir);
  out.alignment = std::max<uint32_t>(out.logical_block_size, 4096);

  static std::atomic<uint64_t> counter{0};
  const std::string path = dir + "/.strata-direct-probe-" + std::to_string(getpid()) + "-" +
                           std::to_string(counter.fetch_add(1));
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) {
    out.reason = "the filesystem of " + dir + " refuses O_DIRECT (EINVAL at open)";
    return out;
  }
  if (fd < 0) return IoErrorFromErrno(errno, "probe O_DIRECT: create " + path);
  unlink(path.c_str());

  STRATA_ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::Allocate(out.alignment, out.alignment));
  std::memset(buf.data(), 0x5a, buf.size());
  const ssize_t w = pwrite(fd, buf.data(), buf.size(), 0);
  const int werr = errno;
  ssize_t r = -1;
  int rerr = 0;
  if (w == static_cast<ssize_t>(buf.size())) {
    r = pread(fd, buf.data(), buf.size(), 0);
    rerr = errno;
  }
  close(fd);
  if (w != static_cast<ssize_t>(buf.size())) {
    if (w < 0 && werr == EINVAL) {
      out.reason = "aligned O_DIRECT write in " + dir + " failed with EINVAL";
      return out;
    }
    if (w < 0) return IoErrorFromErrno(werr, "probe O_DIRECT: write " + path);
    out.reason = "short O_DIRECT write in " + dir;
    return out;
  }
  if (r != static_cast<ssize_t>(buf.size())) {
    if (r < 0 && rerr != EINVAL) return IoErrorFromErrno(rerr, "probe O_DIRECT: read " + path);
    out.reason = "aligned O_DIRECT read in " + dir + " failed";
    return out;
  }
  out.direct = true;
  return out;
}

Result<OpenedFile> OpenFileForIo(const std::string& path, int flags, mode_t mode, bool use_direct,
                                 bool require_direct) {
  flags |= O_CLOEXEC;
  if (use_direct || require_direct) {
    const int fd = open(path.c_str(), flags | O_DIRECT, mode);
    if (fd >= 0) return OpenedFile{fd, true};
    if (errno != EINVAL) return IoErrorFromErrno(errno, "open " + path);
    if (require_direct) {
      return UnavailableError("open " + path +
                              ": the filesystem refuses O_DIRECT (EINVAL) and direct I/O is "
                              "required (require_direct)");
    }
    STRATA_LOG(kWarning) << "open " << path
                         << ": the filesystem refuses O_DIRECT; using buffered I/O (slower, "
                            "and it fills the page cache)";
  }
  const int fd = open(path.c_str(), flags, mode);
  if (fd < 0) return IoErrorFromErrno(errno, "open " + path);
  return OpenedFile{fd, false};
}

Result<AlignedBuffer> AlignedBuffer::Allocate(size_t size, size_t alignment, bool zero) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment < sizeof(void*)) {
    return InvalidArgumentError("alignment " + std::to_string(alignment) +
                                " is not a power of two");
  }
  AlignedBuffer out;
  out.size_ = static_cast<size_t>(AlignUp(size, alignment));
  if (out.size_ == 0) return out;
  void* p = nullptr;
  const int rc = posix_memalign(&p, alignment, out.size_);
  if (rc != 0) {
    out.size_ = 0;
    return ResourceExhaustedError("cannot allocate " + FormatBytes(AlignUp(size, alignment)) +
                                  " aligned to " + std::to_string(alignment));
  }
  out.data_ = static_cast<std::byte*>(p);
  if (zero) std::memset(out.data_, 0, out.size_);
  return out;
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

std::vector<BlockPiece> SplitIntoBlocks(uint64_t offset, uint64_t length, uint64_t block_size) {
  std::vector<BlockPiece> out;
  if (block_size == 0) return out;
  out.reserve(static_cast<size_t>((length + block_size - 1) / block_size));
  for (uint64_t done = 0; done < length; done += block_size) {
    out.push_back({offset + done, done, std::min(block_size, length - done)});
  }
  return out;
}

Status CheckDirectAlignment(const void* data, uint64_t offset, uint64_t length,
                            uint64_t alignment) {
  if (alignment <= 1) return Status::Ok();
  const auto addr = reinterpret_cast<uintptr_t>(data);
  if (addr % alignment != 0) {
    return InvalidArgumentError("buffer address is not a multiple of " + std::to_string(alignment));
  }
  if (offset % alignment != 0) {
    return InvalidArgumentError("offset " + std::to_string(offset) + " is not a multiple of " +
                                std::to_string(alignment));
  }
  if (length % alignment != 0) {
    return InvalidArgumentError("length " + std::to_string(length) + " is not a multiple of " +
                                std::to_string(alignment));
  }
  return Status::Ok();
}

}  // namespace strata
