// runtime/persist/ is everything strata writes to keep (no libtorch): checkpoint directories
// (this file; checkpoint_format.h is its manifest format) and safetensors files (safetensors.h).
// The engine streams its state through it; nothing here knows tensors or tiers.
//
// Atomic, verified checkpoint directories: the storage layer under the engine's save and load.
//
// A checkpoint is a directory ROOT/TAG/ of named entries (binary or JSON files, subdirectories
// allowed) plus MANIFEST.json listing every entry's name, size and xxHash64 checksum. ROOT/latest
// holds the tag of the newest complete checkpoint, as DeepSpeed's `latest` file does.
//
// Atomicity. A CheckpointWriter writes into ROOT/.TAG.tmp-<pid>-<n>/, and Commit() fsyncs every
// entry, writes and fsyncs the manifest, fsyncs the directories, moves the directory to ROOT/TAG
// (an existing ROOT/TAG is swapped out atomically with renameat2(RENAME_EXCHANGE) and deleted
// afterwards), fsyncs ROOT, and finally replaces ROOT/latest atomically (temp file, fsync, rename,
// fsync). A crash or an error at any point leaves every previously committed checkpoint, and the
// one `latest` names, intact; what is left over is a hidden temporary directory that
// PruneCheckpoints removes. (Where the filesystem lacks RENAME_EXCHANGE, replacing an existing
// tag falls back to two renames; a crash between them leaves that tag absent until
// PruneCheckpoints moves the old directory back. New tags are unaffected.)
//
// Everything streams: entries are appended in chunks of any size and read back by offset, so a
// checkpoint of tens of GB never needs more than the caller's buffers. Reading never allocates
// from a size it has not checked (the manifest and JSON entries are capped, see below).
//
// Threads: a writer or a reader is used by one thread at a time. Only one writer per ROOT at a
// time (two concurrent commits of different tags are safe; `latest` then names the later one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "base/status.h"

namespace strata::runtime {

// Limits a reader enforces before allocating anything for what it reads from disk.
inline constexpr uint64_t kMaxManifestBytes = 64ull << 20;  // MANIFEST.json
inline constexpr uint64_t kMaxManifestEntries = 1u << 20;
inline constexpr uint64_t kMaxJsonEntryBytes = 256ull << 20;  // ReadJson
inline constexpr uint64_t kMaxEntryBytes = 1ull << 50;        // 1 PiB: anything larger is malformed

// True for a tag usable as a directory name in ROOT: 1-200 characters of [A-Za-z0-9._-], not
// starting with '.', and not "latest".
bool IsValidCheckpointTag(const std::string& tag);
// True for an entry name: 1-1024 characters of [A-Za-z0-9._-/], '/'-separated components that
// are neither empty, "." nor "..", not "MANIFEST.json".
bool IsValidEntryName(const std::string& name);

// Appends one entry's bytes. Owned by its CheckpointWriter; valid until the writer is destroyed.
class EntryWriter {
 public:
  ~EntryWriter();
  EntryWriter(const EntryWriter&) = delete;
  EntryWriter& operator=(const EntryWriter&) = delete;

  // Appends `bytes` bytes (any chunking). Fails after Close() or after an earlier error.
  Status Append(const void* data, size_t bytes);
  // Optional: fsyncs and closes the file now, releasing its fd (Commit closes what is left).
  // Use it when writing many entries one after another.
  Status Close();
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  friend class CheckpointWriter;
  EntryWriter(std::string name, std::string path, int fd);
  uint64_t Digest() const;

  std::string name_;
  std::string path_;
  int fd_;
  uint64_t size_ = 0;
  bool failed_ = false;
  struct HashState;
  std::unique_ptr<HashState> hash_;
};

class CheckpointWriter {
 public:
  // Starts ROOT/.TAG.tmp-<pid>-<n>/ (ROOT and its parents are created if missing).
  static Result<std::unique_ptr<CheckpointWriter>> Begin(const std::string& root,
                                                         const std::string& tag);
  ~CheckpointWriter();  // without a successful Commit: removes the temporary directory
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Creates entry `name` (see IsValidEntryName; distinct names; a name may not be both a file
  // and a directory). The returned pointer is owned by this writer.
  Result<EntryWriter*> AddEntry(const std::string& name);
  // Adds entry `name` holding `value` serialized as JSON.
  Status WriteJson(const std::string& name, const nlohmann::json& value);

  // Makes the checkpoint durable and visible as ROOT/TAG and ROOT/latest (see the file
  // comment). After an error the previous checkpoint is intact; the writer can only be destroyed.
  Status Commit();

  // Data-parallel ranks write one checkpoint together (two-phase): rank 0 Begins and tells the
  // others its temp_dir(); rank r > 0 Joins it and writes its own entries (distinct names), then
  // CloseShard makes them durable and returns their list (name, size, checksum) as text; rank 0
  // Adopts every other rank's list and Commits, so the tag (and `latest`) appears only once every
  // rank's part is on disk. A joined writer never commits and never removes the directory (rank
  // 0's writer owns it: its destructor removes it if the commit does not happen).
  static Result<std::unique_ptr<CheckpointWriter>> Join(const std::string& root,
                                                        const std::string& tag,
                                                        const std::string& temp_dir);
  Result<std::string> CloseShard();
  // REQUIRES: before Commit; `shard` from CloseShard of another rank's joined writer.
  Status Adopt(const std::string& shard);

  const std::string& tag() const { return tag_; }
  const std::string& temp_dir() const { return temp_dir_; }

 private:
  CheckpointWriter(std::string root, std::string tag, std::string temp_dir);
  // `name` is a valid entry name, new, and none of its parents (returned) is a file.
  Result<std::vector<std::string>> CheckNewEntryName(const std::string& name) const;
  void RegisterName(const std::string& name, const std::vector<std::string>& parents);

  std::string root_;
  std::string tag_;
  std::string temp_dir_;
  std::vector<std::unique_ptr<EntryWriter>> entries_;
  std::map<std::string, bool> names_;  // name -> is a directory (implied by an entry below it)
  bool committed_ = false;
  bool moved_ = false;  // the temporary directory is now ROOT/TAG
  bool failed_ = false;
  bool joined_ = false;  // Join: rank r > 0's part of rank 0's directory
  struct Adopted {
    std::string name;
    uint64_t size = 0, xxh64 = 0;
  };
  std::vector<Adopted> adopted_;
};

class CheckpointReader {
 public:
  // Opens ROOT/TAG, or the checkpoint ROOT/latest names when `tag` is empty. Checks that the
  // manifest parses and is within the limits above, and that every entry exists with the size
  // the manifest states. Checksums are checked by Verify() and ReadJson().
  static Result<CheckpointReader> Open(const std::string& root, const std::string& tag = "");

  const std::string& tag() const { return tag_; }
  const std::string& dir() const { return dir_; }
  // Entry names in manifest order.
  std::vector<std::string> entries() const;
  bool HasEntry(const std::string& name) const { return index_.count(name) != 0; }
  Result<uint64_t> EntrySize(const std::string& name) const;

  // Recomputes every entry's checksum (streaming, 1 MiB buffer).
  Status Verify() const;
  // Reads `bytes` bytes of entry `name` at `offset`; OutOfRange past the entry's end.
  Status ReadEntry(const std::string& name, uint64_t offset, void* out, uint64_t bytes) const;
  // Reads, checksums and parses a JSON entry (at most kMaxJsonEntryBytes).
  Result<nlohmann::json> ReadJson(const std::string& name) const;

 private:
  struct Entry {
    std::string name;
    uint64_t size;
    uint64_t xxh64;
    bool named;  // the digest covers the name first (checkpoint_format.h)
  };
  CheckpointReader() = default;
  Result<const Entry*> Find(const std::string& name) const;
  Status VerifyEntry(const Entry& e) const;

  std::string root_;
  std::string tag_;
  std::string dir_;
  std::vector<Entry> entries_;
  std::map<std::string, size_t> index_;
};

// Opens the checkpoint `path` names: a checkpoint directory itself (it holds MANIFEST.json, e.g.
// ROOT/step-6), or a ROOT whose `latest` names one. Errors as CheckpointReader::Open.
Result<CheckpointReader> OpenCheckpoint(const std::string& path);

// Which checkpoints of ROOT a pruning may consider (by tag); others are left alone and not counted.
using CheckpointFilter = std::function<bool(const std::string& tag)>;

// Deletes the checkpoints in ROOT (directories holding a MANIFEST.json) that `ours` accepts
// (all when empty) older than the newest `keep` of those by commit time, never the one `latest`
// names, and the temporary files and directories left by writers that are no longer running.
// REQUIRES: keep >= 0.
Status PruneCheckpoints(const std::string& root, int keep, const CheckpointFilter& ours = {});

namespace internal {
// Test hook: called by Commit() at each phase ("entries_synced", "manifest_written",
// "dir_synced", "renamed", "root_synced", "latest_written"), so a test can crash it there.
using CommitHook = void (*)(const char* phase);
void SetCommitHookForTest(CommitHook hook);
}  // namespace internal

}  // namespace strata::runtime
