// Run directory locks and orphan reclaim (see run_dir.h for the rules).
//
// Races, and why each is safe:
//  - A new run between mkdir and its lock: the lock file appears under its final name only after it
//    is locked (created as strata.lock.tmp, flocked, filled, renamed), so a reclaimer sees either
//    no lock file (kNoLock: untouched) or a held one (kLive).
//  - Two reclaimers: the one whose flock succeeds removes the files and then the lock file while
//    still holding the lock. The other, if it opened the lock file before it was unlinked, gets the
//    lock afterwards on an unlinked inode: after every flock the lock file's path is checked to
//    still name the locked inode (and the directory's name the opened directory), else the
//    directory is skipped as already gone.
//  - A live owner never loses its directory: its flock is held from before the lock file has its
//    name until after the directory is removed (SwapSpace closes the fd last).
// All work inside a directory goes through its fd (openat/unlinkat), never a path, so renaming or
// replacing a directory midway cannot redirect a removal; O_NOFOLLOW everywhere.
#include "swap/run_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "base/bytes.h"

namespace strata {
namespace {

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

Status WriteOwner(int fd, const std::string& path) {
  const std::string text = "pid=" + std::to_string(getpid()) + "\nhost=" + HostName() +
                           "\nstarted=" + std::to_string(std::time(nullptr)) + "\n";
  if (ftruncate(fd, 0) != 0) return IoErrorFromErrno(errno, "truncate " + path);
  if (lseek(fd, 0, SEEK_SET) < 0) return IoErrorFromErrno(errno, "seek " + path);
  return WriteFully(fd, text.data(), text.size(), path);
}

// Files strata itself puts in a run directory (swap_space.cc, direct_io.cc). Anything else means
// the directory is not only strata's, and reclaim leaves it alone.
bool IsStrataFile(std::string_view name) {
  if (name == kRunLockFile || name == kRunLockTmpFile || name == kRunKeepFile ||
      name == "manifest.json" || name == "manifest.json.tmp") {
    return true;
  }
  if (name.starts_with(".strata-direct-probe-")) return true;
  if (name.size() > 4 && name.ends_with(".swp")) {
    const std::string_view kind = name.substr(0, name.size() - 4);
    if (kind.size() > 64) return false;
    return std::all_of(kind.begin(), kind.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
    });
  }
  return false;
}

// The names in an open directory, without "." and "..", sorted. `fd` stays open and usable.
Result<std::vector<std::string>> ListDir(int fd, const std::string& path) {
  const int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return IoErrorFromErrno(errno, "dup " + path);
  DIR* d = fdopendir(dup_fd);
  if (d == nullptr) {
    const int err = errno;
    close(dup_fd);
    return IoErrorFromErrno(err, "opendir " + path);
  }
  rewinddir(d);
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      names.emplace_back(e->d_name);
    }
    errno = 0;
  }
  const int err = errno;
  closedir(d);
  if (err != 0) return IoErrorFromErrno(err, "readdir " + path);
  std::sort(names.begin(), names.end());
  return names;
}

struct DirContents {
  std::vector<std::string> files;  // strata's files, the lock file last
  uint64_t bytes = 0;              // their st_blocks * 512
  std::string foreign;             // the first thing that is not strata's; empty if none
};

Result<DirContents> ReadContents(int dfd, const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(dfd, path));
  DirContents c;
  for (const std::string& name : names) {
    struct stat st {};
    if (fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;  // removed meanwhile (a direct-I/O probe file)
      return IoErrorFromErrno(errno, "stat " + path + "/" + name);
    }
    if (!S_ISREG(st.st_mode) || !IsStrataFile(name)) {
      if (c.foreign.empty()) {
        c.foreign = "contains " + name +
                    (S_ISDIR(st.st_mode)   ? " (a directory)"
                     : S_ISLNK(st.st_mode) ? " (a symlink)"
                     : S_ISREG(st.st_mode) ? ""
                                           : " (not a regular file)") +
                    ", which strata does not create";
      }
      continue;
    }
    c.bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    if (name != kRunLockFile) c.files.push_back(name);
  }
  c.files.push_back(kRunLockFile);
  return c;
}

// Examines (and unless dry_run, removes) the run directory `name` under the open `parent`.
// Returns false when there is nothing to report (not a directory, not strata's, already gone).
bool Examine(int parent, const std::string& nvme_path, const std::string& name,
             const std::string& host, const ReclaimOptions& options, RunDirVerdict& v) {
  const std::string path = nvme_path + "/" + name;
  const bool strata_named = name.starts_with(kDefaultRunPrefix);
  v.name = name;
  struct stat dst {};
  if (fstatat(parent, name.c_str(), &dst, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(dst.st_mode)) {
    return false;
  }
  v.modified = dst.st_mtim.tv_sec;
  UniqueFd dfd(openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dfd.valid()) {
    if (errno == ENOENT || !strata_named) return false;  // ENOENT: its owner just removed it
    v.state = RunDirVerdict::State::kError;
    v.detail = IoErrorFromErrno(errno, "open " + path).ToString();
    return true;
  }
  // O_NONBLOCK: a FIFO planted under the lock file's name must not hang the scan. O_RDWR: on NFS
  // an exclusive flock (emulated with fcntl locks) needs a file open for writing.
  UniqueFd lock(openat(dfd.get(), kRunLockFile, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!lock.valid()) {
    const int err = errno;
    if (err == ENOENT && !strata_named) return false;
    if (err == ENOENT) {
      v.state = RunDirVerdict::State::kNoLock;
    } else if (err == ELOOP || err == EISDIR) {  // a symlink or a directory
      v.state = RunDirVerdict::State::kForeign;
      v.detail = std::string("has a ") + kRunLockFile + " that is not a regular file";
    } else {
      v.state = RunDirVerdict::State::kError;
      v.detail = IoErrorFromErrno(err, "open " + path + "/" + kRunLockFile).ToString();
    }
    if (Result<DirContents> c = ReadContents(dfd.get(), path); c.ok()) v.bytes = c->bytes;
    return true;
  }
  struct stat lst {};
  if (fstat(lock.get(), &lst) != 0 || !S_ISREG(lst.st_mode)) {
    v.state = RunDirVerdict::State::kForeign;
    v.detail = std::string("has a ") + kRunLockFile + " that is not a regular file";
    return true;
  }
  v.owner = ReadRunOwner(lock.get());
  Result<DirContents> contents = ReadContents(dfd.get(), path);
  if (contents.ok()) v.bytes = contents->bytes;
  if (flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      v.state = RunDirVerdict::State::kLive;
    } else {
      v.state = RunDirVerdict::State::kError;
      v.detail = IoErrorFromErrno(errno, "flock " + path + "/" + kRunLockFile).ToString();
    }
    return true;
  }
  // We hold the lock. Is it still this directory's lock, and this directory still `name`?
  struct stat now {};
  if (fstatat(dfd.get(), kRunLockFile, &now, AT_SYMLINK_NOFOLLOW) != 0 || !SameFile(now, lst) ||
      fstatat(parent, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0 || !SameFile(now, dst)) {
    return false;  // another reclaimer removed it while we waited
  }
  v.owner = ReadRunOwner(lock.get());  // complete now: its writer held the lock while writing
  struct stat kst {};
  if (fstatat(dfd.get(), kRunKeepFile, &kst, AT_SYMLINK_NOFOLLOW) == 0) {
    v.state = RunDirVerdict::State::kKept;
    return true;
  }
  if (!v.owner.host.empty() && v.owner.host != host) {
    v.state = RunDirVerdict::State::kOtherHost;
    return true;
  }
  contents = ReadContents(dfd.get(), path);  // again, under the lock
  if (!contents.ok()) {
    v.state = RunDirVerdict::State::kError;
    v.detail = contents.status().ToString();
    return true;
  }
  v.bytes = contents->bytes;
  if (!contents->foreign.empty()) {
    v.state = RunDirVerdict::State::kForeign;
    v.detail = contents->foreign;
    return true;
  }
  if (options.dry_run) {
    v.state = RunDirVerdict::State::kWouldRemove;
    return true;
  }
  for (const std::string& file : contents->files) {  // the lock file last
    if (unlinkat(dfd.get(), file.c_str(), 0) != 0 && errno != ENOENT) {
      v.state = RunDirVerdict::State::kError;
      v.detail = IoErrorFromErrno(errno, "remove " + path + "/" + file).ToString();
      return true;
    }
  }
  if (unlinkat(parent, name.c_str(), AT_REMOVEDIR) != 0) {
    v.state = RunDirVerdict::State::kError;
    v.detail = IoErrorFromErrno(errno, "remove directory " + path).ToString();
    return true;
  }
  v.state = RunDirVerdict::State::kRemoved;
  return true;  // `lock` closes last: the removal happened under the lock
}

std::string OwnerText(const RunOwner& o) {
  if (o.pid == 0) return "an unknown process";
  std::string s = "pid " + std::to_string(o.pid);
  if (!o.host.empty() && o.host != HostName()) s += " on " + o.host;
  return s;
}

}  // namespace

Result<UniqueFd> CreateRunLock(const std::string& dir) {
  const std::string tmp = dir + "/" + kRunLockTmpFile;
  const std::string path = dir + "/" + kRunLockFile;
  for (int attempt = 0;; ++attempt) {
    UniqueFd fd(open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (fd.valid()) {
      if (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        return IoErrorFromErrno(err, "lock " + tmp);
      }
      STRATA_RETURN_IF_ERROR(WriteOwner(fd.get(), tmp));
      if (rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        unlink(tmp.c_str());
        return IoErrorFromErrno(err, "rename " + tmp + " to " + path);
      }
      // Durable before any swap file, so that after a power cut the directory still says whose it
      // was (and can be reclaimed) rather than looking like an older strata's.
      STRATA_RETURN_IF_ERROR(FsyncDir(dir));
      return fd;
    }
    if (errno != EEXIST || attempt > 0) return IoErrorFromErrno(errno, "create " + tmp);
    // A leftover of a process killed between creating and renaming it (its lock is free), or a
    // concurrent AcquireRunLock on the same directory (its lock is held).
    UniqueFd old(open(tmp.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (old.valid() && flock(old.get(), LOCK_EX | LOCK_NB) != 0) {
      return FailedPreconditionError("run directory " + dir +
                                     " is being locked by another process (" + tmp + ")");
    }
    unlink(tmp.c_str());
  }
}

Result<UniqueFd> AcquireRunLock(const std::string& dir) {
  const std::string path = dir + "/" + kRunLockFile;
  UniqueFd fd(open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return CreateRunLock(dir);  // a directory kept by an older strata
    return IoErrorFromErrno(errno, "open " + path);
  }
  if (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return IoErrorFromErrno(errno, "lock " + path);
    const RunOwner owner = ReadRunOwner(fd.get());
    return FailedPreconditionError("run directory " + dir + " is in use by " + OwnerText(owner) +
                                   " (it holds " + path + ")");
  }
  struct stat a {
  }, b{};
  if (fstat(fd.get(), &a) != 0 || stat(path.c_str(), &b) != 0 || !SameFile(a, b)) {
    return NotFoundError("run directory " + dir + " was removed while it was being opened");
  }
  STRATA_RETURN_IF_ERROR(WriteOwner(fd.get(), path));
  return fd;
}

RunOwner ReadRunOwner(int fd) {
  RunOwner o;
  char buf[1024];
  const ssize_t n = pread(fd, buf, sizeof(buf), 0);
  if (n <= 0) return o;
  std::string_view text(buf, static_cast<size_t>(n));
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    const std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "host") {
      o.host = std::string(value.substr(0, 255));
    } else if (key == "pid" || key == "started") {
      int64_t x = 0;
      bool ok = !value.empty() && value.size() <= 18;
      for (char c : value) ok = ok && c >= '0' && c <= '9';
      if (!ok) continue;
      for (char c : value) x = x * 10 + (c - '0');
      (key == "pid" ? o.pid : o.started) = x;
    }
  }
  return o;
}

Status SetRunKept(const std::string& dir, bool keep) {
  const std::string path = dir + "/" + kRunKeepFile;
  if (!keep) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return IoErrorFromErrno(errno, "remove " + path);
    }
    return Status::Ok();
  }
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return IoErrorFromErrno(errno, "create " + path);
  static constexpr char kText[] =
      "This strata run directory is kept on purpose (SwapSpace keep_files): strata never "
      "reclaims it.\n";
  if (ftruncate(fd.get(), 0) != 0) return IoErrorFromErrno(errno, "truncate " + path);
  return WriteFully(fd.get(), kText, sizeof(kText) - 1, path);
}

Result<ReclaimReport> ReclaimOrphans(const std::string& nvme_path, const ReclaimOptions& options) {
  ReclaimReport report;
  report.path = nvme_path;
  while (report.path.size() > 1 && report.path.back() == '/') report.path.pop_back();
  UniqueFd parent(open(report.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!parent.valid()) {
    const int err = errno;
    if (err == ENOENT) return NotFoundError(report.path + " does not exist");
    if (err == ENOTDIR) return InvalidArgumentError(report.path + " is not a directory");
    return IoErrorFromErrno(err, "open " + report.path);
  }
  STRATA_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(parent.get(), report.path));
  const std::string host = HostName();
  for (const std::string& name : names) {
    RunDirVerdict v;
    if (!Examine(parent.get(), report.path, name, host, options, v)) continue;
    if (v.state == RunDirVerdict::State::kRemoved ||
        v.state == RunDirVerdict::State::kWouldRemove) {
      report.bytes_freed += v.bytes;
      ++report.removed;
    }
    report.dirs.push_back(std::move(v));
  }
  return report;
}

std::string_view RunDirStateName(RunDirVerdict::State state) {
  switch (state) {
    case RunDirVerdict::State::kRemoved:
      return "removed";
    case RunDirVerdict::State::kWouldRemove:
      return "would_remove";
    case RunDirVerdict::State::kLive:
      return "live";
    case RunDirVerdict::State::kKept:
      return "kept";
    case RunDirVerdict::State::kOtherHost:
      return "other_host";
    case RunDirVerdict::State::kForeign:
      return "foreign";
    case RunDirVerdict::State::kNoLock:
      return "no_lock";
    case RunDirVerdict::State::kError:
      return "error";
  }
  return "?";
}

std::string DescribeVerdict(const std::string& nvme_path, const RunDirVerdict& v) {
  std::string path = nvme_path;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  path += "/" + v.name;
  const std::string size = " (" + FormatBytes(v.bytes) + ")";
  using State = RunDirVerdict::State;
  switch (v.state) {
    case State::kRemoved:
    case State::kWouldRemove:
      return std::string(v.state == State::kRemoved ? "removed" : "would remove") +
             " orphaned swap directory " + path + size + " left by " + OwnerText(v.owner) +
             " (not running)";
    case State::kLive:
      return "left " + path + size + " alone: in use by " + OwnerText(v.owner) + " (running)";
    case State::kKept:
      return "left " + path + size + " alone: kept on purpose (" + kRunKeepFile + ")";
    case State::kOtherHost:
      return "left " + path + size + " alone: its lock was taken on host " + v.owner.host +
             " (pid " + std::to_string(v.owner.pid) +
             "), and whether that run is alive cannot be told from here";
    case State::kForeign:
      return "left " + path + size + " alone: it " + v.detail;
    case State::kNoLock:
      return "left " + path + size +
             " alone: no lock file (a run directory of an older strata, or one being created "
             "now); remove it by hand if no strata run uses it";
    case State::kError:
      return "could not reclaim " + path + ": " + v.detail;
  }
  return path;
}

}  // namespace strata
