// The checkpoint format: which tags and entry names are valid, what MANIFEST.json holds and how
// it is checked when read, and the small-file reads of the manifest and ROOT/latest.
//
// MANIFEST.json is {"format": "strata-checkpoint", "version": 1, "tag": TAG, "checksum":
// "xxh64-named", "entries": [{"name", "size", "xxh64"}, ...]}; each digest covers the entry's name
// and a NUL byte before its bytes, binding a file to its entry ("xxh64", the bytes alone, is
// what earlier builds wrote and is still read). It is written last inside a checkpoint directory,
// so its presence is what makes a directory a complete checkpoint. A reader trusts nothing in it:
// every key is checked for type and range before anything is allocated from it, and a version
// other than 1 is refused as Unavailable (a newer writer), not as corruption.
#include "runtime/persist/checkpoint_format.h"

#include <stdio.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <utility>

#include "base/json_text.h"
#include "runtime/persist/checkpoint_store.h"

namespace strata::runtime {
namespace {

using checkpoint_internal::kLatestName;
using checkpoint_internal::kManifestName;

constexpr char kFormatName[] = "strata-checkpoint";
constexpr int kFormatVersion = 1;

bool IsSafeChar(char c, bool allow_slash) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || (allow_slash && c == '/');
}

bool ParseHexDigest(const std::string& s, uint64_t* out) {
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

Status Malformed(const std::string& path, const std::string& key, const std::string& what) {
  return DataLossError(path + ": malformed at key " + key + ": " + what);
}

}  // namespace

bool IsValidCheckpointTag(const std::string& tag) {
  if (tag.empty() || tag.size() > 200 || tag[0] == '.' || tag == kLatestName) return false;
  return std::all_of(tag.begin(), tag.end(), [](char c) { return IsSafeChar(c, false); });
}

bool IsValidEntryName(const std::string& name) {
  if (name.empty() || name.size() > 1024 || name == kManifestName) return false;
  if (!std::all_of(name.begin(), name.end(), [](char c) { return IsSafeChar(c, true); })) {
    return false;
  }
  size_t start = 0;
  while (true) {
    size_t slash = name.find('/', start);
    std::string_view part(name.data() + start,
                          (slash == std::string::npos ? name.size() : slash) - start);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}

namespace checkpoint_internal {

void StartEntryDigest(const std::string& name, bool named, void* xxh64_state) {
  auto* state = static_cast<XXH64_state_t*>(xxh64_state);
  XXH64_reset(state, 0);
  if (named) XXH64_update(state, name.c_str(), name.size() + 1);  // the name and its NUL
}

std::string HexDigest(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

std::string ManifestText(const std::string& tag, const std::vector<ManifestEntry>& entries) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ManifestEntry& e : entries) {
    nlohmann::ordered_json item;
    item["name"] = e.name;
    item["size"] = e.size;
    item["xxh64"] = HexDigest(e.xxh64);
    list.push_back(std::move(item));
  }
  nlohmann::ordered_json manifest;
  manifest["format"] = kFormatName;
  manifest["version"] = kFormatVersion;
  manifest["tag"] = tag;
  manifest["checksum"] = "xxh64-named";
  manifest["entries"] = std::move(list);
  return manifest.dump(1) + "\n";
}

Result<std::vector<ManifestEntry>> ParseManifest(const std::string& text,
                                                 const std::string& mpath) {
  STRATA_ASSIGN_OR_RETURN(
      const nlohmann::json m,
      ParseJsonText(text, mpath, {.max_bytes = kMaxManifestBytes, .code = StatusCode::kDataLoss}));
  if (!m.is_object()) return Malformed(mpath, "(top level)", "expected an object");
  auto format = m.find("format");
  if (format == m.end() || !format->is_string() || *format != kFormatName) {
    return Malformed(mpath, "format", std::string("expected \"") + kFormatName + "\"");
  }
  auto version = m.find("version");
  if (version == m.end() || !version->is_number_integer()) {
    return Malformed(mpath, "version", "expected an integer");
  }
  if (*version != kFormatVersion) {
    return UnavailableError(mpath + ": format version " + version->dump() +
                            " is not supported (this build reads version " +
                            std::to_string(kFormatVersion) + ")");
  }
  auto checksum = m.find("checksum");
  if (checksum == m.end() || !checksum->is_string() ||
      (*checksum != "xxh64" && *checksum != "xxh64-named")) {
    return Malformed(mpath, "checksum", "expected \"xxh64-named\" (or \"xxh64\")");
  }
  const bool named = *checksum == "xxh64-named";
  auto list = m.find("entries");
  if (list == m.end() || !list->is_array()) return Malformed(mpath, "entries", "expected an array");
  if (list->size() > kMaxManifestEntries) {
    return Malformed(mpath, "entries",
                     std::to_string(list->size()) + " entries, more than the limit of " +
                         std::to_string(kMaxManifestEntries));
  }
  std::vector<ManifestEntry> entries;
  entries.reserve(list->size());
  std::set<std::string> names;
  for (size_t i = 0; i < list->size(); ++i) {
    const nlohmann::json& item = (*list)[i];
    const std::string key = "entries[" + std::to_string(i) + "]";
    if (!item.is_object()) return Malformed(mpath, key, "expected an object");
    auto name = item.find("name");
    if (name == item.end() || !name->is_string() || !IsValidEntryName(name->get<std::string>())) {
      return Malformed(mpath, key + ".name", "expected a valid entry name");
    }
    auto size = item.find("size");
    if (size == item.end() || !size->is_number_unsigned() ||
        size->get<uint64_t>() > kMaxEntryBytes) {
      return Malformed(mpath, key + ".size",
                       "expected an unsigned integer of at most " + std::to_string(kMaxEntryBytes));
    }
    auto digest = item.find("xxh64");
    uint64_t xxh = 0;
    if (digest == item.end() || !digest->is_string() ||
        !ParseHexDigest(digest->get<std::string>(), &xxh)) {
      return Malformed(mpath, key + ".xxh64", "expected 16 lower-case hex digits");
    }
    ManifestEntry e{name->get<std::string>(), size->get<uint64_t>(), xxh, named};
    if (!names.insert(e.name).second) {
      return Malformed(mpath, key + ".name", "duplicate entry '" + e.name + "'");
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

void TrimTrailingSpace(std::string* s) {
  while (!s->empty() &&
         (s->back() == '\n' || s->back() == '\r' || s->back() == ' ' || s->back() == '\t')) {
    s->pop_back();
  }
}

}  // namespace checkpoint_internal
}  // namespace strata::runtime
