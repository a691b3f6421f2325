// The checkpoints of a training run, over the engine (its state), the communicator (the ranks'
// agreement) and the checkpoint store (runtime/persist/checkpoint_store.h).
//
// A checkpoint is ROOT/TAG (TAG "step-N", or "step-N-<run>" beside another lineage's step-N:
// save_dir.h) holding the engine state (Engine::SaveState: every rank's pieces), trainer.json
// (what the run adds: step, samples consumed, seed, model, seq_len, lr, world_size, run lineage,
// global batch) and config.json (the config as given, "auto" values unresolved, so a resume
// without --config parses it again).
//
// Two-phase commit with ranks: rank 0 names the checkpoint and opens its temporary directory,
// every rank writes its part and makes it durable (CheckpointWriter::Join, CloseShard), each
// rank's list of durable entries (or its error) reaches rank 0, which adopts them and commits
// only if every part is there; then the ranks learn whether the commit happened. A rank that
// fails or dies leaves the previous checkpoint and `latest` as they were. One rank: Begin, write,
// Commit.
//
// Test hook (CheckpointRun::kill_at_save; STRATA_TEST_KILL_AT_SAVE=RANK@STEP, test_hooks.h): that
// rank kills itself (SIGKILL) after writing its part of checkpoint STEP, before the ranks agree to
// commit it (a crash in the middle of a save).
//
// Ownership: a CheckpointRun borrows the engine and the communicator. Threads: the engine's
// training thread, between steps; every rank calls SaveCheckpoint at the same step (it runs
// collectives on `comm`).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "runtime/engine/test_hooks.h"

namespace strata::runtime {

class CheckpointReader;
class Communicator;
class Engine;

// Where a run is: optimizer steps done and training samples consumed by all ranks (the global
// data position).
struct TrainingPosition {
  int64_t step = 0;
  uint64_t samples = 0;
  // What the run recorded beside (trainer.json's "eval" and "best": the last evaluation and the
  // best checkpoint by eval loss), an object; restored on resume, written by SaveCheckpoint from
  // CheckpointRun::trainer_state.
  nlohmann::json trainer_state = nlohmann::json::object();
};

// What a run's checkpoints hold beside the engine state, and what resuming checks.
struct CheckpointRun {
  Engine* engine = nullptr;
  Communicator* comm = nullptr;  // the training thread's group: rank and world size
  nlohmann::json model;          // the model's identity (CausalLm::Identity)
  int seq_len = 0;
  uint64_t seed = 0;
  int64_t micro_batch = 1;  // train_micro_batch_size_per_gpu
  int64_t gradient_accumulation_steps = 1;
  std::string run_id;       // the lineage (save_dir.h)
  std::string config_text;  // the config's text as parsed (saved as config.json when it parses)
  std::optional<KillAtSaveHook> kill_at_save;  // a test's crash in the middle of a save
  // The checkpoint's tag; empty: SaveTag's "step-N" (save_dir.h). An existing TAG is replaced
  // atomically (the Python package's save_checkpoint(dir, tag), as DeepSpeed's).
  std::string tag;
  // Entries rank 0 adds beside trainer.json: (entry name, bytes), e.g. the Python package's
  // pickled client_state.
  std::vector<std::pair<std::string, std::string>> extra_entries;
  // Keys rank 0 adds to trainer.json (the Trainer's "eval" and "best"; see TrainingPosition).
  nlohmann::json trainer_state = nlohmann::json::object();
};

// Writes the checkpoint of `at` into `root` (see above) and commits it: the new TAG and `latest`
// are durable when this returns OK on any rank. Errors leave the previous checkpoints as they
// were; with ranks every rank returns an error when any rank failed: its own, or kUnavailable
// naming the first rank that failed and its error (or saying rank 0 could not commit).
Status SaveCheckpoint(const CheckpointRun& run, const std::string& root,
                      const TrainingPosition& at);

// Removes the checkpoints of lineage `run_id` in `root` but `keep_tag` (the best checkpoint, when
// not empty) and the `keep` newest of the others, and never the one `latest` names; another
// lineage's checkpoints (and unreadable ones) are never removed. Rank 0 only. REQUIRES: keep >= 0.
Status PruneRunCheckpoints(const std::string& root, const std::string& run_id, int keep = 2,
                           const std::string& keep_tag = "");

// Restores the engine state of `checkpoint` (named `name` in messages, as the user gave it) and
// returns the position (and trainer state) trainer.json records. Refuses (kDataLoss) a damaged or
// mismatched trainer.json (its step not the engine state's, another model's, another world size's
// than engine.json), and (kInvalidArgument) another seq_len than the checkpoint's; warns about
// another seed or another global batch.
Result<TrainingPosition> ResumeCheckpoint(const CheckpointRun& run,
                                          const CheckpointReader& checkpoint,
                                          const std::string& name);

}  // namespace strata::runtime
