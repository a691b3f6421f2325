// Run directories: the lock that says a SwapSpace's owner is alive, the marker of a directory kept
// on purpose, and the reclaim of directories whose owner died without cleaning up (kill -9, the
// OOM killer, a power cut), which nothing else would ever remove.
//
// The lock. Each run directory holds `strata.lock`, flock(LOCK_EX)ed by the process that owns the
// directory for as long as its SwapSpace lives; the kernel drops the lock when the process dies,
// however it dies. The file records the owner's pid, host and start time, for messages only: the
// flock alone decides whether the owner is alive (pids are reused, and mean nothing across pid
// namespaces). The file is created, locked and filled under a temporary name and then renamed into
// place, so `strata.lock` is never seen unlocked while its owner lives.
//
// Reclaim. ReclaimOrphans looks at the direct children of an nvme_path. A child that is a real
// directory (not a symlink) holding `strata.lock` is a run directory; it is removed only when all
// of these hold, checked while holding its lock (so two reclaimers never race, and a new owner
// cannot appear meanwhile):
//   - flock(LOCK_EX | LOCK_NB) on its lock file succeeds: no live process holds it;
//   - it is not kept (`strata.keep`: SwapSpace keep_files, e.g. a directory for SwapSpace::Open);
//   - its lock file names this host (flock cannot prove a process on another host dead);
//   - everything in it is a regular file strata puts there (the lock files, the keep marker,
//     manifest.json(.tmp), KIND.swp, a direct-I/O probe file): anything else, a subdirectory or a
//     symlink included, leaves the whole directory untouched.
// Nothing outside these directories is ever removed, nothing is recursed into, no symlink is
// followed. Directories without a lock file (an older strata's, or one being created this instant)
// are listed when named like strata's (strata-swap-*) and never touched.
//
// Thread-safety: the free functions may be called from any thread; they share no state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/file_util.h"
#include "base/status.h"

namespace strata {

inline constexpr const char* kRunLockFile = "strata.lock";
inline constexpr const char* kRunLockTmpFile = "strata.lock.tmp";
inline constexpr const char* kRunKeepFile = "strata.keep";
inline constexpr std::string_view kDefaultRunPrefix = "strata-swap-";

// Who holds (or held) a run directory's lock, as its lock file records it.
struct RunOwner {
  int64_t pid = 0;      // 0: unknown (the file is empty or unreadable)
  std::string host;     // gethostname() of the owner
  int64_t started = 0;  // Unix seconds
};

// Creates `dir`/strata.lock (REQUIRES: `dir` exists and has none), locked by the returned fd and
// naming this process. The fd has O_CLOEXEC; closing it (or dying) releases the lock.
Result<UniqueFd> CreateRunLock(const std::string& dir);
// Takes the lock of an existing run directory (SwapSpace::Open), creating the lock file if the
// directory predates it. FailedPrecondition naming the owner when a live process holds it.
Result<UniqueFd> AcquireRunLock(const std::string& dir);
// Reads the owner recorded in an open lock file; fields left at their defaults if unreadable.
RunOwner ReadRunOwner(int fd);
// Marks `dir` as kept (creates strata.keep) or not (removes it).
Status SetRunKept(const std::string& dir, bool keep);

struct ReclaimOptions {
  bool dry_run = false;  // decide and report, remove nothing
};

// One directory ReclaimOrphans looked at and what it did with it.
struct RunDirVerdict {
  enum class State {
    kRemoved,      // the owner was dead: removed
    kWouldRemove,  // the same, with dry_run
    kLive,         // a live process holds the lock: untouched
    kKept,         // kept on purpose (strata.keep): untouched
    kOtherHost,    // the lock names another host: untouched
    kForeign,      // holds something strata did not put there: untouched
    kNoLock,       // named like strata's but without a lock file: untouched
    kError,        // could not be examined or removed (detail says why)
  };
  std::string name;  // the directory's name under nvme_path
  State state = State::kError;
  uint64_t bytes = 0;    // disk space of its files (st_blocks), freed when removed
  RunOwner owner;        // from its lock file (kRemoved/kWouldRemove: the dead owner)
  int64_t modified = 0;  // the directory's mtime, Unix seconds
  std::string detail;    // kForeign, kError: what and why
};

struct ReclaimReport {
  std::string path;                 // the nvme_path scanned
  std::vector<RunDirVerdict> dirs;  // in name order; unrelated directories are not listed
  uint64_t bytes_freed = 0;         // by kRemoved (or, with dry_run, kWouldRemove) directories
  int removed = 0;                  // kRemoved + kWouldRemove
};

// Scans the direct children of `nvme_path` and removes orphaned run directories (see the file
// comment). Errors: `nvme_path` missing (NotFound), not a directory (InvalidArgument), or not
// readable (IoError). A problem with one directory is that directory's kError, not an error.
Result<ReclaimReport> ReclaimOrphans(const std::string& nvme_path,
                                     const ReclaimOptions& options = {});

// "removed", "would_remove", "live", "kept", "other_host", "foreign", "no_lock", "error" (the
// names `strata clean --json` prints).
std::string_view RunDirStateName(RunDirVerdict::State state);
// One line for a log or a listing, e.g. "removed orphaned swap directory /nvme/strata-swap-1-2-0
// (12.3 GB) left by pid 1234 (not running)".
std::string DescribeVerdict(const std::string& nvme_path, const RunDirVerdict& v);

}  // namespace strata
