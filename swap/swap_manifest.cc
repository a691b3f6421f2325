// SwapSpace's manifest (swap_space.h SaveManifest, Reattach): the extent map of a kept run
// directory, written atomically and read back with the free lists rebuilt from its gaps.
#include <fcntl.h>
#include <sys/stat.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "base/json_text.h"
#include "base/mutex.h"
#include "swap/direct_io.h"
#include "swap/swap_cleanup.h"
#include "swap/swap_space.h"

namespace strata {

Status SwapSpace::SaveManifest() const {
  nlohmann::json j;
  {
    MutexLock lock(&mu_);
    j["version"] = 1;
    j["alignment"] = alignment_;
    j["files"] = nlohmann::json::array();
    for (const auto& f : files_) {
      j["files"].push_back({{"kind", f->kind},
                            {"file", Basename(f->path)},
                            {"capacity", f->capacity},
                            {"end", f->end}});
    }
    j["extents"] = nlohmann::json::array();
    for (const auto& [name, e] : entries_) {
      j["extents"].push_back({{"name", name},
                              {"id", e.extent.id},
                              {"kind", files_[e.file]->kind},
                              {"offset", e.extent.offset},
                              {"length", e.extent.length},
                              {"padded_length", e.extent.padded_length}});
    }
  }
  // A fixed temporary name, not WriteFileAtomically's unique one: the signal-time cleanup slot
  // (Init) must know every name this space may leave behind.
  return WriteFileAtomicallyVia(dir_ + "/" + kManifestTmp, dir_ + "/" + kManifest, j.dump(1), 0600);
}

Status SwapSpace::Load() {
  const std::string path = dir_ + "/" + kManifest;
  Result<nlohmann::json> read = ReadJsonFile(path, {.code = StatusCode::kDataLoss});
  if (read.status().code() == StatusCode::kNotFound) {
    return NotFoundError("swap space: no manifest " + path + " (was SaveManifest called?)");
  }
  STRATA_ASSIGN_OR_RETURN(nlohmann::json j, std::move(read));
  if (!j.is_object() || j.value("version", 0) != 1 || !j.contains("files") ||
      !j.contains("extents")) {
    return DataLossError("swap space: manifest " + path + " is not a valid version-1 manifest");
  }
  MutexLock lock(&mu_);
  if (j.value("alignment", 0u) > alignment_) alignment_ = j.value("alignment", 0u);
  for (const auto& jf : j["files"]) {
    auto f = std::make_unique<File>();
    f->kind = jf.value("kind", "");
    f->path = dir_ + "/" + jf.value("file", "");
    f->capacity = jf.value("capacity", uint64_t{0});
    f->end = jf.value("end", uint64_t{0});
    if (!ValidKind(f->kind)) return DataLossError("swap space: manifest " + path + ": bad kind");
    AddCleanupFile(cleanup_slot_, Basename(f->path));
    STRATA_ASSIGN_OR_RETURN(OpenedFile of,
                            OpenFileForIo(f->path, O_RDWR, 0600, direct_, options_.require_direct));
    f->fd = of.fd;
    struct stat st {};
    if (fstat(f->fd, &st) == 0 && static_cast<uint64_t>(st.st_size) < f->capacity) {
      return DataLossError("swap space: " + f->path + " has " + std::to_string(st.st_size) +
                           " bytes but the manifest says " + std::to_string(f->capacity));
    }
    files_.push_back(std::move(f));
  }
  // Rebuild the free lists from the gaps between extents.
  std::vector<std::map<uint64_t, uint64_t>> used(files_.size());
  for (const auto& je : j["extents"]) {
    const std::string name = je.value("name", "");
    const std::string kind = je.value("kind", "");
    size_t index = files_.size();
    for (size_t i = 0; i < files_.size(); ++i) {
      if (files_[i]->kind == kind) index = i;
    }
    if (name.empty() || index == files_.size()) {
      return DataLossError("swap space: manifest " + path + ": bad extent entry");
    }
    SwapExtent e{IdForName(name), files_[index]->fd, je.value("offset", uint64_t{0}),
                 je.value("length", uint64_t{0}), je.value("padded_length", uint64_t{0})};
    if (e.id != je.value("id", uint64_t{0})) {
      return DataLossError("swap space: manifest " + path + ": id of '" + name +
                           "' does not match its name");
    }
    files_[index]->allocated += e.padded_length;
    used[index][e.offset] = e.padded_length;
    entries_.emplace(name, Entry{name, index, e});
    names_by_id_.emplace(e.id, name);
  }
  for (size_t i = 0; i < files_.size(); ++i) {
    uint64_t cursor = 0;
    for (const auto& [off, len] : used[i]) {
      if (off > cursor) files_[i]->free.emplace(cursor, off - cursor);
      cursor = off + len;
    }
    files_[i]->end = cursor;
  }
  return Status::Ok();
}

}  // namespace strata
