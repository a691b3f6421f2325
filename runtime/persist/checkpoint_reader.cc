// CheckpointReader: opening a checkpoint, reading its entries by offset, and verifying them.
//
// Open() resolves ROOT/latest when no tag is given, reads MANIFEST.json (size-capped before any
// allocation), has it checked key by key (checkpoint_format.h), and stats every entry against the
// size the manifest states, so a truncated or missing file fails at Open rather than mid-load.
// Reads are bounds-checked pread loops on a fresh fd each, so a reader holds no fds between
// calls. Checksums cost a full read, so they are checked only where asked: Verify() streams every
// entry through xxHash64 with one 1 MiB buffer; ReadJson() checks the one entry it reads.
#include <fcntl.h>
#include <sys/stat.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "base/file_util.h"
#include "base/json_text.h"
#include "runtime/persist/checkpoint_format.h"
#include "runtime/persist/checkpoint_store.h"

namespace strata::runtime {
namespace {

using checkpoint_internal::HexDigest;
using checkpoint_internal::kLatestName;
using checkpoint_internal::kManifestName;
using checkpoint_internal::kMaxLatestBytes;
using checkpoint_internal::ManifestEntry;
using checkpoint_internal::ParseManifest;
using checkpoint_internal::TrimTrailingSpace;

constexpr size_t kVerifyBufferBytes = 1 << 20;

}  // namespace

Result<CheckpointReader> OpenCheckpoint(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  struct stat st;
  const std::string manifest = p + "/" + kManifestName;
  if (::stat(manifest.c_str(), &st) == 0) {
    const size_t slash = p.find_last_of('/');
    const std::string root = slash == std::string::npos ? "."
                             : slash == 0               ? "/"
                                                        : p.substr(0, slash);
    const std::string tag = slash == std::string::npos ? p : p.substr(slash + 1);
    if (IsValidCheckpointTag(tag)) return CheckpointReader::Open(root, tag);
  }
  return CheckpointReader::Open(p);
}

Result<CheckpointReader> CheckpointReader::Open(const std::string& root, const std::string& tag) {
  CheckpointReader r;
  r.root_ = root;
  std::string named_by;
  if (tag.empty()) {
    const std::string latest_path = root + "/" + kLatestName;
    std::string text;
    Status s = ReadSmallFile(latest_path, kMaxLatestBytes, &text, StatusCode::kDataLoss);
    if (s.code() == StatusCode::kNotFound) {
      return NotFoundError("no checkpoint in " + root + ": " + latest_path + " does not exist");
    }
    STRATA_RETURN_IF_ERROR(s);
    TrimTrailingSpace(&text);
    if (!IsValidCheckpointTag(text)) {
      return DataLossError(latest_path + ": does not hold a valid checkpoint tag");
    }
    r.tag_ = text;
    named_by = " (named by " + latest_path + ")";
  } else {
    if (!IsValidCheckpointTag(tag)) {
      return InvalidArgumentError("checkpoint tag '" + tag + "' is not a valid tag");
    }
    r.tag_ = tag;
  }
  r.dir_ = root + "/" + r.tag_;
  struct stat st;
  if (::stat(r.dir_.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT) return NotFoundError("checkpoint " + r.dir_ + " does not exist" + named_by);
    return IoErrorFromErrno(err, "stat " + r.dir_);
  }
  if (!S_ISDIR(st.st_mode)) {
    return DataLossError("checkpoint " + r.dir_ + " is not a directory" + named_by);
  }

  const std::string mpath = r.dir_ + "/" + kManifestName;
  std::string text;
  Status s = ReadSmallFile(mpath, kMaxManifestBytes, &text, StatusCode::kDataLoss);
  if (s.code() == StatusCode::kNotFound) {
    return DataLossError(mpath + ": manifest missing, " + r.dir_ + " is not a complete checkpoint" +
                         named_by);
  }
  STRATA_RETURN_IF_ERROR(s);
  STRATA_ASSIGN_OR_RETURN(std::vector<ManifestEntry> listed, ParseManifest(text, mpath));
  r.entries_.reserve(listed.size());
  for (ManifestEntry& m : listed) {
    r.index_.emplace(m.name, r.entries_.size());
    r.entries_.push_back({std::move(m.name), m.size, m.xxh64, m.named});
  }

  for (const Entry& e : r.entries_) {
    const std::string path = r.dir_ + "/" + e.name;
    if (::stat(path.c_str(), &st) != 0) {
      int err = errno;
      if (err == ENOENT) return DataLossError(path + ": entry missing (listed in " + mpath + ")");
      return IoErrorFromErrno(err, "stat " + path);
    }
    if (!S_ISREG(st.st_mode)) return DataLossError(path + ": entry is not a regular file");
    uint64_t found = static_cast<uint64_t>(st.st_size);
    if (found < e.size) {
      return DataLossError(path + ": truncated: expected " + std::to_string(e.size) +
                           " bytes, found " + std::to_string(found));
    }
    if (found > e.size) {
      return DataLossError(path + ": larger than the manifest says: expected " +
                           std::to_string(e.size) + " bytes, found " + std::to_string(found));
    }
  }
  return r;
}

std::vector<std::string> CheckpointReader::entries() const {
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const Entry& e : entries_) names.push_back(e.name);
  return names;
}

Result<const CheckpointReader::Entry*> CheckpointReader::Find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return NotFoundError("checkpoint " + dir_ + " has no entry '" + name + "'");
  }
  return &entries_[it->second];
}

Result<uint64_t> CheckpointReader::EntrySize(const std::string& name) const {
  STRATA_ASSIGN_OR_RETURN(const Entry* e, Find(name));
  return e->size;
}

Status CheckpointReader::VerifyEntry(const Entry& e) const {
  const std::string path = dir_ + "/" + e.name;
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(e.size, kVerifyBufferBytes)));
  XXH64_state_t state;
  checkpoint_internal::StartEntryDigest(e.name, e.named, &state);
  for (uint64_t off = 0; off < e.size;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), e.size - off));
    STRATA_RETURN_IF_ERROR(PreadFully(fd.get(), off, buf.data(), n, path));
    XXH64_update(&state, buf.data(), n);
    off += n;
  }
  uint64_t got = XXH64_digest(&state);
  if (got != e.xxh64) {
    return DataLossError(path + ": checksum mismatch: manifest says xxh64 " + HexDigest(e.xxh64) +
                         ", contents hash to " + HexDigest(got));
  }
  return Status::Ok();
}

Status CheckpointReader::Verify() const {
  for (const Entry& e : entries_) STRATA_RETURN_IF_ERROR(VerifyEntry(e));
  return Status::Ok();
}

Status CheckpointReader::ReadEntry(const std::string& name, uint64_t offset, void* out,
                                   uint64_t bytes) const {
  STRATA_ASSIGN_OR_RETURN(const Entry* e, Find(name));
  const std::string path = dir_ + "/" + name;
  if (offset > e->size || bytes > e->size - offset) {
    return OutOfRangeError(path + ": read of " + std::to_string(bytes) + " bytes at offset " +
                           std::to_string(offset) + " past the entry's " + std::to_string(e->size) +
                           " bytes");
  }
  if (bytes == 0) return Status::Ok();
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  return PreadFully(fd.get(), offset, out, static_cast<size_t>(bytes), path);
}

Result<nlohmann::json> CheckpointReader::ReadJson(const std::string& name) const {
  STRATA_ASSIGN_OR_RETURN(const Entry* e, Find(name));
  const std::string path = dir_ + "/" + name;
  if (e->size > kMaxJsonEntryBytes) {
    return DataLossError(path + ": " + std::to_string(e->size) +
                         " bytes, more than the JSON entry limit of " +
                         std::to_string(kMaxJsonEntryBytes));
  }
  std::string text(static_cast<size_t>(e->size), '\0');
  STRATA_RETURN_IF_ERROR(ReadEntry(name, 0, text.data(), e->size));
  XXH64_state_t state;
  checkpoint_internal::StartEntryDigest(e->name, e->named, &state);
  XXH64_update(&state, text.data(), text.size());
  const uint64_t got = XXH64_digest(&state);
  if (got != e->xxh64) {
    return DataLossError(path + ": checksum mismatch: manifest says xxh64 " + HexDigest(e->xxh64) +
                         ", contents hash to " + HexDigest(got));
  }
  return ParseJsonText(text, path,
                       {.max_bytes = kMaxJsonEntryBytes, .code = StatusCode::kDataLoss});
}

}  // namespace strata::runtime
