// A `--save` directory claimed by one run: no run overwrites or prunes another's checkpoints.
//
// Lineage. Every checkpoint's trainer.json records "run", the id of the run lineage that wrote it:
// a fresh run draws a new id, a resumed run inherits its checkpoint's (older checkpoints record
// none: their lineage is ""). A run may save into a directory that holds checkpoints of another
// lineage only when its --resume checkpoint is in that directory (the user chose to continue
// there) or with --overwrite-save; either way pruning (PruneCheckpoints' filter) removes only
// checkpoints of the run's own lineage, so another run's checkpoints are never deleted.
//
// Lock. SaveDirLock holds an exclusive flock on ROOT/.strata-save.lock (holding the owner's pid
// for the message) while the run lives, so a second run on the same directory is refused at start
// instead of interleaving its checkpoints and temporary files. The kernel drops the lock when the
// process dies (kill -9 included), so a stale lock file never blocks a later run.
//
// Threads: the functions are called by the training thread; a SaveDirLock is moved, not shared.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "base/status.h"
#include "runtime/persist/checkpoint_store.h"

namespace strata::runtime {

inline constexpr const char* kSaveLockFile = ".strata-save.lock";

class SaveDirLock {
 public:
  // Creates ROOT (and its parents) if missing and locks it. kInvalidArgument naming the
  // directory and the other run's pid when another live process holds it.
  static Result<SaveDirLock> Acquire(const std::string& root);
  SaveDirLock() = default;
  SaveDirLock(SaveDirLock&&) = default;
  SaveDirLock& operator=(SaveDirLock&&) = default;

 private:
  UniqueFd fd_;
};

// A new lineage id: 32 hex digits from the kernel's random source.
Result<std::string> NewRunId();

// A complete checkpoint in a --save directory and the lineage its trainer.json records ("" when
// none; `readable` is false when its trainer.json cannot be read, and such a checkpoint is never
// taken for the caller's own).
struct SavedCheckpoint {
  std::string tag;
  std::string run;
  std::string model;  // trainer.json "model", for messages
  bool readable = true;
};
Result<std::vector<SavedCheckpoint>> ListSavedCheckpoints(const std::string& root);

// The tag under which a run of lineage `run` saves step `step` in `root`: "step-N", unless
// ROOT/step-N is another lineage's checkpoint (an --overwrite-save run, or one continued in a
// directory holding others, reaching a step the other run saved): then "step-N-<run id prefix>",
// so that no save ever replaces another run's checkpoint.
std::string SaveTag(const std::string& root, int64_t step, const std::string& run);

// The lineage a checkpoint records: its trainer.json "run", "" when it records none.
Result<std::string> RunIdOfCheckpoint(const CheckpointReader& checkpoint);

// Checks that a run of lineage `run` may save into `root`: OK when `root` holds no checkpoint of
// another lineage, when `resume_in_root` (the run continues a checkpoint of `root`), or when
// `overwrite` (--overwrite-save). Otherwise kInvalidArgument naming the directory, the other
// checkpoints and what to pass.
Status CheckSaveDirOwnership(const std::string& root, const std::string& run, bool resume_in_root,
                             bool overwrite);

// True when `path` (a checkpoint or a checkpoint directory) is `root` or directly inside it.
bool CheckpointIsIn(const std::string& path, const std::string& root);

// Checks that writing a Hugging Face directory at `out` cannot overwrite the model being trained:
// kInvalidArgument when `out` is `model_dir` or contains it, or (unless `allow_inside`) is inside
// it. `what` names the flag.
Status CheckOutsideModelDir(const std::string& out, const std::string& model_dir,
                            const std::string& what, bool allow_inside = false);

}  // namespace strata::runtime
