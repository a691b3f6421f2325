// DemoScratch (demo_scratch.h). States: not opened -> opened (shared-locked, or unlocked where the
// filesystem has no flock) -> destroyed (the directory removed if this was the last user and it is
// empty). Lock rule: the flock is the only lock; nothing here is shared between threads.
#include "runtime/commands/demo_scratch.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace strata::runtime {
namespace {

// flock on this filesystem is not supported (NFS without lockd, some FUSE filesystems).
bool NoFlockHere(int err) {
  return err == ENOLCK || err == EOPNOTSUPP || err == EINVAL || err == EBADF;
}

// Whether `path` still names the directory open as `fd` (not removed, not replaced).
bool NamesTheSameDirectory(const std::string& path, int fd) {
  struct stat held {
  }, named{};
  return ::fstat(fd, &held) == 0 && held.st_nlink > 0 && ::lstat(path.c_str(), &named) == 0 &&
         named.st_ino == held.st_ino && named.st_dev == held.st_dev;
}

// Takes the exclusive lock without waiting and removes the directory if the path still names it
// (rmdir fails, harmlessly, if it is not empty).
bool RemoveIfLockedAlone(const std::string& path, int fd) {
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) return false;
  return NamesTheSameDirectory(path, fd) && ::rmdir(path.c_str()) == 0;
}

}  // namespace

std::string DemoScratchPath() { return "/tmp/strata-demo-" + std::to_string(::getuid()); }

Status DemoScratch::Open(const std::string& path) {
  // Another demo run ending may remove the directory between our mkdir and our lock: then the
  // locked descriptor names a removed directory (or the path a new one), and we start again.
  for (int attempt = 0; attempt < 100; ++attempt) {
    if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
      return IoErrorFromErrno(errno, "creating the demo's scratch directory " + path);
    }
    UniqueFd d(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!d.valid()) {
      if (errno == ENOENT) continue;
      return IoErrorFromErrno(errno, "opening the demo's scratch directory " + path +
                                         " (it must be a directory, not a link)");
    }
    struct stat st {};
    if (::fstat(d.get(), &st) != 0) {
      return IoErrorFromErrno(errno, "reading the demo's scratch directory " + path);
    }
    if (st.st_uid != ::getuid() || (st.st_mode & 022) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof(mode), "%03o", static_cast<unsigned>(st.st_mode & 0777));
      return FailedPreconditionError("the demo's scratch directory " + path +
                                     " belongs to another user or others may write in it (owner "
                                     "uid " +
                                     std::to_string(st.st_uid) + ", mode " + mode +
                                     "; the demo makes it 700): remove it, or give --config "
                                     "with an nvme_path of your own");
    }
    int rc;
    do {
      rc = ::flock(d.get(), LOCK_SH);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0 && !NoFlockHere(errno)) {
      return IoErrorFromErrno(errno, "locking the demo's scratch directory " + path);
    }
    if (!NamesTheSameDirectory(path, d.get())) continue;  // removed before we locked it
    path_ = path;
    dir_ = std::move(d);
    locked_ = rc == 0;
    return Status::Ok();
  }
  return UnavailableError("the demo's scratch directory " + path +
                          " kept being removed while opening it");
}

DemoScratch::~DemoScratch() {
  if (!dir_.valid()) return;
  if (locked_) {
    RemoveIfLockedAlone(path_, dir_.get());
  } else if (NamesTheSameDirectory(path_, dir_.get())) {
    ::rmdir(path_.c_str());  // no flock here: only if empty, as before locks
  }
}

bool RemoveDemoScratchIfUnused(const std::string& path) {
  UniqueFd d(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  return d.valid() && RemoveIfLockedAlone(path, d.get());
}

}  // namespace strata::runtime
