// Checkpoint directories: writing and committing them, and pruning old ones. The format they are
// written in is checkpoint_format.cc's; reading them back is checkpoint_reader.cc's.
//
// Write path. Begin() creates ROOT/.TAG.tmp-<pid>-<n>/ and records its name in a process-wide
// set of active temporary names, so that PruneCheckpoints (in this or another process, which
// checks whether <pid> is alive) never deletes a directory still being written. Each entry is a
// file opened O_EXCL and appended with write(2) loops while its xxHash64 and size are computed
// on the fly. Commit() runs the durability sequence of the header comment; each step that makes
// something visible happens only after everything it depends on is on disk:
//   entries fsynced -> MANIFEST.json written+fsynced -> directories fsynced -> rename/exchange to
//   ROOT/TAG -> ROOT fsynced -> ROOT/latest replaced (tmp, fsync, rename, fsync ROOT) -> the old
//   ROOT/TAG (if any) deleted.
// A checkpoint directory is complete exactly when it has a MANIFEST.json, since the manifest is
// written last inside it and the directory becomes visible under its tag only after that.
//
// Deleting. A checkpoint is first renamed to a hidden ROOT/.TAG.del-<pid>-<n> name and then
// removed, so a crash mid-delete never leaves a half-deleted directory under a tag. Pruning shares
// the active-name set with the writer, which is why the two live in one file.
#include "runtime/persist/checkpoint_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "base/file_util.h"
#include "base/logging.h"
#include "runtime/persist/checkpoint_format.h"

namespace strata::runtime {
namespace {

using checkpoint_internal::kLatestName;
using checkpoint_internal::kManifestName;
using checkpoint_internal::kMaxLatestBytes;
using checkpoint_internal::ManifestEntry;
using checkpoint_internal::ManifestText;
using checkpoint_internal::TrimTrailingSpace;

internal::CommitHook g_commit_hook = nullptr;

void Hook(const char* phase) {
  if (g_commit_hook != nullptr) g_commit_hook(phase);
}

// Names (basenames) of the temporary directories this process is writing or deleting.
std::mutex& ActiveMutex() {
  static std::mutex mu;
  return mu;
}
std::set<std::string>& ActiveNames() {
  static std::set<std::string> names;
  return names;
}
void RegisterActive(const std::string& name) {
  std::lock_guard<std::mutex> lock(ActiveMutex());
  ActiveNames().insert(name);
}
void UnregisterActive(const std::string& name) {
  std::lock_guard<std::mutex> lock(ActiveMutex());
  ActiveNames().erase(name);
}
bool IsActive(const std::string& name) {
  std::lock_guard<std::mutex> lock(ActiveMutex());
  return ActiveNames().count(name) != 0;
}

std::string Basename(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// ".TAG.<kind>-<pid>-<n>" for kind in tmp, old, del.
std::string HiddenName(const std::string& tag, const char* kind) {
  return "." + tag + "." + kind + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(NextTempId());
}

// Removes a directory tree; logs instead of failing (used for cleanup only).
void RemoveTreeQuietly(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) STRATA_LOG(kWarning) << "cannot remove " << path << ": " << ec.message();
}

Status RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return IoErrorFromErrno(ec.value(), "remove " + path);
  return Status::Ok();
}

std::string ParentDir(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

}  // namespace

namespace internal {
void SetCommitHookForTest(CommitHook hook) { g_commit_hook = hook; }
}  // namespace internal

// ---- EntryWriter -------------------------------------------------------------------------------

struct EntryWriter::HashState {
  XXH64_state_t state;
};

EntryWriter::EntryWriter(std::string name, std::string path, int fd)
    : name_(std::move(name)), path_(std::move(path)), fd_(fd), hash_(new HashState) {
  checkpoint_internal::StartEntryDigest(name_, /*named=*/true, &hash_->state);
}

EntryWriter::~EntryWriter() {
  if (fd_ >= 0) ::close(fd_);
}

Status EntryWriter::Append(const void* data, size_t bytes) {
  if (failed_) return FailedPreconditionError("entry " + path_ + " had a failed write");
  if (fd_ < 0) return FailedPreconditionError("entry " + path_ + " is closed");
  if (bytes == 0) return Status::Ok();
  Status s = WriteFully(fd_, data, bytes, path_);
  if (!s.ok()) {
    failed_ = true;
    return s;
  }
  XXH64_update(&hash_->state, data, bytes);
  size_ += bytes;
  return Status::Ok();
}

Status EntryWriter::Close() {
  if (failed_) return FailedPreconditionError("entry " + path_ + " had a failed write");
  if (fd_ < 0) return Status::Ok();
  UniqueFd fd(fd_);
  fd_ = -1;
  Status s = FsyncFd(fd.get(), path_);
  if (s.ok()) s = fd.Close(path_);
  if (!s.ok()) failed_ = true;
  return s;
}

uint64_t EntryWriter::Digest() const { return XXH64_digest(&hash_->state); }

namespace {

// ROOT/TAG may be replaced by a save: absent, or a strata checkpoint (a directory with its
// manifest). A user's directory or file that merely has the tag's name is not.
Status CheckReplaceableTag(const std::string& root, const std::string& tag) {
  const std::string dir = root + "/" + tag;
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return Status::Ok();
  const std::string manifest = dir + "/" + kManifestName;
  struct stat m;
  if (S_ISDIR(st.st_mode) && ::lstat(manifest.c_str(), &m) == 0 && S_ISREG(m.st_mode)) {
    return Status::Ok();
  }
  return FailedPreconditionError(
      "saving checkpoint " + tag + ": " + dir + " exists and is not a strata checkpoint (" +
      (S_ISDIR(st.st_mode) ? "no " + std::string(kManifestName) + " in it" : "not a directory") +
      "): not replaced; move it away or save under another tag");
}

}  // namespace

// ---- CheckpointWriter --------------------------------------------------------------------------

CheckpointWriter::CheckpointWriter(std::string root, std::string tag, std::string temp_dir)
    : root_(std::move(root)), tag_(std::move(tag)), temp_dir_(std::move(temp_dir)) {}

Result<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Begin(const std::string& root,
                                                                  const std::string& tag) {
  if (root.empty()) return InvalidArgumentError("checkpoint root is empty");
  if (!IsValidCheckpointTag(tag)) {
    return InvalidArgumentError("checkpoint tag '" + tag +
                                "' is not a safe file name (1-200 characters of A-Z a-z 0-9 . _ -, "
                                "not starting with '.', not 'latest')");
  }
  STRATA_RETURN_IF_ERROR(CheckReplaceableTag(root, tag));
  struct stat st;
  const bool existed = ::stat(root.c_str(), &st) == 0;
  STRATA_RETURN_IF_ERROR(MakeDirs(root));
  if (!existed) STRATA_RETURN_IF_ERROR(FsyncDir(ParentDir(root)));  // ROOT's own name durable
  for (int attempt = 0;; ++attempt) {
    std::string name = HiddenName(tag, "tmp");
    std::string dir = root + "/" + name;
    RegisterActive(name);
    if (::mkdir(dir.c_str(), 0755) == 0) {
      return std::unique_ptr<CheckpointWriter>(new CheckpointWriter(root, tag, dir));
    }
    int err = errno;
    UnregisterActive(name);
    if (err != EEXIST || attempt > 100) {
      return IoErrorFromErrno(err, "create checkpoint directory " + dir);
    }
  }
}

CheckpointWriter::~CheckpointWriter() {
  entries_.clear();  // closes open fds
  if (joined_) return;
  if (!moved_) RemoveTreeQuietly(temp_dir_);
  UnregisterActive(Basename(temp_dir_));
}

Result<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Join(const std::string& root,
                                                                 const std::string& tag,
                                                                 const std::string& temp_dir) {
  if (!IsValidCheckpointTag(tag)) return InvalidArgumentError("checkpoint tag '" + tag + "'");
  struct stat st;
  if (temp_dir.rfind(root + "/", 0) != 0 || ::stat(temp_dir.c_str(), &st) != 0 ||
      !S_ISDIR(st.st_mode)) {
    return FailedPreconditionError("checkpoint " + tag + ": rank 0's directory " + temp_dir +
                                   " is not a directory under " + root +
                                   " here (ranks on several machines need --save on a shared "
                                   "filesystem)");
  }
  std::unique_ptr<CheckpointWriter> w(new CheckpointWriter(root, tag, temp_dir));
  w->joined_ = true;
  return w;
}

Result<std::string> CheckpointWriter::CloseShard() {
  if (!joined_) return FailedPreconditionError("CloseShard on a writer that did not Join");
  if (failed_)
    return FailedPreconditionError("checkpoint " + tag_ + ": CloseShard after a failure");
  nlohmann::json list = nlohmann::json::array();
  for (const auto& e : entries_) {
    STRATA_RETURN_IF_ERROR(e->Close());
    list.push_back({e->name(), e->size(), e->Digest()});
  }
  for (const auto& [name, is_dir] : names_) {
    if (is_dir) STRATA_RETURN_IF_ERROR(FsyncDir(temp_dir_ + "/" + name));
  }
  return list.dump();
}

Status CheckpointWriter::Adopt(const std::string& shard) {
  if (joined_ || committed_ || moved_ || failed_) {
    return FailedPreconditionError("checkpoint " + tag_ +
                                   ": Adopt after Commit or on a joined writer");
  }
  try {
    const nlohmann::json list = nlohmann::json::parse(shard);
    for (const nlohmann::json& e : list) {
      Adopted a{e.at(0).get<std::string>(), e.at(1).get<uint64_t>(), e.at(2).get<uint64_t>()};
      Result<std::vector<std::string>> parents = CheckNewEntryName(a.name);
      if (!parents.ok())
        return parents.status().WithContext("checkpoint " + tag_ + ": a rank's entry");
      RegisterName(a.name, *parents);
      adopted_.push_back(std::move(a));
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError("checkpoint " + tag_ + ": a rank's entry list: " + e.what());
  }
  return Status::Ok();
}

Result<std::vector<std::string>> CheckpointWriter::CheckNewEntryName(
    const std::string& name) const {
  if (!IsValidEntryName(name)) {
    return InvalidArgumentError("checkpoint entry name '" + name +
                                "' is invalid (A-Z a-z 0-9 . _ - and '/' between non-empty "
                                "components other than . and ..; not MANIFEST.json)");
  }
  // Each parent must not be a file; the name itself must be new.
  std::vector<std::string> parents;
  for (size_t slash = name.find('/'); slash != std::string::npos;
       slash = name.find('/', slash + 1)) {
    parents.push_back(name.substr(0, slash));
  }
  for (const std::string& p : parents) {
    auto it = names_.find(p);
    if (it != names_.end() && !it->second) {
      return InvalidArgumentError("checkpoint entry '" + name + "': '" + p +
                                  "' is already an entry (a file)");
    }
  }
  if (names_.count(name) != 0) {
    return AlreadyExistsError("checkpoint entry '" + name + "' already exists (as an entry or " +
                              "as a directory of entries)");
  }
  return parents;
}

void CheckpointWriter::RegisterName(const std::string& name,
                                    const std::vector<std::string>& parents) {
  for (const std::string& p : parents) names_[p] = true;
  names_[name] = false;
}

Result<EntryWriter*> CheckpointWriter::AddEntry(const std::string& name) {
  if (committed_ || moved_ || failed_) {
    return FailedPreconditionError("checkpoint " + tag_ + ": AddEntry after Commit");
  }
  STRATA_ASSIGN_OR_RETURN(const std::vector<std::string> parents, CheckNewEntryName(name));
  if (!parents.empty()) {
    STRATA_RETURN_IF_ERROR(MakeDirs(temp_dir_ + "/" + parents.back()));
  }
  const std::string path = temp_dir_ + "/" + name;
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_WRONLY | O_CREAT | O_EXCL, 0644));
  RegisterName(name, parents);
  entries_.push_back(std::unique_ptr<EntryWriter>(new EntryWriter(name, path, fd.Release())));
  return entries_.back().get();
}

Status CheckpointWriter::WriteJson(const std::string& name, const nlohmann::json& value) {
  std::string text;
  try {
    text = value.dump(1);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError("checkpoint entry '" + name +
                                "': cannot serialize JSON: " + e.what());
  }
  text += '\n';
  STRATA_ASSIGN_OR_RETURN(EntryWriter * entry, AddEntry(name));
  STRATA_RETURN_IF_ERROR(entry->Append(text.data(), text.size()));
  return entry->Close();
}

Status CheckpointWriter::Commit() {
  if (joined_)
    return FailedPreconditionError("checkpoint " + tag_ + ": a joined writer commits nothing");
  if (committed_ || moved_) return FailedPreconditionError("checkpoint " + tag_ + ": Commit twice");
  if (failed_) return FailedPreconditionError("checkpoint " + tag_ + ": Commit after a failure");
  failed_ = true;  // cleared on success

  // 1. Every entry on disk.
  std::vector<ManifestEntry> listed;
  listed.reserve(entries_.size());
  for (const auto& e : entries_) {
    STRATA_RETURN_IF_ERROR(e->Close());
    listed.push_back({e->name(), e->size(), e->Digest()});
  }
  for (const Adopted& a : adopted_) listed.push_back({a.name, a.size, a.xxh64});
  Hook("entries_synced");

  // 2. The manifest, last inside the directory.
  const std::string text = ManifestText(tag_, listed);
  const std::string manifest_path = temp_dir_ + "/" + kManifestName;
  {
    STRATA_ASSIGN_OR_RETURN(UniqueFd fd,
                            OpenFile(manifest_path, O_WRONLY | O_CREAT | O_EXCL, 0644));
    STRATA_RETURN_IF_ERROR(WriteFully(fd.get(), text.data(), text.size(), manifest_path));
    STRATA_RETURN_IF_ERROR(FsyncFd(fd.get(), manifest_path));
    STRATA_RETURN_IF_ERROR(fd.Close(manifest_path));
  }
  Hook("manifest_written");

  // 3. Directory entries durable: subdirectories, then the checkpoint directory itself.
  for (const auto& [name, is_dir] : names_) {
    if (is_dir) STRATA_RETURN_IF_ERROR(FsyncDir(temp_dir_ + "/" + name));
  }
  STRATA_RETURN_IF_ERROR(FsyncDir(temp_dir_));
  Hook("dir_synced");

  // 4. Into place. An existing ROOT/TAG is swapped out atomically; temp_dir_ then holds it.
  const std::string final_dir = root_ + "/" + tag_;
  std::string old_dir;
  if (::rename(temp_dir_.c_str(), final_dir.c_str()) != 0) {
    int err = errno;
    if (err != ENOTEMPTY && err != EEXIST) {
      return IoErrorFromErrno(err, "rename " + temp_dir_ + " to " + final_dir);
    }
    if (::renameat2(AT_FDCWD, temp_dir_.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) ==
        0) {
      old_dir = temp_dir_;
    } else {
      err = errno;
      if (err != EINVAL && err != ENOSYS && err != ENOTSUP) {
        return IoErrorFromErrno(err, "exchange " + temp_dir_ + " with " + final_dir);
      }
      // No RENAME_EXCHANGE here: move the old one aside first (see the header's caveat).
      std::string aside_name = HiddenName(tag_, "old");
      RegisterActive(aside_name);
      old_dir = root_ + "/" + aside_name;
      if (::rename(final_dir.c_str(), old_dir.c_str()) != 0) {
        err = errno;
        UnregisterActive(aside_name);
        return IoErrorFromErrno(err, "rename " + final_dir + " to " + old_dir);
      }
      if (::rename(temp_dir_.c_str(), final_dir.c_str()) != 0) {
        err = errno;
        // Put the old one back so that the previous checkpoint stays where it was.
        if (::rename(old_dir.c_str(), final_dir.c_str()) == 0) UnregisterActive(aside_name);
        return IoErrorFromErrno(err, "rename " + temp_dir_ + " to " + final_dir);
      }
    }
  }
  moved_ = true;
  Hook("renamed");

  Status s = FsyncDir(root_);
  if (s.ok()) {
    Hook("root_synced");
    // 5. Point `latest` at it.
    s = WriteFileAtomically(root_, kLatestName, tag_);
  }
  if (s.ok()) Hook("latest_written");
  // 6. The replaced checkpoint is no longer reachable under any name; delete it.
  if (!old_dir.empty()) {
    RemoveTreeQuietly(old_dir);
    UnregisterActive(Basename(old_dir));
  }
  if (!s.ok()) return s.WithContext("checkpoint " + final_dir + " is in place but latest");
  committed_ = true;
  failed_ = false;
  return Status::Ok();
}

// ---- PruneCheckpoints --------------------------------------------------------------------------

namespace {

// For ".X.<kind>-<pid>-<n>" names: the pid, or 0 if `name` is not such a name.
pid_t TempOwner(const std::string& name) {
  if (name.size() < 2 || name[0] != '.') return 0;
  size_t dash2 = name.rfind('-');
  if (dash2 == std::string::npos || dash2 == 0) return 0;
  size_t dash1 = name.rfind('-', dash2 - 1);
  if (dash1 == std::string::npos || dash1 < 4) return 0;
  std::string_view kind(name.data() + dash1 - 4, 4);
  if (kind != ".tmp" && kind != ".old" && kind != ".del") return 0;
  auto digits = [](std::string_view s) {
    return !s.empty() && s.size() < 19 &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  std::string_view pid(name.data() + dash1 + 1, dash2 - dash1 - 1);
  std::string_view n(name.data() + dash2 + 1, name.size() - dash2 - 1);
  if (!digits(pid) || !digits(n)) return 0;
  long long v = std::stoll(std::string(pid));
  return v > 0 && v <= INT32_MAX ? static_cast<pid_t>(v) : 0;
}

bool IsStale(const std::string& name, pid_t owner) {
  if (owner == ::getpid()) return !IsActive(name);
  if (::kill(owner, 0) == 0) return false;
  return errno == ESRCH;
}

}  // namespace

Status PruneCheckpoints(const std::string& root, int keep, const CheckpointFilter& ours) {
  if (keep < 0) return InvalidArgumentError("PruneCheckpoints: keep must be >= 0");
  std::string latest;
  {
    std::string text;
    Status s =
        ReadSmallFile(root + "/" + kLatestName, kMaxLatestBytes, &text, StatusCode::kDataLoss);
    if (s.ok()) {
      TrimTrailingSpace(&text);
      latest = text;
    } else if (s.code() != StatusCode::kNotFound) {
      return s;
    }
  }

  struct Candidate {
    std::string tag;
    struct timespec mtime;
  };
  std::vector<Candidate> checkpoints;
  std::vector<std::string> stale;
  std::error_code ec;
  std::filesystem::directory_iterator it(root, ec);
  if (ec) return IoErrorFromErrno(ec.value(), "list " + root);
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (ec) return IoErrorFromErrno(ec.value(), "list " + root);
    const std::string name = it->path().filename().string();
    if (pid_t owner = TempOwner(name); owner != 0) {
      if (IsStale(name, owner)) stale.push_back(name);
      continue;
    }
    if (!IsValidCheckpointTag(name)) continue;
    struct stat st;
    const std::string manifest = root + "/" + name + "/" + kManifestName;
    if (::stat(manifest.c_str(), &st) != 0) continue;  // not a checkpoint directory
    if (ours && !ours(name)) continue;                 // another run's: never pruned
    checkpoints.push_back({name, st.st_mtim});
  }

  // Newest first; equal times by name, descending.
  std::sort(checkpoints.begin(), checkpoints.end(), [](const Candidate& a, const Candidate& b) {
    if (a.mtime.tv_sec != b.mtime.tv_sec) return a.mtime.tv_sec > b.mtime.tv_sec;
    if (a.mtime.tv_nsec != b.mtime.tv_nsec) return a.mtime.tv_nsec > b.mtime.tv_nsec;
    return a.tag > b.tag;
  });
  Status first_error;
  auto note = [&first_error](Status s) {
    if (!s.ok() && first_error.ok()) first_error = std::move(s);
  };
  for (size_t i = static_cast<size_t>(keep); i < checkpoints.size(); ++i) {
    const std::string& tag = checkpoints[i].tag;
    if (tag == latest) continue;
    std::string aside = HiddenName(tag, "del");
    RegisterActive(aside);
    const std::string from = root + "/" + tag;
    const std::string to = root + "/" + aside;
    if (::rename(from.c_str(), to.c_str()) != 0) {
      note(IoErrorFromErrno(errno, "rename " + from + " to " + to));
    } else {
      note(RemoveTree(to));
    }
    UnregisterActive(aside);
  }
  for (const std::string& name : stale) {
    // ".TAG.old-*" is a complete checkpoint moved aside by the two-rename fallback of Commit; if
    // its writer died before the new one took its place, ROOT/TAG is absent: put it back.
    size_t kind = name.rfind(".old-");
    if (kind != std::string::npos && kind > 1) {
      const std::string tag = name.substr(1, kind - 1);
      const std::string final_dir = root + "/" + tag;
      struct stat st;
      if (IsValidCheckpointTag(tag) && ::stat(final_dir.c_str(), &st) != 0 && errno == ENOENT) {
        const std::string from = root + "/" + name;
        if (::rename(from.c_str(), final_dir.c_str()) != 0) {
          note(IoErrorFromErrno(errno, "rename " + from + " to " + final_dir));
        }
        continue;
      }
    }
    note(RemoveTree(root + "/" + name));
  }
  if (first_error.ok()) note(FsyncDir(root));
  return first_error;
}

}  // namespace strata::runtime
