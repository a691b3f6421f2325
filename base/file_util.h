// Small POSIX helpers for files that must reach the disk whole: write(2)/pread(2) loops that
// handle short transfers and EINTR, fsync of files and directories, an owning fd, and the
// write-fsync-rename-fsync sequence that replaces a file atomically.
//
// Every error names the file and the errno (ENOSPC and EIO included); a read that ends early is
// a kDataLoss "truncated" error with the expected and found byte counts. Stateless functions;
// any thread may call them on distinct fds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace strata {

// Owns a file descriptor; closes it (ignoring errors) on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.Release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset();
  // Closes the fd and reports close(2)'s error (NFS and some filesystems report write-back
  // errors only there).
  Status Close(const std::string& path);

 private:
  int fd_ = -1;
};

// Opens `path` with `flags` (O_CLOEXEC added) and `mode`. A missing file is kNotFound.
Result<UniqueFd> OpenFile(const std::string& path, int flags, int mode = 0644);

// Writes all `bytes` at the current offset of `fd`, continuing after short writes and EINTR.
Status WriteFully(int fd, const void* data, size_t bytes, const std::string& path);

// Reads exactly `bytes` at `offset`; a file that ends first is kDataLoss ("truncated").
Status PreadFully(int fd, uint64_t offset, void* out, size_t bytes, const std::string& path);

// Reads all of the regular file `path` into `out`. Refuses with `code`, before allocating or
// reading anything, whatever is not a regular file (a directory; /dev/zero, which never ends; a
// FIFO, which is opened without blocking) and a file larger than `limit` bytes. A missing file
// is kNotFound.
Status ReadSmallFile(const std::string& path, uint64_t limit, std::string* out, StatusCode code);

Status FsyncFd(int fd, const std::string& path);
// Opens the directory read-only and fsyncs it, making renames and creations inside it durable.
Status FsyncDir(const std::string& path);

// Creates `path` and missing parents (mode 0755); OK if it exists as a directory.
Status MakeDirs(const std::string& path);

// The one writer of durable files: a file that readers (and a crash) see whole or not at all.
// Create opens a temporary beside `path` (truncating a leftover), Append writes to it (short
// writes and EINTR continued), and Commit fsyncs and closes it, renames it over `path` and fsyncs
// the directory of `path`. Destroyed without a successful Commit, it removes the temporary and
// leaves `path` as it was. Errors name the temporary (open, write, fsync, close) or both files
// (rename). A `path` that exists and is not a regular file is refused before anything is created
// (CheckReplaceable). Move-only; one thread at a time.
class AtomicFileWriter {
 public:
  // Writes through `path`.tmp.
  static Result<AtomicFileWriter> Create(const std::string& path, int mode = 0644);
  // Writes through `tmp_path`. REQUIRES: `tmp_path` is in the same directory as `path` (rename(2)
  // is atomic only within one filesystem).
  static Result<AtomicFileWriter> CreateVia(const std::string& tmp_path, const std::string& path,
                                            int mode = 0644);
  AtomicFileWriter(AtomicFileWriter&& o) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& o) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();  // without a successful Commit: removes the temporary

  // REQUIRES: before Commit.
  Status Append(const void* data, size_t bytes);
  Status Append(std::string_view bytes) { return Append(bytes.data(), bytes.size()); }
  // Makes the file durable under `path`. REQUIRES: called once.
  Status Commit();

  const std::string& path() const { return path_; }
  const std::string& tmp_path() const { return tmp_path_; }

 private:
  AtomicFileWriter(UniqueFd fd, std::string tmp_path, std::string path)
      : fd_(std::move(fd)), tmp_path_(std::move(tmp_path)), path_(std::move(path)) {}
  void RemoveTemporary();

  UniqueFd fd_;
  std::string tmp_path_;
  std::string path_;
  bool renamed_ = false;  // the temporary is gone: renamed over `path`
};

// Replaces `path` with `contents` so that readers (and a crash) see the old or the new contents,
// never a mix: creates `tmp_path` with `mode` (truncating a leftover), writes, fsyncs, closes,
// renames it over `path` and fsyncs the directory of `path`. On failure `tmp_path` is removed and
// `path` is unchanged. REQUIRES: `tmp_path` is in the same directory as `path` (rename(2) is
// atomic only within one filesystem). Use this form when the temporary name must be known in
// advance (SwapSpace removes it from a signal handler); otherwise use WriteFileAtomically.
Status WriteFileAtomicallyVia(const std::string& tmp_path, const std::string& path,
                              std::string_view contents, int mode = 0644);

// WriteFileAtomicallyVia through a fresh hidden temporary `dir`/.`name`.tmp-<pid>-<n>, so that
// concurrent writers of the same file never share a temporary.
Status WriteFileAtomically(const std::string& dir, const std::string& name,
                           const std::string& contents, int mode = 0644);

// OK where `path` may be replaced by a rename (AtomicFileWriter) or appended to: it does not exist,
// or it is a regular file. A directory, symbolic link, device node (/dev/null), FIFO or socket is
// kInvalidArgument naming it and what it is (replacing /dev/null as root would break the machine).
Status CheckReplaceable(const std::string& path);
// CheckReplaceable, and `path` is none of `inputs` ({what it is, its path}: "--data", the training
// file), compared as files (device and inode, so another name or a link to it counts too).
// kInvalidArgument naming `what` (the flag), the path and the input. Empty `path`: OK.
Status CheckOutputPath(const std::string& path, const std::string& what,
                       const std::vector<std::pair<std::string, std::string>>& inputs = {});

// A process-wide counter for unique temporary names.
uint64_t NextTempId();

}  // namespace strata
