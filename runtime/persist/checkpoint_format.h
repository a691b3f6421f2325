// Internal to runtime/persist/: the on-disk format of a checkpoint directory (checkpoint_store.h's
// file comment describes the layout), shared by the writer and pruning (checkpoint_store.cc) and
// the reader (checkpoint_reader.cc), so that what one writes the other parses by the same rules.
// Not for use outside this folder. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace strata::runtime::checkpoint_internal {

inline constexpr char kManifestName[] = "MANIFEST.json";
inline constexpr char kLatestName[] = "latest";
// ROOT/latest holds one tag (at most 200 characters); anything far larger is not ours.
inline constexpr uint64_t kMaxLatestBytes = 4096;

// One entry of MANIFEST.json.
struct ManifestEntry {
  std::string name;
  uint64_t size = 0;
  uint64_t xxh64 = 0;
  // Checksum kind "xxh64-named" (what this build writes): the digest covers the entry's name, a
  // NUL byte, then its bytes, so a file moved or copied under another entry's name (and a
  // manifest recomputed over the bytes alone) fails verification. false: "xxh64", the bytes
  // alone (checkpoints of earlier builds).
  bool named = true;
};

// The digest of entry `name` as the manifest records it, started (then XXH64_update the bytes).
// Declared here, defined where xxhash.h is included: the seed state of a named digest.
void StartEntryDigest(const std::string& name, bool named, void* xxh64_state);

// A checksum as the manifest spells it: 16 lower-case hex digits.
std::string HexDigest(uint64_t digest);

// The text of MANIFEST.json for checkpoint `tag`, listing `entries` in order.
std::string ManifestText(const std::string& tag, const std::vector<ManifestEntry>& entries);

// Parses the text of MANIFEST.json read from `mpath` (named in messages) and checks it key by key:
// format and version, checksum kind, and each entry's name (valid, unique), size (at most
// kMaxEntryBytes) and digest, at most kMaxManifestEntries of them. DataLoss naming the key for
// anything malformed; Unavailable for a format version this build does not read.
Result<std::vector<ManifestEntry>> ParseManifest(const std::string& text, const std::string& mpath);

// Drops trailing newlines and blanks (`latest` may have been written by hand or by DeepSpeed).
void TrimTrailingSpace(std::string* s);

}  // namespace strata::runtime::checkpoint_internal
