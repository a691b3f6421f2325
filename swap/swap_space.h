// SwapSpace: where swapped-out model state lives on NVMe.
//
// One SwapSpace is one private run directory under the configured nvme_path (mode 0700) holding
// one preallocated file per kind of state ("params", "optimizer", "grads"...; mode 0600), each an
// arena carved into extents by a first-fit allocator whose extents are padded to the direct-I/O
// alignment (max(logical block size, 4 KiB), probed for the directory). Every extent is named, e.g.
// "blocks.3.attn.qkv.weight/exp_avg", and its id is a stable 64-bit hash of that name (the same in
// every run and every process), so checkpoints and restarts find state by name.
//
//   auto swap = SwapSpace::Create({.nvme_path = "/mnt/nvme"}).value();
//   STRATA_RETURN_IF_ERROR(swap->Reserve("optimizer", 12ull << 30));   // fallocate up front
//   STRATA_ASSIGN_OR_RETURN(SwapExtent e, swap->Allocate("blocks.3.mlp.w1/exp_avg", "optimizer",
//                                                        n * 4));
//   backend->Submit({IoOp::kWrite, e.fd, e.offset, buffer.span(0, e.padded_length), done});
//
// Space: before a file grows (Reserve, or Allocate past the reserved size), the free space of the
// filesystem is checked with statvfs and a shortfall is a ResourceExhausted error stating the
// bytes needed and available; the growth itself is an fallocate, so later writes cannot hit
// ENOSPC for lack of blocks.
//
// Lifetime: file descriptors stay open while the SwapSpace lives (extents carry the fd). The
// destructor, a normal exit (atexit) and SIGINT/SIGTERM delete the files and the directory unless
// keep_files is set (e.g. the files are a checkpoint); SaveManifest writes the extent map so that
// Open can reattach to a kept directory later.
//
// Orphans: what kill -9 or the OOM killer leaves behind is reclaimed by the next run instead
// (swap/run_dir.h). The run directory holds strata.lock, flocked for the SwapSpace's whole life,
// and a kept one strata.keep; Create first removes the directories under nvme_path whose lock is
// free and that are not kept (reclaim_orphans), logging one line for each.
//
// Thread-safety: all methods may be called from any thread. I/O on extents is the caller's (via an
// IoBackend); SwapSpace never reads or writes extent contents.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/file_util.h"
#include "base/mutex.h"
#include "base/status.h"

namespace strata {

struct SwapSpaceOptions {
  std::string nvme_path;        // existing parent directory
  std::string run_name;         // subdirectory; empty: "strata-swap-<pid>-<time>"
  bool keep_files = false;      // keep the files at exit (checkpoint); changeable later
  bool use_direct = true;       // open files with O_DIRECT where the filesystem allows it
  bool require_direct = false;  // fail where it does not (otherwise: buffered, with a warning)
  bool handle_signals = true;   // remove the files on SIGINT/SIGTERM (unless kept)
  bool reclaim_orphans = true;  // Create: remove dead runs' directories under nvme_path first
};

struct SwapExtent {
  uint64_t id = 0;             // IdForName(name)
  int fd = -1;                 // the kind's file; valid while the SwapSpace lives
  uint64_t offset = 0;         // aligned
  uint64_t length = 0;         // bytes asked for
  uint64_t padded_length = 0;  // length rounded up to alignment(): transfer this many bytes
};

// Removes the files and directories of every live SwapSpace of this process that is not kept,
// as a fatal SIGINT/SIGTERM does (the cleanup SwapSpace registers with base/signals.h).
// Async-signal-safe.
void RemoveSwapFilesForSignal();

class SwapSpace {
 public:
  // Reclaims orphaned run directories under nvme_path (if options.reclaim_orphans), creates the
  // run directory nvme_path/run_name (it must not exist) with its lock, and probes direct I/O.
  static Result<std::unique_ptr<SwapSpace>> Create(const SwapSpaceOptions& options);
  // Reattaches to a run directory kept by an earlier SwapSpace (SaveManifest + keep_files):
  // takes its lock (FailedPrecondition while another live SwapSpace holds it), reopens its files
  // and restores every extent. `options.nvme_path`/`run_name` are ignored. A failed Open removes
  // nothing.
  static Result<std::unique_ptr<SwapSpace>> Open(const std::string& run_dir,
                                                 const SwapSpaceOptions& options);

  SwapSpace(const SwapSpace&) = delete;
  SwapSpace& operator=(const SwapSpace&) = delete;
  // Closes the files; deletes them and the directory unless keep_files().
  ~SwapSpace();

  // The stable id of an extent name: 64-bit FNV-1a of its bytes.
  static uint64_t IdForName(std::string_view name);

  const std::string& dir() const { return dir_; }
  uint32_t alignment() const { return alignment_; }
  bool direct() const { return direct_; }  // the files have O_DIRECT

  // Grows the file of `kind` (creating it) to hold at least `bytes`, preallocating with fallocate
  // after checking free space. Never shrinks. `kind` is [A-Za-z0-9_-]+.
  Status Reserve(std::string_view kind, uint64_t bytes);

  // Places a new extent of `bytes` (> 0) for `name` in the file of `kind`, growing it if needed.
  // AlreadyExists if the name (or, astronomically unlikely, its id) is taken.
  Result<SwapExtent> Allocate(std::string_view name, std::string_view kind, uint64_t bytes);
  Result<SwapExtent> Find(std::string_view name) const;
  Result<SwapExtent> FindById(uint64_t id) const;
  // Returns the extent's space to its file's free list.
  Status Free(std::string_view name);

  // Bytes reserved (file size) and allocated (padded) in `kind`'s file; 0 for an unknown kind.
  uint64_t reserved_bytes(std::string_view kind) const;
  uint64_t allocated_bytes(std::string_view kind) const;
  size_t extent_count() const;

  // Writes the extent map to dir()/manifest.json (atomically), for Open.
  Status SaveManifest() const;
  // fdatasync of every file.
  Status Sync() const;
  // Also marks the directory (strata.keep) so that orphan reclaim never removes it.
  void set_keep_files(bool keep);
  bool keep_files() const;

 private:
  struct File {
    std::string kind;
    std::string path;
    int fd = -1;
    uint64_t capacity = 0;              // bytes preallocated
    uint64_t end = 0;                   // high-water mark of allocations
    uint64_t allocated = 0;             // padded bytes in live extents
    std::map<uint64_t, uint64_t> free;  // offset -> length, below `end`, coalesced
  };
  struct Entry {
    std::string name;
    size_t file;
    SwapExtent extent;
  };

  explicit SwapSpace(const SwapSpaceOptions& options);
  Status Init(bool create);
  Result<File*> FileForKind(std::string_view kind, bool create) REQUIRES(mu_);
  Status Grow(File& f, uint64_t bytes) REQUIRES(mu_);
  Status Load() EXCLUDES(mu_);  // reads the manifest (swap_manifest.cc)
  static bool ValidKind(std::string_view kind);
  static std::string Basename(const std::string& path);

  // The run directory's own files besides the kinds' (registered for cleanup at Init).
  static constexpr const char* kManifest = "manifest.json";
  static constexpr const char* kManifestTmp = "manifest.json.tmp";

  SwapSpaceOptions options_;
  std::string dir_;
  uint32_t alignment_ = 4096;
  bool direct_ = false;
  int cleanup_slot_ = -1;
  UniqueFd lock_;  // flock of dir_/strata.lock, held for the SwapSpace's life

  mutable Mutex mu_;
  std::vector<std::unique_ptr<File>> files_ GUARDED_BY(mu_);
  std::unordered_map<std::string, Entry> entries_ GUARDED_BY(mu_);  // by name
  std::unordered_map<uint64_t, std::string> names_by_id_ GUARDED_BY(mu_);
};

}  // namespace strata
