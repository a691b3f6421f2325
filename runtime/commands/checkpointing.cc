// Checkpoints of a training run: see checkpointing.h. SaveCheckpoint is the two-phase commit over
// the communicator (one rank: the store's own Begin/Commit); ResumeCheckpoint reads trainer.json
// with every value's range checked (never cast: a float or a huge value in a damaged or
// hand-edited file is refused naming its key) and loads the engine state.
#include "runtime/commands/checkpointing.h"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "base/json_text.h"
#include "base/json_values.h"
#include "base/logging.h"
#include "runtime/comm/communicator.h"
#include "runtime/commands/flag_checks.h"
#include "runtime/commands/save_dir.h"
#include "runtime/engine/engine.h"
#include "runtime/persist/checkpoint_store.h"

namespace strata::runtime {
namespace {

// The test hook: the rank it names kills itself after writing its part of the checkpoint.
void KillAtSaveIfAsked(const std::optional<KillAtSaveHook>& hook, int rank, int64_t step) {
  if (hook && hook->rank == rank && hook->step == step) raise(SIGKILL);
}

}  // namespace

Status SaveCheckpoint(const CheckpointRun& m, const std::string& dir, const TrainingPosition& at) {
  const int rank = m.comm->rank();
  const int world = m.comm->world_size();
  // Rank 0 names the checkpoint (never another run's tag: save_dir.h) and tells the others.
  std::string tag = rank != 0        ? std::string()
                    : !m.tag.empty() ? m.tag
                                     : SaveTag(dir, at.step, m.run_id);
  if (world > 1) STRATA_RETURN_IF_ERROR(BroadcastString(*m.comm, tag, 0));
  std::unique_ptr<CheckpointWriter> writer;
  std::string temp_dir_of_rank0;
  if (world == 1) {
    STRATA_ASSIGN_OR_RETURN(writer, CheckpointWriter::Begin(dir, tag));
  } else {
    // Two phases: rank 0 opens the temporary directory, every rank writes its part and makes it
    // durable, and rank 0 commits only once every part is (a rank that fails or dies leaves the
    // previous checkpoint and `latest` as they were; rank 0's writer removes the directory).
    Status begun;
    if (rank == 0) {
      Result<std::unique_ptr<CheckpointWriter>> w0 = CheckpointWriter::Begin(dir, tag);
      begun = w0.status();
      if (w0.ok()) {
        writer = std::move(*w0);
        temp_dir_of_rank0 = writer->temp_dir();
      }
    }
    STRATA_RETURN_IF_ERROR(BroadcastString(*m.comm, temp_dir_of_rank0, 0));
    if (temp_dir_of_rank0.empty()) {
      return begun.ok() ? UnavailableError("rank 0 could not start checkpoint " + tag) : begun;
    }
  }
  // A rank that cannot join (no shared filesystem) says so through the protocol below.
  Status written;
  if (world > 1 && rank != 0) {
    Result<std::unique_ptr<CheckpointWriter>> joined =
        CheckpointWriter::Join(dir, tag, temp_dir_of_rank0);
    written = joined.status();
    if (joined.ok()) writer = std::move(*joined);
  }
  if (written.ok()) written = m.engine->SaveState(*writer);
  KillAtSaveIfAsked(m.kill_at_save, rank, at.step);
  nlohmann::json t;
  t["step"] = at.step;
  t["samples"] = at.samples;
  t["seed"] = m.seed;
  t["model"] = m.model;
  t["seq_len"] = m.seq_len;
  t["lr"] = m.engine->learning_rate();
  t["world_size"] = world;
  t["run"] = m.run_id;
  t["global_batch"] = m.micro_batch * m.gradient_accumulation_steps * world;
  for (const auto& [key, value] : m.trainer_state.items()) t[key] = value;
  if (written.ok() && rank == 0) written = writer->WriteJson("trainer.json", t);
  for (const auto& [name, bytes] : m.extra_entries) {
    if (!written.ok() || rank != 0) break;
    Result<EntryWriter*> entry = writer->AddEntry(name);
    written = entry.status();
    if (written.ok()) written = (*entry)->Append(bytes.data(), bytes.size());
  }
  if (written.ok() && rank == 0) {
    // The config as given (its "auto" values unresolved, as a --config file has them): a resume
    // without --config parses it again with the resuming run's flags.
    Result<nlohmann::json> given = ParseJsonText(
        m.config_text, "config", {.max_bytes = uint64_t{16} << 20, .allow_comments = true});
    if (given.ok()) written = writer->WriteJson("config.json", *given);
  }
  if (world == 1) {
    STRATA_RETURN_IF_ERROR(written);
    STRATA_RETURN_IF_ERROR(writer->Commit());
  } else {
    // Every rank's list of durable entries (or "!" and its error) reaches rank 0.
    std::string shard;
    if (written.ok() && rank != 0) {
      Result<std::string> listed = writer->CloseShard();
      written = listed.status();
      if (listed.ok()) shard = *listed;
    }
    Status first_error = written;
    for (int r = 0; r < world; ++r) {
      // append, not "!" + s: gcc 12 sees a false bounds overflow in that operator+ here.
      std::string text;
      if (r == rank) text = written.ok() ? shard : std::string("!").append(written.ToString());
      STRATA_RETURN_IF_ERROR(BroadcastString(*m.comm, text, r));
      if (!text.empty() && text[0] == '!') {
        if (first_error.ok()) {
          first_error = UnavailableError("checkpoint " + tag + ": rank " + std::to_string(r) +
                                         " could not write its part: " + text.substr(1));
        }
      } else if (rank == 0 && r != 0 && first_error.ok()) {
        first_error = writer->Adopt(text);
      }
    }
    if (rank == 0 && first_error.ok()) first_error = writer->Commit();
    double failed = rank == 0 && !first_error.ok() ? 1 : 0;
    STRATA_RETURN_IF_ERROR(m.comm->AllReduceSum(&failed, 1));
    STRATA_RETURN_IF_ERROR(first_error);
    if (failed != 0) return UnavailableError("checkpoint " + tag + ": rank 0 could not commit it");
  }
  return Status::Ok();
}

Status PruneRunCheckpoints(const std::string& dir, const std::string& run_id, int keep,
                           const std::string& keep_tag) {
  // This run's lineage only: another run's checkpoints are never deleted.
  Result<std::vector<SavedCheckpoint>> saved = ListSavedCheckpoints(dir);
  if (!saved.ok()) return saved.status();
  std::set<std::string> ours;
  for (const SavedCheckpoint& c : *saved) {
    if (c.readable && c.run == run_id && c.tag != keep_tag) ours.insert(c.tag);
  }
  return PruneCheckpoints(dir, std::max(keep, 0),
                          [&](const std::string& tag) { return ours.count(tag) != 0; });
}

Result<TrainingPosition> ResumeCheckpoint(const CheckpointRun& run, const CheckpointReader& reader,
                                          const std::string& name) {
  const int world = run.comm->world_size();
  int64_t step = 0;
  uint64_t samples = 0;
  STRATA_ASSIGN_OR_RETURN(nlohmann::json t, reader.ReadJson("trainer.json"));
  if (!t.is_object()) return DataLossError(name + ": trainer.json is not a JSON object");
  try {
    // Ranges checked, never cast: a float or huge value in a damaged or hand-edited file is
    // refused naming the key.
    Result<int64_t> saved_step = JsonInt(t.at("step"), "step", 0, flags::kMaxCount);
    // "samples": training samples consumed (global over ranks); older checkpoints count
    // micro-batches ("data_position") of one rank.
    const bool by_samples = t.contains("samples");
    Result<int64_t> position =
        JsonInt(t.at(by_samples ? "samples" : "data_position"),
                by_samples ? "samples" : "data_position", 0, int64_t{1} << 50);
    for (const Status& s : {saved_step.status(), position.status()}) {
      if (!s.ok()) return DataLossError(name + ": trainer.json: " + std::string(s.message()));
    }
    step = *saved_step;
    samples = static_cast<uint64_t>(*position) *
              (by_samples ? 1 : static_cast<uint64_t>(run.micro_batch));
    // The data position is counted in windows of seq_len + 1 tokens: another --seq-len would
    // re-read or skip data. (Older checkpoints record no seq_len.)
    if (auto it = t.find("seq_len"); it != t.end()) {
      Result<int64_t> saved_seq = JsonInt(*it, "seq_len", 1, int64_t{1} << 31);
      if (!saved_seq.ok()) {
        return DataLossError(name + ": trainer.json: " + std::string(saved_seq.status().message()));
      }
      if (*saved_seq != run.seq_len) {
        return InvalidArgumentError(
            "--seq-len " + std::to_string(run.seq_len) + " differs from the " +
            std::to_string(*saved_seq) + " tokens checkpoint " + name +
            " was trained with: its data position is counted in windows of that length, so "
            "resuming would re-read or skip data; resume with --seq-len " +
            std::to_string(*saved_seq));
      }
    }
    STRATA_RETURN_IF_ERROR(run.engine->LoadState(reader));
    // The model it records is the engine state's: a trainer.json from another checkpoint (or
    // edited) is refused rather than trusted.
    if (auto it = t.find("model"); it != t.end() && *it != run.model) {
      return DataLossError(name + ": trainer.json records model " + it->dump() +
                           ", but its engine state loaded into " + run.model.dump() +
                           ": the checkpoint's files do not belong together");
    }
    if (auto it = t.find("world_size"); it != t.end()) {
      Result<nlohmann::json> ej = reader.ReadJson("engine.json");
      if (!ej.ok()) return ej.status();
      const int64_t engine_world = ej->value("world_size", int64_t{1});
      Result<int64_t> saved_world = JsonInt(*it, "world_size", 1, int64_t{1} << 20);
      if (!saved_world.ok() || (ej->contains("world_size") && *saved_world != engine_world)) {
        return DataLossError(name + ": trainer.json's world_size " + it->dump() +
                             " does not match engine.json's " + std::to_string(engine_world) +
                             ": the checkpoint's files do not belong together");
      }
    }
    // Another split of the same global batch (ranks x micro-batch x accumulation) resumes
    // exactly; another global batch is a different run from here on: said, not refused.
    const int64_t global_batch = run.micro_batch * run.gradient_accumulation_steps * world;
    if (auto it = t.find("global_batch");
        it != t.end() && it->is_number_integer() && it->get<int64_t>() != global_batch) {
      STRATA_LOG(kWarning) << "resuming with a global batch of " << global_batch << " (" << world
                           << " rank(s) x micro-batch " << run.micro_batch << " x accumulation "
                           << run.gradient_accumulation_steps << "), the checkpoint trained "
                           << "with " << it->get<int64_t>()
                           << ": the steps from here differ from the run's had it continued";
    }
    const nlohmann::json& seed = t.at("seed");
    if (!seed.is_number_unsigned()) {
      return DataLossError(name +
                           ": trainer.json: seed: expected a non-negative integer, "
                           "got " +
                           seed.dump());
    }
    if (seed.get<uint64_t>() != run.seed) {
      STRATA_LOG(kWarning) << "resuming with --seed " << run.seed << ", the checkpoint used "
                           << seed.get<uint64_t>() << ": batches will differ";
    }
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(name + ": trainer.json: " + e.what());
  }
  // A checkpoint is written between steps, so its trainer and engine agree on the step count; a
  // hand-edited or mismatched trainer.json would otherwise "finish" a run that trained nothing.
  if (step != run.engine->global_steps()) {
    return DataLossError(name + ": trainer.json: step " + std::to_string(step) +
                         " does not match the engine state's " +
                         std::to_string(run.engine->global_steps()) + " steps");
  }
  STRATA_LOG(kInfo) << "resumed from " << name << " (" << reader.tag() << ") at step " << step;
  TrainingPosition at{step, samples};
  for (const char* key : {"eval", "best"}) {
    if (auto it = t.find(key); it != t.end() && it->is_object()) at.trainer_state[key] = *it;
  }
  return at;
}

}  // namespace strata::runtime
