// safetensors writer and index reader.
//
// Writer: Create() computes every tensor's [begin, end) from its dtype and shape in the given
// order, serializes the header with nlohmann::ordered_json (so "__metadata__" comes first and
// tensors appear in data order), pads it with spaces to a multiple of 8, and writes the 8-byte
// length and the header to PATH.tmp. Append() streams the bytes with write(2) loops and refuses
// to go past the total; Finish() requires written == total, then fsync, rename, fsync directory.
//
// Reader: never allocates more than the header length, and only after checking it against both
// the file size and kMaxSafetensorsHeaderBytes. The JSON is parsed by ParseJsonText, which refuses
// duplicate names (nlohmann would otherwise keep the last silently). Each tensor's
// byte count is recomputed from dtype and shape with overflow checks and compared with its
// offsets; sorted by offset, the tensors must start at 0, follow one another exactly and end at
// the end of the file.
#include "runtime/persist/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>
#include <set>

#include "base/file_util.h"
#include "base/json_text.h"

namespace strata::runtime {
namespace {

constexpr char kMetadataKey[] = "__metadata__";

// Bytes of a tensor with `shape` of `dtype`; false on a negative dim or overflow.
bool TensorBytes(const std::vector<int64_t>& shape, size_t dtype_size, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  return !__builtin_mul_overflow(n, static_cast<uint64_t>(dtype_size), out);
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace

size_t SafetensorsDtypeSize(const std::string& dtype) {
  static const std::map<std::string, size_t> kSizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
      {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

// ---- Writer ------------------------------------------------------------------------------------

SafetensorsWriter::SafetensorsWriter(std::string path, AtomicFileWriter file, uint64_t total)
    : path_(std::move(path)), file_(std::move(file)), total_(total) {}

SafetensorsWriter::~SafetensorsWriter() = default;  // file_ removes PATH.tmp unless committed

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<TensorSpec> tensors,
    std::map<std::string, std::string> metadata) {
  if (path.empty()) return InvalidArgumentError("safetensors path is empty");
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (auto& [k, v] : metadata) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    const std::string what = path + ": tensor '" + t.name + "'";
    if (t.name.empty() || t.name == kMetadataKey) {
      return InvalidArgumentError(what + ": name must be non-empty and not __metadata__");
    }
    if (!names.insert(t.name).second) return InvalidArgumentError(what + ": duplicate name");
    size_t dsize = SafetensorsDtypeSize(t.dtype);
    if (dsize == 0) return InvalidArgumentError(what + ": unknown dtype '" + t.dtype + "'");
    uint64_t bytes;
    if (!TensorBytes(t.shape, dsize, &bytes)) {
      return InvalidArgumentError(what + ": shape " + ShapeString(t.shape) +
                                  " has a negative dimension or overflows 64 bits");
    }
    uint64_t end;
    if (__builtin_add_overflow(offset, bytes, &end)) {
      return InvalidArgumentError(what + ": total size overflows 64 bits");
    }
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(path + ": cannot serialize the header: " + e.what());
  }
  text.resize((text.size() + 7) / 8 * 8, ' ');
  if (text.size() > kMaxSafetensorsHeaderBytes) {
    return InvalidArgumentError(path + ": header of " + std::to_string(text.size()) +
                                " bytes exceeds the format's limit of " +
                                std::to_string(kMaxSafetensorsHeaderBytes));
  }
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t{text.size()} >> (8 * i));

  STRATA_ASSIGN_OR_RETURN(AtomicFileWriter file, AtomicFileWriter::Create(path));
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter(path, std::move(file), offset));
  STRATA_RETURN_IF_ERROR(w->file_.Append(len, sizeof(len)));
  STRATA_RETURN_IF_ERROR(w->file_.Append(text));
  return w;
}

Status SafetensorsWriter::Append(const void* data, size_t bytes) {
  if (failed_) return FailedPreconditionError(file_.tmp_path() + ": Append after a failed write");
  if (finished_) return FailedPreconditionError(file_.tmp_path() + ": Append after Finish");
  if (bytes > total_ - written_) {
    failed_ = true;
    return InvalidArgumentError(path_ + ": Append of " + std::to_string(bytes) + " bytes past " +
                                "the tensors' total of " + std::to_string(total_) + " (" +
                                std::to_string(written_) + " already written)");
  }
  Status s = file_.Append(data, bytes);
  if (!s.ok()) {
    failed_ = true;
    return s;
  }
  written_ += bytes;
  return Status::Ok();
}

Status SafetensorsWriter::Finish() {
  if (failed_) return FailedPreconditionError(file_.tmp_path() + ": Finish after a failed write");
  if (finished_) return FailedPreconditionError(file_.tmp_path() + ": Finish twice");
  if (written_ != total_) {
    failed_ = true;
    return FailedPreconditionError(path_ + ": Finish with " + std::to_string(written_) + " of " +
                                   std::to_string(total_) + " tensor bytes written");
  }
  failed_ = true;  // cleared on success
  STRATA_RETURN_IF_ERROR(file_.Commit());
  finished_ = true;
  failed_ = false;
  return Status::Ok();
}

// ---- Reader ------------------------------------------------------------------------------------

Result<std::vector<SafetensorsTensor>> ReadSafetensorsIndex(
    const std::string& path, std::map<std::string, std::string>* metadata) {
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return IoErrorFromErrno(errno, "stat " + path);
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    return DataLossError(path + ": truncated: expected at least 8 bytes, found " +
                         std::to_string(file_size));
  }
  unsigned char len[8];
  STRATA_RETURN_IF_ERROR(PreadFully(fd.get(), 0, len, sizeof(len), path));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > file_size - 8) {
    return DataLossError(path + ": header length " + std::to_string(n) +
                         " runs past the end of the file (" + std::to_string(file_size) +
                         " bytes)");
  }
  if (n > kMaxSafetensorsHeaderBytes) {
    return DataLossError(path + ": header length " + std::to_string(n) +
                         " exceeds the format's limit of " +
                         std::to_string(kMaxSafetensorsHeaderBytes));
  }
  if (n < 2)
    return DataLossError(path + ": header of " + std::to_string(n) + " bytes is too short");
  std::string text(static_cast<size_t>(n), '\0');
  STRATA_RETURN_IF_ERROR(PreadFully(fd.get(), 8, text.data(), text.size(), path));

  // Duplicate tensor names (keys) are refused by the parser.
  STRATA_ASSIGN_OR_RETURN(
      const nlohmann::json header,
      ParseJsonText(text, path + ": header",
                    {.max_bytes = kMaxSafetensorsHeaderBytes, .code = StatusCode::kDataLoss}));
  if (!header.is_object()) return DataLossError(path + ": header is not a JSON object");

  const uint64_t data_start = 8 + n;
  const uint64_t data_bytes = file_size - data_start;
  std::vector<SafetensorsTensor> tensors;
  if (metadata != nullptr) metadata->clear();
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == kMetadataKey) {
      if (!v.is_object()) return DataLossError(path + ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return DataLossError(path + ": __metadata__." + m.key() + " is not a string");
        }
        if (metadata != nullptr) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string what = path + ": tensor '" + name + "'";
    if (name.empty()) return DataLossError(path + ": a tensor has an empty name");
    if (!v.is_object()) return DataLossError(what + ": expected an object");
    for (auto f = v.begin(); f != v.end(); ++f) {
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets") {
        return DataLossError(what + ": unknown key '" + f.key() + "'");
      }
    }
    SafetensorsTensor t;
    t.spec.name = name;
    auto dtype = v.find("dtype");
    if (dtype == v.end() || !dtype->is_string()) {
      return DataLossError(what + ": dtype missing or not a string");
    }
    t.spec.dtype = dtype->get<std::string>();
    size_t dsize = SafetensorsDtypeSize(t.spec.dtype);
    if (dsize == 0) return DataLossError(what + ": unknown dtype '" + t.spec.dtype + "'");
    auto shape = v.find("shape");
    if (shape == v.end() || !shape->is_array()) {
      return DataLossError(what + ": shape missing or not an array");
    }
    if (shape->size() > 64) return DataLossError(what + ": shape has more than 64 dimensions");
    for (const nlohmann::json& d : *shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{INT64_MAX}) {
        return DataLossError(what + ": shape holds " + d.dump() +
                             ", expected non-negative integers");
      }
      t.spec.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    auto offsets = v.find("data_offsets");
    if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return DataLossError(what + ": data_offsets must be [begin, end] of non-negative integers");
    }
    uint64_t begin = (*offsets)[0].get<uint64_t>();
    uint64_t end = (*offsets)[1].get<uint64_t>();
    if (begin > end || end > data_bytes) {
      return DataLossError(what + ": data_offsets [" + std::to_string(begin) + ", " +
                           std::to_string(end) + "] are not within the " +
                           std::to_string(data_bytes) + " data bytes");
    }
    uint64_t bytes;
    if (!TensorBytes(t.spec.shape, dsize, &bytes) || bytes != end - begin) {
      return DataLossError(
          what + ": " + t.spec.dtype + " " + ShapeString(t.spec.shape) + " needs " +
          (TensorBytes(t.spec.shape, dsize, &bytes) ? std::to_string(bytes) + " bytes"
                                                    : std::string("more than 2^64 bytes")) +
          ", data_offsets give " + std::to_string(end - begin));
    }
    t.begin = data_start + begin;
    t.end = data_start + end;
    tensors.push_back(std::move(t));
  }

  std::sort(tensors.begin(), tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t cursor = data_start;
  for (const SafetensorsTensor& t : tensors) {
    if (t.begin < cursor) {
      return DataLossError(path + ": tensor '" + t.spec.name + "' overlaps the previous tensor " +
                           "(starts at data offset " + std::to_string(t.begin - data_start) +
                           ", previous ends at " + std::to_string(cursor - data_start) + ")");
    }
    if (t.begin > cursor) {
      return DataLossError(path + ": gap of " + std::to_string(t.begin - cursor) +
                           " bytes before tensor '" + t.spec.name + "'");
    }
    cursor = t.end;
  }
  if (cursor != file_size) {
    return DataLossError(path + ": tensors end at data offset " +
                         std::to_string(cursor - data_start) + " but the file holds " +
                         std::to_string(data_bytes) + " data bytes");
  }
  return tensors;
}

}  // namespace strata::runtime
