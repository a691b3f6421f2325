// HfCheckpoint: opening and validating a Hugging Face weights directory, and chunked reads.
//
// Open(): picks model.safetensors or the index (the single file first, as transformers), parses
// the index with ParseJsonText (which refuses a name given twice in "weight_map", as any duplicate
// key, which JSON parsers otherwise resolve silently), then for each distinct shard name, in sorted
// order: checks the name stays inside DIR, opens the file (its fd is kept for reads), indexes its
// header with ReadSafetensorsIndex, and checks that the path still names the opened file (same
// device and inode), so the offsets describe the bytes the fd reads. The cross-checks then run over
// every tensor: name in two shards, tensor not in the index, index entry not in its shard.
//
// Reads: pread through the shard's fd in chunks of at most kReadChunkBytes. F32 and raw bytes go
// straight into the caller's buffer; BF16/F16 stage one chunk of 16-bit values at a time (a
// buffer per call: concurrent reads share nothing but the fds).
#include "runtime/persist/hf_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/file_util.h"
#include "base/json_text.h"
#include "base/logging.h"
#include "cpu_optimizer/convert.h"
#include "runtime/persist/safetensors.h"

namespace strata::runtime {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian values; this reader copies them as they are");

// A weights index is a name -> file map; even a 100k-tensor model's is a few MB.
constexpr uint64_t kMaxIndexBytes = 100'000'000;

// `dir` made absolute, without a trailing '/' (other than the root's).
std::string AbsoluteDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(dir, ec);
  std::string s = ec ? dir : p.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// What a path that exists but is no regular file is, for messages.
const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// True if `path` is a regular file (following symlinks, as Hugging Face's cache uses them), false
// if it does not exist; kInvalidArgument if it exists as something else (a link to a device, a
// directory), which would otherwise be reported as missing or read forever.
Result<bool> IsRegularFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return IoErrorFromErrno(errno, "stat " + path);
  }
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgumentError(path + " is not a regular file (it is " + FileKind(st.st_mode) +
                                ")");
  }
  return true;
}

// Why `shard` (a file name from an index) may not be used, or "" if it may.
std::string BadShardName(const std::string& shard) {
  if (shard.empty()) return "is empty";
  if (shard == "." || shard == "..") return "is not a file name";
  if (shard.find('/') != std::string::npos) return "contains '/' (shards live in the directory)";
  if (shard.find('\0') != std::string::npos) return "contains a NUL byte";
  return "";
}

// The "weight_map" of the index at `path`: tensor name -> shard file name. A tensor named twice
// is a duplicate key, refused by the parser.
Result<std::map<std::string, std::string>> ParseWeightMap(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(
      const nlohmann::json index,
      ReadJsonFile(path, {.max_bytes = kMaxIndexBytes, .code = StatusCode::kDataLoss}));
  if (!index.is_object()) return DataLossError(path + ": not a JSON object");
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) {
    return DataLossError(path + ": \"weight_map\" missing or not an object");
  }
  std::map<std::string, std::string> out;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string()) {
      return DataLossError(path + ": weight_map entry for tensor '" + it.key() +
                           "' is not a file name string");
    }
    std::string shard = it.value().get<std::string>();
    if (std::string why = BadShardName(shard); !why.empty()) {
      return DataLossError(path + ": weight_map entry for tensor '" + it.key() + "': shard '" +
                           shard + "' " + why);
    }
    out.emplace(it.key(), std::move(shard));
  }
  return out;
}

}  // namespace

uint64_t HfTensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

Result<std::unique_ptr<HfCheckpoint>> HfCheckpoint::Open(const std::string& dir) {
  if (dir.empty()) return InvalidArgumentError("Hugging Face checkpoint directory is empty");
  const std::string root = AbsoluteDir(dir);
  const std::string single_path = root + "/" + kHfWeightsName;
  const std::string index_path = root + "/" + kHfWeightsIndexName;

  STRATA_ASSIGN_OR_RETURN(bool has_single, IsRegularFile(single_path));
  std::map<std::string, std::string> weight_map;  // empty for a single file
  std::vector<std::string> shard_names;
  if (has_single) {
    shard_names.push_back(kHfWeightsName);
  } else {
    STRATA_ASSIGN_OR_RETURN(bool has_index, IsRegularFile(index_path));
    if (!has_index) {
      return NotFoundError(root + ": no Hugging Face weights: neither " + kHfWeightsName + " nor " +
                           kHfWeightsIndexName + " exists");
    }
    STRATA_ASSIGN_OR_RETURN(weight_map, ParseWeightMap(index_path));
    std::set<std::string> names;
    for (const auto& [tensor, shard] : weight_map) names.insert(shard);
    shard_names.assign(names.begin(), names.end());
  }

  std::unique_ptr<HfCheckpoint> ckpt(new HfCheckpoint());
  std::map<std::string, std::pair<uint32_t, SafetensorsTensor>> found;  // name -> (shard, tensor)
  for (uint32_t s = 0; s < shard_names.size(); ++s) {
    const std::string path = root + "/" + shard_names[s];
    if (Result<bool> regular = IsRegularFile(path); !regular.ok()) return regular.status();
    Result<UniqueFd> fd = OpenFile(path, O_RDONLY);
    if (!fd.ok()) {
      if (fd.status().code() != StatusCode::kNotFound || has_single) return fd.status();
      std::string example;
      for (const auto& [tensor, shard] : weight_map) {
        if (shard == shard_names[s]) {
          example = tensor;
          break;
        }
      }
      return NotFoundError(index_path + " places tensor '" + example + "' (and maybe others) in " +
                           "shard " + path + ", which does not exist");
    }
    STRATA_ASSIGN_OR_RETURN(std::vector<SafetensorsTensor> index, ReadSafetensorsIndex(path));
    struct stat by_fd, by_path;
    if (::fstat(fd->get(), &by_fd) != 0) return IoErrorFromErrno(errno, "stat " + path);
    if (::stat(path.c_str(), &by_path) != 0) return IoErrorFromErrno(errno, "stat " + path);
    if (by_fd.st_dev != by_path.st_dev || by_fd.st_ino != by_path.st_ino) {
      return FailedPreconditionError(path + ": replaced while being opened; try again");
    }
    for (SafetensorsTensor& t : index) {
      const std::string name = t.spec.name;
      if (!has_single) {
        auto listed = weight_map.find(name);
        if (listed == weight_map.end()) {
          return DataLossError(path + ": holds tensor '" + name + "', which " + index_path +
                               " does not list");
        }
      }
      auto [it, inserted] = found.emplace(name, std::make_pair(s, std::move(t)));
      if (!inserted) {
        return DataLossError("tensor '" + name + "' is in two shards: " + root + "/" +
                             shard_names[it->second.first] + " and " + path);
      }
    }
    ckpt->files_.push_back(path);
    ckpt->fds_.push_back(std::move(fd).value());
  }
  for (const auto& [name, shard] : weight_map) {
    auto it = found.find(name);
    const std::string expected = root + "/" + shard;
    if (it == found.end()) {
      return DataLossError(index_path + " places tensor '" + name + "' in " + expected +
                           ", which does not hold it");
    }
    if (shard_names[it->second.first] != shard) {
      return DataLossError(index_path + " places tensor '" + name + "' in " + expected +
                           ", but it is in " + ckpt->files_[it->second.first]);
    }
  }

  ckpt->tensors_.reserve(found.size());
  ckpt->shard_of_.reserve(found.size());
  for (auto& [name, entry] : found) {  // std::map: sorted by name
    auto& [shard, t] = entry;
    HfTensorInfo info;
    info.name = name;
    info.file = ckpt->files_[shard];
    info.dtype = std::move(t.spec.dtype);
    info.shape = std::move(t.spec.shape);
    info.begin = t.begin;
    info.end = t.end;
    ckpt->tensors_.push_back(std::move(info));
    ckpt->shard_of_.push_back(shard);
  }
  return ckpt;
}

int64_t HfCheckpoint::IndexOf(const std::string& name) const {
  auto it =
      std::lower_bound(tensors_.begin(), tensors_.end(), name,
                       [](const HfTensorInfo& t, const std::string& n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return -1;
  return it - tensors_.begin();
}

const HfTensorInfo* HfCheckpoint::Find(const std::string& name) const {
  int64_t i = IndexOf(name);
  return i < 0 ? nullptr : &tensors_[static_cast<size_t>(i)];
}

std::string HfCheckpoint::dominant_dtype() const {
  std::map<std::string, uint64_t> bytes;
  for (const HfTensorInfo& t : tensors_) bytes[t.dtype] += t.end - t.begin;
  std::string best;
  uint64_t most = 0;
  for (const auto& [dtype, n] : bytes) {
    if (n > most) {
      best = dtype;
      most = n;
    }
  }
  return best;
}

Status HfCheckpoint::ReadRange(size_t tensor, uint64_t offset, void* dst, uint64_t bytes) const {
  const HfTensorInfo& t = tensors_[tensor];
  return PreadFully(fds_[shard_of_[tensor]].get(), offset, dst, bytes, t.file)
      .WithContext("reading tensor '" + t.name + "'");
}

Status HfCheckpoint::ReadAll(size_t tensor, void* dst) const {
  const HfTensorInfo& t = tensors_[tensor];
  char* out = static_cast<char*>(dst);
  for (uint64_t off = 0; off < t.end - t.begin; off += kReadChunkBytes) {
    const uint64_t n = std::min(kReadChunkBytes, t.end - t.begin - off);
    STRATA_RETURN_IF_ERROR(ReadRange(tensor, t.begin + off, out + off, n));
  }
  return Status::Ok();
}

Status HfCheckpoint::ReadRaw(const std::string& name, void* dst) const {
  int64_t i = IndexOf(name);
  if (i < 0) return NotFoundError("no tensor '" + name + "' in the checkpoint");
  return ReadAll(static_cast<size_t>(i), dst);
}

Status HfCheckpoint::ReadFloat32(const std::string& name, float* dst) const {
  int64_t i = IndexOf(name);
  if (i < 0) return NotFoundError("no tensor '" + name + "' in the checkpoint");
  const HfTensorInfo& t = tensors_[static_cast<size_t>(i)];
  if (t.dtype == "F32") return ReadAll(static_cast<size_t>(i), dst);
  constexpr uint64_t kChunk = kReadChunkBytes / sizeof(uint16_t);
  for (uint64_t done = 0; done < t.numel(); done += kChunk) {
    STRATA_RETURN_IF_ERROR(ReadFloat32Range(static_cast<size_t>(i), done,
                                            std::min(kChunk, t.numel() - done), dst + done));
  }
  return Status::Ok();
}

Status HfCheckpoint::ReadFloat32Range(size_t i, uint64_t first, uint64_t n, float* dst) const {
  const HfTensorInfo& t = tensors_[i];
  if (t.dtype == "F32") {
    return ReadRange(i, t.begin + first * sizeof(float), dst, n * sizeof(float));
  }
  const bool bf16 = t.dtype == "BF16";
  if (!bf16 && t.dtype != "F16") {
    return InvalidArgumentError("tensor '" + t.name + "' in " + t.file + " is " + t.dtype +
                                "; only F32, BF16 and F16 read as fp32");
  }
  std::vector<uint16_t> staging(static_cast<size_t>(n));
  STRATA_RETURN_IF_ERROR(
      ReadRange(i, t.begin + first * sizeof(uint16_t), staging.data(), n * sizeof(uint16_t)));
  if (bf16) {
    for (uint64_t k = 0; k < n; ++k) dst[k] = cpu_optimizer::Bf16ToFloat(staging[k]);
  } else {
    for (uint64_t k = 0; k < n; ++k) dst[k] = cpu_optimizer::HalfToFloat(staging[k]);
  }
  return Status::Ok();
}

Result<bool> HfCheckpoint::SameValues(const std::string& a, const std::string& b) const {
  const int64_t ia = IndexOf(a), ib = IndexOf(b);
  if (ia < 0) return NotFoundError("no tensor '" + a + "' in the checkpoint");
  if (ib < 0) return NotFoundError("no tensor '" + b + "' in the checkpoint");
  const HfTensorInfo& ta = tensors_[static_cast<size_t>(ia)];
  const HfTensorInfo& tb = tensors_[static_cast<size_t>(ib)];
  if (ta.shape != tb.shape) return false;
  constexpr uint64_t kChunk = kReadChunkBytes / sizeof(float);
  std::vector<float> va(static_cast<size_t>(std::min(ta.numel(), kChunk)));
  std::vector<float> vb(va.size());
  for (uint64_t done = 0; done < ta.numel(); done += kChunk) {
    const uint64_t n = std::min(kChunk, ta.numel() - done);
    STRATA_RETURN_IF_ERROR(ReadFloat32Range(static_cast<size_t>(ia), done, n, va.data()));
    STRATA_RETURN_IF_ERROR(ReadFloat32Range(static_cast<size_t>(ib), done, n, vb.data()));
    // Bitwise, as torch.equal on the loaded fp32 tensors (a NaN is never equal).
    for (uint64_t k = 0; k < n; ++k) {
      if (!(va[k] == vb[k]) || std::signbit(va[k]) != std::signbit(vb[k])) return false;
    }
  }
  return true;
}

Status UntieADistinctHead(const HfCheckpoint& checkpoint, const std::string& dir,
                          bool* tie_word_embeddings) {
  constexpr char kHead[] = "lm_head.weight";
  constexpr char kEmbedding[] = "model.embed_tokens.weight";
  if (!*tie_word_embeddings || checkpoint.Find(kHead) == nullptr ||
      checkpoint.Find(kEmbedding) == nullptr) {
    return Status::Ok();
  }
  STRATA_ASSIGN_OR_RETURN(const bool same, checkpoint.SameValues(kHead, kEmbedding));
  if (same) return Status::Ok();
  *tie_word_embeddings = false;
  STRATA_LOG(kWarning) << dir << ": config.json ties the head to the embedding "
                       << "(tie_word_embeddings), but the weights hold an lm_head.weight with "
                          "other values: using that head, untied, as transformers 5 does (4.47 "
                          "tied it, dropping the head; exports write tie_word_embeddings false)";
  return Status::Ok();
}

}  // namespace strata::runtime
