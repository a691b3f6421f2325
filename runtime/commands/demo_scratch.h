// The demo's NVMe scratch directory, /tmp/strata-demo-UID: `strata train` without --config keeps
// its swap there, one directory per user shared by that user's demo runs (each run's own swap
// directory inside is locked while the run lives, and the next run removes those of runs that
// died: swap/run_dir.h).
//
// The directory itself is shared-locked (flock LOCK_SH on the directory) by every demo run from
// the moment it has made or opened it, so that it is removed only when no demo run uses it, not
// even one that has made it and not yet made its swap directory inside: whoever removes it (a run
// ending, `strata clean --path` on it) first takes the exclusive lock without waiting, then checks
// that the path still names the directory it locked and that it is empty. Where the filesystem
// has no flock (some network filesystems), a run goes on unlocked and removes the directory only
// if it is empty, as before.
//
// Threads: any; one DemoScratch per run, used by the thread that made it.
#pragma once

#include <string>

#include "base/file_util.h"
#include "base/status.h"

namespace strata::runtime {

// /tmp/strata-demo-UID for this process's real user id.
std::string DemoScratchPath();

// Move-only: holds the shared lock on the demo's scratch directory while it lives.
class DemoScratch {
 public:
  DemoScratch() = default;
  DemoScratch(DemoScratch&&) = default;
  DemoScratch& operator=(DemoScratch&&) = delete;
  DemoScratch(const DemoScratch&) = delete;
  DemoScratch& operator=(const DemoScratch&) = delete;
  // Removes the directory if this was the last demo run using it and it is empty.
  ~DemoScratch();

  // Creates `path` (mode 0700) unless it exists, opens and shared-locks it. Refuses a directory
  // another user owns or its group or others may write (someone else's files, or their removal
  // of ours, beside the swap), and a path that is not a directory (a symbolic link included),
  // naming the path.
  [[nodiscard]] Status Open(const std::string& path);

  const std::string& path() const { return path_; }

 private:
  std::string path_;  // empty: not opened
  UniqueFd dir_;
  bool locked_ = false;
};

// Removes the demo scratch directory `path` if it is empty and no demo run holds it; returns
// whether it did. Never waits, never creates anything (`strata clean --path` on it).
bool RemoveDemoScratchIfUnused(const std::string& path);

}  // namespace strata::runtime
