// SwapSpace: run directory, per-kind preallocated files, extent allocator, cleanup. The signal-safe
// cleanup registry is swap_cleanup.cc; the manifest (SaveManifest, Load) is swap_manifest.cc.
//
// Allocation. Each kind's file is an arena: an extent takes AlignUp(bytes, alignment) bytes from
// the first free range that fits (free ranges are kept coalesced in an offset-ordered map), else
// from the high-water mark `end`, growing the file with fallocate when `end` would pass its
// capacity. Freed extents return to the map; a free range that reaches `end` lowers `end`.
//
// Cleanup. Every live SwapSpace registers its directory and file names with the cleanup registry
// (swap_cleanup.h), which a fatal SIGINT/SIGTERM (through base/signals.h) and exit() run. The
// destructor removes its own files and releases its slot. The lock file goes last, after every
// other file, and the lock itself (an open fd) only when the process ends: until the directory is
// gone, orphan reclaim in another process sees its owner alive (run_dir.h).
#include "swap/swap_space.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

#include "base/bytes.h"
#include "base/file_util.h"
#include "base/json_text.h"
#include "base/logging.h"
#include "base/mutex.h"
#include "base/signals.h"
#include "swap/direct_io.h"
#include "swap/run_dir.h"
#include "swap/swap_cleanup.h"

namespace strata {
namespace {

// Reclaim before creating a run directory: one log line per directory removed, and for those left
// alone that a person may want to look at. Live and kept ones are the normal case, and so is a
// lockless one made in the last minute (another run starting beside this one): not logged.
void ReclaimAndLog(const std::string& nvme_path) {
  Result<ReclaimReport> report = ReclaimOrphans(nvme_path);
  if (!report.ok()) {
    STRATA_LOG(kWarning) << "swap space: orphan reclaim skipped: " << report.status().ToString();
    return;
  }
  const int64_t now = std::time(nullptr);
  for (const RunDirVerdict& v : report->dirs) {
    switch (v.state) {
      case RunDirVerdict::State::kLive:
      case RunDirVerdict::State::kKept:
        break;
      case RunDirVerdict::State::kNoLock:
        if (now - v.modified > 60) STRATA_LOG(kInfo) << DescribeVerdict(report->path, v);
        break;
      case RunDirVerdict::State::kError:
        STRATA_LOG(kWarning) << DescribeVerdict(report->path, v);
        break;
      default:
        STRATA_LOG(kInfo) << DescribeVerdict(report->path, v);
    }
  }
}

}  // namespace

bool SwapSpace::ValidKind(std::string_view kind) {
  if (kind.empty() || kind.size() > 64) return false;
  for (char c : kind) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  }
  return true;
}

std::string SwapSpace::Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

uint64_t SwapSpace::IdForName(std::string_view name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64 offset basis
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;  // FNV prime
  }
  return h;
}

SwapSpace::SwapSpace(const SwapSpaceOptions& options) : options_(options) {}

Result<std::unique_ptr<SwapSpace>> SwapSpace::Create(const SwapSpaceOptions& options) {
  if (options.nvme_path.empty()) return InvalidArgumentError("swap space: nvme_path is empty");
  struct stat st {};
  if (stat(options.nvme_path.c_str(), &st) != 0) {
    return IoErrorFromErrno(errno, "swap space: nvme_path " + options.nvme_path);
  }
  if (!S_ISDIR(st.st_mode)) {
    return InvalidArgumentError("swap space: nvme_path " + options.nvme_path +
                                " is not a directory");
  }
  std::string run = options.run_name;
  if (run.empty()) {
    // Unique per process and per SwapSpace: several may live in one process at once.
    static std::atomic<int> counter{0};
    run = "strata-swap-" + std::to_string(getpid()) + "-" + std::to_string(std::time(nullptr)) +
          "-" + std::to_string(counter.fetch_add(1));
  }
  if (run.find('/') != std::string::npos || run == "." || run == "..") {
    return InvalidArgumentError("swap space: run_name '" + run + "' must be a plain name");
  }
  if (options.reclaim_orphans) ReclaimAndLog(options.nvme_path);
  std::unique_ptr<SwapSpace> space(new SwapSpace(options));
  space->dir_ = options.nvme_path;
  while (space->dir_.size() > 1 && space->dir_.back() == '/') space->dir_.pop_back();
  space->dir_ += "/" + run;
  if (mkdir(space->dir_.c_str(), 0700) != 0) {
    if (errno == EEXIST) {
      return AlreadyExistsError("swap space: run directory " + space->dir_ + " already exists");
    }
    return IoErrorFromErrno(errno, "swap space: mkdir " + space->dir_);
  }
  chmod(space->dir_.c_str(), 0700);  // whatever the umask
  STRATA_RETURN_IF_ERROR(space->Init(/*create=*/true));
  return space;
}

Result<std::unique_ptr<SwapSpace>> SwapSpace::Open(const std::string& run_dir,
                                                   const SwapSpaceOptions& options) {
  std::unique_ptr<SwapSpace> space(new SwapSpace(options));
  // Kept until Open succeeds: a failed Open (the directory in use, a bad manifest) must not delete
  // the files it could not load.
  space->options_.keep_files = true;
  space->dir_ = run_dir;
  while (space->dir_.size() > 1 && space->dir_.back() == '/') space->dir_.pop_back();
  struct stat st {};
  if (stat(space->dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return NotFoundError("swap space: run directory " + space->dir_ + " does not exist");
  }
  STRATA_RETURN_IF_ERROR(space->Init(/*create=*/false));
  STRATA_RETURN_IF_ERROR(space->Load());
  space->set_keep_files(options.keep_files);
  return space;
}

Status SwapSpace::Init(bool create) {
  // Register for cleanup first so that a failure below still removes what was created.
  cleanup_slot_ = ClaimCleanupSlot(dir_);
  if (cleanup_slot_ < 0) {
    STRATA_LOG(kWarning) << "swap space " << dir_
                         << ": no cleanup slot left; files are removed only by the destructor";
  } else {
    SetCleanupKeep(cleanup_slot_, options_.keep_files || !create);
    AddCleanupFile(cleanup_slot_, kManifestTmp);
    AddCleanupFile(cleanup_slot_, kManifest);
    AddCleanupFile(cleanup_slot_, kRunKeepFile);
    AddCleanupFile(cleanup_slot_, kRunLockTmpFile);
    RemoveCleanupFilesAtExit();  // spaces never destroyed (exit() from anywhere) are removed too
    // A fatal SIGINT/SIGTERM removes the files first (base/signals.h, the process's one owner of
    // those signals).
    if (options_.handle_signals) RegisterSignalCleanup(&RemoveSwapFilesForSignal);
  }
  // The lock before anything else goes into the directory: from here on, reclaim by another
  // process sees this directory as alive.
  Result<UniqueFd> lock = create ? CreateRunLock(dir_) : AcquireRunLock(dir_);
  if (!lock.ok()) return lock.status().WithContext("swap space " + dir_);
  lock_ = std::move(*lock);
  if (options_.keep_files) {
    STRATA_RETURN_IF_ERROR(SetRunKept(dir_, true).WithContext("swap space " + dir_));
  }
  Result<DirectIoSupport> probe = ProbeDirectIo(dir_);
  if (!probe.ok()) return probe.status().WithContext("swap space " + dir_);
  alignment_ = probe->alignment;
  direct_ = probe->direct && (options_.use_direct || options_.require_direct);
  if (!probe->direct && options_.require_direct) {
    return UnavailableError("swap space " + dir_ + ": direct I/O is required but " + probe->reason);
  }
  if (!probe->direct && options_.use_direct) {
    STRATA_LOG(kWarning) << "swap space " << dir_ << ": " << probe->reason
                         << "; using buffered I/O";
  }
  if (cleanup_slot_ >= 0) SetCleanupKeep(cleanup_slot_, options_.keep_files);
  return Status::Ok();
}

SwapSpace::~SwapSpace() {
  MutexLock lock(&mu_);
  const bool keep = options_.keep_files;
  for (auto& f : files_) {
    if (f->fd >= 0) close(f->fd);
    if (!keep) unlink(f->path.c_str());
  }
  if (!keep) {
    for (const char* name : {kManifestTmp, kManifest, kRunKeepFile, kRunLockTmpFile}) {
      unlink((dir_ + "/" + name).c_str());
    }
    // The lock file last, and only if it is ours; the lock itself after the directory is gone.
    if (lock_.valid()) unlink((dir_ + "/" + kRunLockFile).c_str());
    rmdir(dir_.c_str());
  }
  lock_.Reset();
  ReleaseCleanupSlot(cleanup_slot_);
}

Result<SwapSpace::File*> SwapSpace::FileForKind(std::string_view kind, bool create) {
  for (auto& f : files_) {
    if (f->kind == kind) return f.get();
  }
  if (!create)
    return NotFoundError("swap space " + dir_ + ": no file of kind '" + std::string(kind) + "'");
  if (!ValidKind(kind)) {
    return InvalidArgumentError("swap space: kind '" + std::string(kind) +
                                "' must be 1-64 characters of [A-Za-z0-9_-]");
  }
  auto f = std::make_unique<File>();
  f->kind = std::string(kind);
  f->path = dir_ + "/" + f->kind + ".swp";
  AddCleanupFile(cleanup_slot_, Basename(f->path));
  STRATA_ASSIGN_OR_RETURN(OpenedFile of, OpenFileForIo(f->path, O_RDWR | O_CREAT | O_EXCL, 0600,
                                                       direct_, options_.require_direct));
  f->fd = of.fd;
  fchmod(f->fd, 0600);
  files_.push_back(std::move(f));
  return files_.back().get();
}

Status SwapSpace::Grow(File& f, uint64_t bytes) {
  const uint64_t target = AlignUp(bytes, alignment_);
  if (target <= f.capacity) return Status::Ok();
  const uint64_t need = target - f.capacity;
  struct statvfs vfs {};
  if (fstatvfs(f.fd, &vfs) != 0) return IoErrorFromErrno(errno, "statvfs " + dir_);
  const uint64_t available = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (need > available) {
    return ResourceExhaustedError("swap space " + dir_ + ": growing '" + f.kind + "' to " +
                                  FormatBytes(target) + " needs " + std::to_string(need) +
                                  " bytes (" + FormatBytes(need) + ") but only " +
                                  std::to_string(available) + " bytes (" + FormatBytes(available) +
                                  ") are available on the filesystem");
  }
  const int rc = posix_fallocate(f.fd, static_cast<off_t>(f.capacity), static_cast<off_t>(need));
  if (rc != 0) {
    Status st =
        IoErrorFromErrno(rc, "fallocate " + f.path + " offset " + std::to_string(f.capacity) +
                                 " length " + std::to_string(need));
    if (rc == ENOSPC) return ResourceExhaustedError(std::string(st.message()));
    return st;
  }
  f.capacity = target;
  return Status::Ok();
}

Status SwapSpace::Reserve(std::string_view kind, uint64_t bytes) {
  MutexLock lock(&mu_);
  STRATA_ASSIGN_OR_RETURN(File * f, FileForKind(kind, /*create=*/true));
  return Grow(*f, bytes);
}

Result<SwapExtent> SwapSpace::Allocate(std::string_view name, std::string_view kind,
                                       uint64_t bytes) {
  if (bytes == 0) {
    return InvalidArgumentError("swap space: extent '" + std::string(name) + "' of 0 bytes");
  }
  if (name.empty()) return InvalidArgumentError("swap space: empty extent name");
  const uint64_t id = IdForName(name);
  MutexLock lock(&mu_);
  if (entries_.count(std::string(name)) != 0) {
    return AlreadyExistsError("swap space " + dir_ + ": extent '" + std::string(name) +
                              "' already exists");
  }
  if (auto it = names_by_id_.find(id); it != names_by_id_.end()) {
    return AlreadyExistsError("swap space: id of '" + std::string(name) + "' collides with '" +
                              it->second + "'");
  }
  STRATA_ASSIGN_OR_RETURN(File * f, FileForKind(kind, /*create=*/true));
  const uint64_t padded = AlignUp(bytes, alignment_);
  uint64_t offset = 0;
  bool placed = false;
  for (auto it = f->free.begin(); it != f->free.end(); ++it) {
    if (it->second >= padded) {
      offset = it->first;
      const uint64_t rest = it->second - padded;
      f->free.erase(it);
      if (rest > 0) f->free.emplace(offset + padded, rest);
      placed = true;
      break;
    }
  }
  if (!placed) {
    offset = f->end;
    STRATA_RETURN_IF_ERROR(Grow(*f, offset + padded));
    f->end = offset + padded;
  }
  f->allocated += padded;
  SwapExtent e{id, f->fd, offset, bytes, padded};
  size_t index = 0;
  for (size_t i = 0; i < files_.size(); ++i) {
    if (files_[i].get() == f) index = i;
  }
  entries_.emplace(std::string(name), Entry{std::string(name), index, e});
  names_by_id_.emplace(id, std::string(name));
  return e;
}

Result<SwapExtent> SwapSpace::Find(std::string_view name) const {
  MutexLock lock(&mu_);
  auto it = entries_.find(std::string(name));
  if (it == entries_.end()) {
    return NotFoundError("swap space " + dir_ + ": no extent '" + std::string(name) + "'");
  }
  return it->second.extent;
}

Result<SwapExtent> SwapSpace::FindById(uint64_t id) const {
  MutexLock lock(&mu_);
  auto it = names_by_id_.find(id);
  if (it == names_by_id_.end()) {
    return NotFoundError("swap space " + dir_ + ": no extent with id " + std::to_string(id));
  }
  return entries_.at(it->second).extent;
}

Status SwapSpace::Free(std::string_view name) {
  MutexLock lock(&mu_);
  auto it = entries_.find(std::string(name));
  if (it == entries_.end()) {
    return NotFoundError("swap space " + dir_ + ": no extent '" + std::string(name) + "'");
  }
  File& f = *files_[it->second.file];
  uint64_t off = it->second.extent.offset;
  uint64_t len = it->second.extent.padded_length;
  f.allocated -= len;
  names_by_id_.erase(it->second.extent.id);
  entries_.erase(it);
  // Coalesce with the neighbours.
  auto next = f.free.lower_bound(off);
  if (next != f.free.end() && off + len == next->first) {
    len += next->second;
    next = f.free.erase(next);
  }
  if (next != f.free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      f.free.erase(prev);
    }
  }
  if (off + len == f.end) {
    f.end = off;
  } else {
    f.free.emplace(off, len);
  }
  return Status::Ok();
}

uint64_t SwapSpace::reserved_bytes(std::string_view kind) const {
  MutexLock lock(&mu_);
  for (const auto& f : files_) {
    if (f->kind == kind) return f->capacity;
  }
  return 0;
}

uint64_t SwapSpace::allocated_bytes(std::string_view kind) const {
  MutexLock lock(&mu_);
  for (const auto& f : files_) {
    if (f->kind == kind) return f->allocated;
  }
  return 0;
}

size_t SwapSpace::extent_count() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

void SwapSpace::set_keep_files(bool keep) {
  MutexLock lock(&mu_);
  // The marker first when keeping (a crash in between leaves a kept directory, never a deleted
  // one), last when no longer keeping.
  if (keep) {
    if (Status st = SetRunKept(dir_, true); !st.ok()) {
      STRATA_LOG(kWarning) << "swap space " << dir_ << ": " << st.ToString()
                           << "; after a crash the directory may be reclaimed as an orphan";
    }
  }
  options_.keep_files = keep;
  if (cleanup_slot_ >= 0) SetCleanupKeep(cleanup_slot_, keep);
  if (!keep) SetRunKept(dir_, false).IgnoreError();  // at worst the directory stays after a crash
}

bool SwapSpace::keep_files() const {
  MutexLock lock(&mu_);
  return options_.keep_files;
}

Status SwapSpace::Sync() const {
  MutexLock lock(&mu_);
  for (const auto& f : files_) {
    if (fdatasync(f->fd) != 0) return IoErrorFromErrno(errno, "fdatasync " + f->path);
  }
  return Status::Ok();
}

}  // namespace strata
