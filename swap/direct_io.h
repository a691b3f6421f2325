// Direct I/O helpers: probing a directory for O_DIRECT, opening files with the configured policy,
// aligned buffers, and splitting a transfer into blocks.
//
// O_DIRECT bypasses the page cache, so the buffer address, the file offset and the length of every
// transfer must be multiples of the device's logical block size. strata always aligns to
// max(logical block size, 4 KiB) (DeepSpeed's 1 KiB is not enough on 4Kn drives), probed per
// directory. Where a filesystem refuses O_DIRECT (EINVAL at open, e.g. ramfs or older tmpfs),
// OpenFileForIo falls back to buffered I/O with a warning, or fails when direct I/O is required.
//
// Thread-safety: free functions are thread-safe; an AlignedBuffer is a value owned by one thread
// at a time.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace strata {

struct DirectIoSupport {
  bool direct = false;                // O_DIRECT open + aligned write/read worked in the directory
  uint32_t logical_block_size = 512;  // of the device behind the directory (512 if unknown)
  uint32_t alignment = 4096;          // max(logical_block_size, 4096): use for buffers and extents
  std::string reason;                 // why direct is false, for logs and errors
};

// Probes `dir` (which must exist and be writable) by creating, writing, reading back and deleting
// one aligned block in a temporary file opened with O_DIRECT. Errors other than O_DIRECT being
// refused (the directory missing, not writable, EIO...) are returned as errors.
Result<DirectIoSupport> ProbeDirectIo(const std::string& dir);

// The logical block size of the block device holding `path` (from sysfs), or 512 if unknown.
uint32_t LogicalBlockSize(const std::string& path);

struct OpenedFile {
  int fd = -1;
  bool direct = false;  // the fd has O_DIRECT
};

// open(path, flags | O_CLOEXEC [| O_DIRECT], mode). With `use_direct`, tries O_DIRECT first; if the
// filesystem refuses it (EINVAL), either fails (`require_direct`) or logs a warning and opens the
// file buffered. The caller owns the returned fd.
Result<OpenedFile> OpenFileForIo(const std::string& path, int flags, mode_t mode, bool use_direct,
                                 bool require_direct);

// Memory aligned for O_DIRECT, owned (move-only). Contents are uninitialised unless zeroed.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // `size` is rounded up to a multiple of `alignment` (a power of two). Fails on ENOMEM.
  static Result<AlignedBuffer> Allocate(size_t size, size_t alignment = 4096, bool zero = false);
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<std::byte> span() const { return {data_, size_}; }
  std::span<std::byte> span(size_t offset, size_t length) const { return {data_ + offset, length}; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// One piece of a transfer cut at block boundaries relative to the start of the transfer.
struct BlockPiece {
  uint64_t file_offset;    // where the piece starts in the file
  uint64_t buffer_offset;  // where it starts in the buffer
  uint64_t length;         // bytes; block_size except possibly for the last piece
};

// Cuts [offset, offset + length) into ceil(length / block_size) pieces, in order. The engine
// (swap/io_engine.cc) splits requests exactly this way. REQUIRES: block_size > 0.
std::vector<BlockPiece> SplitIntoBlocks(uint64_t offset, uint64_t length, uint64_t block_size);

// OK if `data`, `offset` and `length` are multiples of `alignment`; otherwise InvalidArgument
// naming the first one that is not.
Status CheckDirectAlignment(const void* data, uint64_t offset, uint64_t length, uint64_t alignment);

}  // namespace strata
