#include "base/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <utility>

namespace strata {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    Reset();
    fd_ = o.Release();
  }
  return *this;
}

void UniqueFd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status UniqueFd::Close(const std::string& path) {
  if (fd_ < 0) return Status::Ok();
  int fd = Release();
  // Linux releases the fd even when close fails (EINTR included), so never retry.
  if (::close(fd) != 0) return IoErrorFromErrno(errno, "close " + path);
  return Status::Ok();
}

Result<UniqueFd> OpenFile(const std::string& path, int flags, int mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return NotFoundError("open " + path + ": no such file or directory");
    return IoErrorFromErrno(err, "open " + path);
  }
  return UniqueFd(fd);
}

Status WriteFully(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::write(fd, p + done, bytes - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoErrorFromErrno(errno, "write " + path + " (" + std::to_string(bytes - done) +
                                         " of " + std::to_string(bytes) + " bytes left)");
    }
    if (n == 0) {
      // write(2) returning 0 for a non-empty buffer means the device took nothing: treat as
      // out of space rather than spinning.
      return IoErrorFromErrno(ENOSPC, "write " + path + " made no progress");
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status PreadFully(int fd, uint64_t offset, void* out, size_t bytes, const std::string& path) {
  char* p = static_cast<char*>(out);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::pread(fd, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoErrorFromErrno(errno,
                              "read " + path + " at offset " + std::to_string(offset + done));
    }
    if (n == 0) {
      return DataLossError(path + ": truncated: expected " + std::to_string(offset + bytes) +
                           " bytes, found " + std::to_string(offset + done));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

namespace {

const char* FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "an unknown file type";
}

}  // namespace

Status ReadSmallFile(const std::string& path, uint64_t limit, std::string* out, StatusCode code) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (regular files ignore the flag).
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY | O_NONBLOCK));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return IoErrorFromErrno(errno, "stat " + path);
  if (!S_ISREG(st.st_mode)) {
    return Status(code, path + ": not a regular file (" + FileTypeName(st.st_mode) + ")");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > limit) {
    return Status(code, path + ": " + std::to_string(size) + " bytes, more than the limit of " +
                            std::to_string(limit));
  }
  out->assign(size, '\0');
  return PreadFully(fd.get(), 0, out->data(), size, path);
}

Status FsyncFd(int fd, const std::string& path) {
  while (::fsync(fd) != 0) {
    if (errno == EINTR) continue;
    return IoErrorFromErrno(errno, "fsync " + path);
  }
  return Status::Ok();
}

Status FsyncDir(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY | O_DIRECTORY));
  STRATA_RETURN_IF_ERROR(FsyncFd(fd.get(), path));
  return fd.Close(path);
}

Status MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return IoErrorFromErrno(ec.value(), "create directory " + path);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return IoErrorFromErrno(errno, "stat " + path);
  if (!S_ISDIR(st.st_mode)) return FailedPreconditionError(path + " exists and is not a directory");
  return Status::Ok();
}

uint64_t NextTempId() {
  static std::atomic<uint64_t> next{0};
  return next.fetch_add(1, std::memory_order_relaxed);
}

Status CheckReplaceable(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return IoErrorFromErrno(errno, "examining " + path);
  }
  if (S_ISREG(st.st_mode)) return Status::Ok();
  return InvalidArgumentError(path + " is " + FileTypeName(st.st_mode) +
                              ": strata writes only regular files and does not replace it");
}

Status CheckOutputPath(const std::string& path, const std::string& what,
                       const std::vector<std::pair<std::string, std::string>>& inputs) {
  if (path.empty()) return Status::Ok();
  if (Status s = CheckReplaceable(path); !s.ok()) return s.WithContext(what);
  struct stat out {};
  if (::stat(path.c_str(), &out) != 0) return Status::Ok();  // to be created
  for (const auto& [name, input] : inputs) {
    struct stat in {};
    if (input.empty() || ::stat(input.c_str(), &in) != 0) continue;
    if (in.st_dev == out.st_dev && in.st_ino == out.st_ino) {
      return InvalidArgumentError(what + " " + path + " is " + name + " (" + input +
                                  "), an input of this run: give another path");
    }
  }
  return Status::Ok();
}

Result<AtomicFileWriter> AtomicFileWriter::Create(const std::string& path, int mode) {
  return CreateVia(path + ".tmp", path, mode);
}

Result<AtomicFileWriter> AtomicFileWriter::CreateVia(const std::string& tmp_path,
                                                     const std::string& path, int mode) {
  STRATA_RETURN_IF_ERROR(CheckReplaceable(path));
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(tmp_path, O_WRONLY | O_CREAT | O_TRUNC, mode));
  return AtomicFileWriter(std::move(fd), tmp_path, path);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& o) noexcept
    : fd_(std::move(o.fd_)),
      tmp_path_(std::move(o.tmp_path_)),
      path_(std::move(o.path_)),
      renamed_(std::exchange(o.renamed_, true)) {}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& o) noexcept {
  if (this != &o) {
    RemoveTemporary();
    fd_ = std::move(o.fd_);
    tmp_path_ = std::move(o.tmp_path_);
    path_ = std::move(o.path_);
    renamed_ = std::exchange(o.renamed_, true);
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() { RemoveTemporary(); }

void AtomicFileWriter::RemoveTemporary() {
  fd_.Reset();
  if (!renamed_ && !tmp_path_.empty()) ::unlink(tmp_path_.c_str());
  renamed_ = true;
}

Status AtomicFileWriter::Append(const void* data, size_t bytes) {
  if (!fd_.valid()) return FailedPreconditionError(tmp_path_ + ": Append after Commit");
  return WriteFully(fd_.get(), data, bytes, tmp_path_);
}

Status AtomicFileWriter::Commit() {
  if (!fd_.valid()) return FailedPreconditionError(tmp_path_ + ": Commit twice");
  STRATA_RETURN_IF_ERROR(FsyncFd(fd_.get(), tmp_path_));
  STRATA_RETURN_IF_ERROR(fd_.Close(tmp_path_));
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    return IoErrorFromErrno(errno, "rename " + tmp_path_ + " to " + path_);
  }
  renamed_ = true;
  // The rename is durable only once the directory entry is.
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  return FsyncDir(dir.empty() ? "." : dir);
}

Status WriteFileAtomicallyVia(const std::string& tmp_path, const std::string& path,
                              std::string_view contents, int mode) {
  STRATA_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::CreateVia(tmp_path, path, mode));
  STRATA_RETURN_IF_ERROR(w.Append(contents));
  return w.Commit();
}

Status WriteFileAtomically(const std::string& dir, const std::string& name,
                           const std::string& contents, int mode) {
  const std::string tmp =
      dir + "/." + name + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(NextTempId());
  return WriteFileAtomicallyVia(tmp, dir + "/" + name, contents, mode);
}

}  // namespace strata
