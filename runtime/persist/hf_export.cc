// HfExportWriter: plan (Create), stream (WriteFloat32/WriteRaw), commit (Finish).
//
// State: next_ counts the tensors written; a tensor's shard writer (SafetensorsWriter over
// PATH.tmp) is created when the shard's first tensor arrives and stays open until Finish, so
// several shards may be open at once (an oversize tensor's shard is numbered where it is met, in
// the middle of the current shard's run). A refused call (wrong name, order, size or dtype) is
// checked before anything is written and leaves the state as it was; an I/O error sets failed_,
// after which every call is kFailedPrecondition and the destructor removes the .tmp files.
//
// Finish order, for readers that follow transformers (model.safetensors first, else the index):
// shards renamed into place, then the index, then the leftovers removed. Going from N shards to
// one, the new model.safetensors takes over at its rename; going from one to N, the old
// model.safetensors stays in charge until it is removed last, after the new index exists.
#include "runtime/persist/hf_export.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "base/file_util.h"
#include "cpu_optimizer/convert.h"
#include "runtime/persist/hf_checkpoint.h"
#include "runtime/persist/safetensors.h"

namespace strata::runtime {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian values; this writer copies them as they are");

constexpr char kSizeForms[] =
    "use an integer number of bytes, or a number with a unit: KB, MB, GB, TB (powers of 10) or "
    "KiB, MiB, GiB, TiB (powers of 2), e.g. 5GB, 500MB, 10GiB";

std::string AbsoluteDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(dir, ec);
  std::string s = ec ? dir : p.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// "model-00002-of-00005.safetensors": what a sharded export of any count names its shards.
bool IsShardName(const std::string& name) {
  constexpr std::string_view kPrefix = "model-", kMid = "-of-", kSuffix = ".safetensors";
  if (name.size() != kPrefix.size() + 5 + kMid.size() + 5 + kSuffix.size()) return false;
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return false;
  size_t p = kPrefix.size();
  auto digits = [&name](size_t at) {
    return std::all_of(name.begin() + static_cast<ptrdiff_t>(at),
                       name.begin() + static_cast<ptrdiff_t>(at + 5),
                       [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!digits(p)) return false;
  p += 5;
  if (name.compare(p, kMid.size(), kMid) != 0) return false;
  p += kMid.size();
  if (!digits(p)) return false;
  p += 5;
  return name.compare(p, kSuffix.size(), kSuffix) == 0;
}

}  // namespace

Result<uint64_t> ParseShardSize(const std::string& text) {
  auto bad = [&text](const std::string& why) {
    return InvalidArgumentError("max_shard_size '" + text + "' " + why + ": " + kSizeForms);
  };
  const size_t first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return bad("is empty");
  const std::string s = text.substr(first, text.find_last_not_of(" \t") - first + 1);
  size_t i = 0;
  std::string whole, fraction;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') whole += s[i++];
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') fraction += s[i++];
    if (whole.empty() && fraction.empty()) return bad("has no digits");
  }
  if (whole.empty() && fraction.empty()) return bad("does not start with a number");
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  const std::string unit = s.substr(i);
  std::string upper = unit;
  for (char& c : upper) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);

  static const std::map<std::string, unsigned __int128> kUnits = {{"KB", 1'000},
                                                                  {"MB", 1'000'000},
                                                                  {"GB", 1'000'000'000},
                                                                  {"TB", 1'000'000'000'000},
                                                                  {"KIB", uint64_t{1} << 10},
                                                                  {"MIB", uint64_t{1} << 20},
                                                                  {"GIB", uint64_t{1} << 30},
                                                                  {"TIB", uint64_t{1} << 40}};
  unsigned __int128 multiplier = 1;
  if (unit.empty()) {
    if (!fraction.empty() || s.find('.') != std::string::npos) {
      return bad("is a fraction of a byte");
    }
  } else {
    auto it = kUnits.find(upper);
    if (it == kUnits.end()) return bad("has an unknown unit '" + unit + "'");
    if (upper.size() == 2 && unit.back() == 'b') {
      return bad("ends in a lowercase 'b' (transformers reads that as bits); write 'B'");
    }
    multiplier = it->second;
  }
  // Exact: whole * multiplier + fraction * multiplier / 10^digits, rounded down.
  if (whole.size() + fraction.size() > 24) return bad("is larger than 2^64 - 1 bytes");
  unsigned __int128 w = 0, f = 0, scale = 1;
  for (char c : whole) w = w * 10 + static_cast<unsigned>(c - '0');
  for (char c : fraction) {
    f = f * 10 + static_cast<unsigned>(c - '0');
    scale *= 10;
  }
  const unsigned __int128 bytes = w * multiplier + f * multiplier / scale;
  if (bytes > UINT64_MAX) return bad("is larger than 2^64 - 1 bytes");
  if (bytes == 0) return bad("is zero; a shard holds at least one byte");
  return static_cast<uint64_t>(bytes);
}

HfExportWriter::~HfExportWriter() = default;

Result<std::unique_ptr<HfExportWriter>> HfExportWriter::Create(
    const std::string& dir, std::vector<HfExportTensor> tensors, uint64_t max_shard_bytes,
    std::map<std::string, std::string> metadata) {
  if (dir.empty()) return InvalidArgumentError("Hugging Face export directory is empty");
  if (max_shard_bytes == 0) {
    return InvalidArgumentError(dir + ": max_shard_bytes is 0; a shard holds at least one byte");
  }
  std::unique_ptr<HfExportWriter> w(new HfExportWriter());
  std::set<std::string> names;
  for (const HfExportTensor& t : tensors) {
    const std::string what = dir + ": tensor '" + t.name + "'";
    if (t.name.empty() || t.name == "__metadata__") {
      return InvalidArgumentError(what + ": name must be non-empty and not __metadata__");
    }
    if (!names.insert(t.name).second) return InvalidArgumentError(what + ": given twice");
    const size_t dsize = SafetensorsDtypeSize(t.dtype);
    if (dsize == 0) return InvalidArgumentError(what + ": unknown dtype '" + t.dtype + "'");
    uint64_t numel = 1, bytes = 0;
    bool overflow = false;
    for (int64_t d : t.shape) {
      overflow =
          overflow || d < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel);
    }
    overflow = overflow || __builtin_mul_overflow(numel, uint64_t{dsize}, &bytes) ||
               __builtin_add_overflow(w->total_size_, bytes, &w->total_size_);
    if (overflow) {
      return InvalidArgumentError(what + ": shape has a negative dimension or sizes overflow " +
                                  "64 bits");
    }
    w->total_parameters_ += numel;
    w->bytes_.push_back(bytes);
  }

  // huggingface_hub's split_state_dict_into_shards, on sizes.
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t size = w->bytes_[i];
    if (size > max_shard_bytes) {
      shards.push_back({i});
      continue;
    }
    if (size > max_shard_bytes - current_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += size;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));

  STRATA_RETURN_IF_ERROR(MakeDirs(dir));
  w->dir_ = AbsoluteDir(dir);
  w->tensors_ = std::move(tensors);
  w->metadata_ = std::move(metadata);
  w->shard_of_.resize(w->tensors_.size());
  for (size_t s = 0; s < shards.size(); ++s) {
    if (shards.size() == 1) {
      w->files_.push_back(w->dir_ + "/" + kHfWeightsName);
    } else {
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      w->files_.push_back(w->dir_ + "/" + name);
    }
    for (size_t i : shards[s]) w->shard_of_[i] = s;
  }
  w->shard_tensors_ = std::move(shards);
  w->writers_.resize(w->files_.size());
  return w;
}

Result<size_t> HfExportWriter::Next(const std::string& name) const {
  if (failed_) return FailedPreconditionError(dir_ + ": export failed earlier; start again");
  if (finished_) return FailedPreconditionError(dir_ + ": export already finished");
  auto it = std::find_if(tensors_.begin() + static_cast<ptrdiff_t>(next_), tensors_.end(),
                         [&name](const HfExportTensor& t) { return t.name == name; });
  if (it == tensors_.end()) {
    for (size_t i = 0; i < next_; ++i) {
      if (tensors_[i].name == name) {
        return FailedPreconditionError(dir_ + ": tensor '" + name + "' was already written");
      }
    }
    return InvalidArgumentError(dir_ + ": no tensor '" + name + "' in this export");
  }
  const size_t i = static_cast<size_t>(it - tensors_.begin());
  if (i != next_) {
    return FailedPreconditionError(dir_ + ": tensor '" + name + "' written out of order; '" +
                                   tensors_[next_].name + "' comes next");
  }
  return i;
}

Status HfExportWriter::WriteTensor(size_t i, const void* data, uint64_t bytes) {
  const size_t s = shard_of_[i];
  failed_ = true;  // cleared on success
  if (writers_[s] == nullptr) {
    std::vector<TensorSpec> specs;
    for (size_t k : shard_tensors_[s]) {
      specs.push_back({tensors_[k].name, tensors_[k].dtype, tensors_[k].shape});
    }
    STRATA_ASSIGN_OR_RETURN(writers_[s], SafetensorsWriter::Create(files_[s], specs, metadata_));
  }
  if (bytes > 0) STRATA_RETURN_IF_ERROR(writers_[s]->Append(data, bytes));
  failed_ = false;
  return Status::Ok();
}

Status HfExportWriter::WriteRaw(const std::string& name, const void* bytes, uint64_t size) {
  STRATA_ASSIGN_OR_RETURN(size_t i, Next(name));
  if (size != bytes_[i]) {
    return InvalidArgumentError(dir_ + ": tensor '" + name + "' (" + tensors_[i].dtype +
                                ") holds " + std::to_string(bytes_[i]) + " bytes, " +
                                std::to_string(size) + " given");
  }
  STRATA_RETURN_IF_ERROR(WriteTensor(i, bytes, size));
  ++next_;
  return Status::Ok();
}

Status HfExportWriter::WriteFloat32(const std::string& name, const float* values, uint64_t numel) {
  STRATA_ASSIGN_OR_RETURN(size_t i, Next(name));
  const std::string& dtype = tensors_[i].dtype;
  const uint64_t want = bytes_[i] / SafetensorsDtypeSize(dtype);
  if (dtype != "F32" && dtype != "BF16" && dtype != "F16") {
    return InvalidArgumentError(dir_ + ": tensor '" + name + "' is " + dtype +
                                "; WriteFloat32 converts to F32, BF16 or F16 (use WriteRaw)");
  }
  if (numel != want) {
    return InvalidArgumentError(dir_ + ": tensor '" + name + "' holds " + std::to_string(want) +
                                " elements, " + std::to_string(numel) + " given");
  }
  if (dtype == "F32") {
    STRATA_RETURN_IF_ERROR(WriteTensor(i, values, numel * sizeof(float)));
    ++next_;
    return Status::Ok();
  }
  const bool bf16 = dtype == "BF16";
  constexpr uint64_t kChunk = kStagingBytes / sizeof(uint16_t);
  std::vector<uint16_t> staging(static_cast<size_t>(std::min(numel, kChunk)));
  if (numel == 0) STRATA_RETURN_IF_ERROR(WriteTensor(i, nullptr, 0));  // opens the shard
  for (uint64_t done = 0; done < numel; done += kChunk) {
    const uint64_t n = std::min(kChunk, numel - done);
    const float* in = values + done;
    if (bf16) {
      for (uint64_t k = 0; k < n; ++k) staging[k] = cpu_optimizer::FloatToBf16(in[k]);
    } else {
      for (uint64_t k = 0; k < n; ++k) staging[k] = cpu_optimizer::FloatToHalf(in[k]);
    }
    STRATA_RETURN_IF_ERROR(WriteTensor(i, staging.data(), n * sizeof(uint16_t)));
  }
  ++next_;
  return Status::Ok();
}

Status HfExportWriter::Finish() {
  if (failed_) return FailedPreconditionError(dir_ + ": Finish after a failed export");
  if (finished_) return FailedPreconditionError(dir_ + ": Finish twice");
  if (next_ != tensors_.size()) {
    return FailedPreconditionError(dir_ + ": Finish with " + std::to_string(next_) + " of " +
                                   std::to_string(tensors_.size()) + " tensors written; '" +
                                   tensors_[next_].name + "' comes next");
  }
  failed_ = true;  // cleared on success
  for (size_t s = 0; s < files_.size(); ++s) {
    if (writers_[s] == nullptr) {  // only the single shard of an export without tensors
      STRATA_ASSIGN_OR_RETURN(writers_[s], SafetensorsWriter::Create(files_[s], {}, metadata_));
    }
    STRATA_RETURN_IF_ERROR(writers_[s]->Finish());
  }

  std::set<std::string> keep;
  for (const std::string& f : files_) keep.insert(f.substr(f.rfind('/') + 1));
  if (files_.size() > 1) {
    nlohmann::json index;  // std::map objects: sorted keys, as json.dumps(sort_keys=True)
    index["metadata"] = {{"total_parameters", total_parameters_}, {"total_size", total_size_}};
    index["weight_map"] = nlohmann::json::object();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const std::string& f = files_[shard_of_[i]];
      index["weight_map"][tensors_[i].name] = f.substr(f.rfind('/') + 1);
    }
    std::string text;
    try {
      // indent=2, ASCII only: what transformers' json.dumps(index, indent=2, sort_keys=True)
      // writes, then "\n".
      text = index.dump(2, ' ', /*ensure_ascii=*/true) + "\n";
    } catch (const nlohmann::json::exception& e) {
      return InvalidArgumentError(dir_ + ": cannot serialize the index: " + e.what());
    }
    STRATA_RETURN_IF_ERROR(WriteFileAtomically(dir_, kHfWeightsIndexName, text));
    keep.insert(kHfWeightsIndexName);
  }

  // A previous export's files that this one does not replace.
  std::error_code ec;
  std::vector<std::string> stale;
  for (auto it = std::filesystem::directory_iterator(dir_, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool ours = IsShardName(name) || name == kHfWeightsName || name == kHfWeightsIndexName;
    if (ours && keep.count(name) == 0) stale.push_back(it->path().string());
  }
  if (ec) return IoErrorFromErrno(ec.value(), "list " + dir_ + " for a previous export's files");
  for (const std::string& path : stale) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return IoErrorFromErrno(errno, "remove " + path + ", left by a previous export (the new " +
                                         "export is in place)");
    }
  }
  STRATA_RETURN_IF_ERROR(FsyncDir(dir_));
  finished_ = true;
  failed_ = false;
  return Status::Ok();
}

}  // namespace strata::runtime
