// safetensors files: the format the Hugging Face ecosystem loads, written and indexed here.
//
// Layout (exactly the published format): an 8-byte little-endian u64 N, then N bytes of UTF-8
// JSON, then the byte buffer. The JSON is an object mapping each tensor name to
//   {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
// with offsets relative to the start of the byte buffer, plus an optional "__metadata__" object
// of string values. The writer pads the header with spaces to a multiple of 8 and lays the
// tensors out contiguously in the order given, with no gaps or overlaps.
//
// Writing streams: Create() writes the header to PATH.tmp, Append() takes the tensors' bytes in
// order in chunks of any size, and Finish() checks that every byte arrived, fsyncs and renames
// PATH.tmp to PATH (a crash leaves PATH as it was). The index reader validates everything before
// the caller trusts an offset: header length against the file size (capped at 100 MB, as the
// reference implementation does), JSON syntax, duplicate names, dtypes, shapes, and that the
// tensors tile the buffer exactly.
//
// Threads: a writer is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "base/status.h"

namespace strata::runtime {

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Bytes per element of a safetensors dtype ("F64", "F32", "F16", "BF16", "I64", "I32", "I16",
// "I8", "U64", "U32", "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2"); 0 if unknown.
size_t SafetensorsDtypeSize(const std::string& dtype);

struct TensorSpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;  // [] is a scalar (one element)
};

class SafetensorsWriter {
 public:
  // Validates the specs (distinct non-empty names other than "__metadata__", known dtypes,
  // non-negative dims, sizes that fit in 64 bits) and writes the header to `path` + ".tmp".
  static Result<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, std::vector<TensorSpec> tensors,
      std::map<std::string, std::string> metadata = {});
  ~SafetensorsWriter();  // without a successful Finish: removes PATH.tmp
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The tensors' bytes, in the order given to Create, in chunks of any size. Writing more than
  // the tensors hold is an error.
  Status Append(const void* data, size_t bytes);
  // Checks every byte was written, fsyncs, renames PATH.tmp to PATH and fsyncs the directory.
  Status Finish();

  uint64_t data_bytes() const { return total_; }
  uint64_t written() const { return written_; }

 private:
  SafetensorsWriter(std::string path, AtomicFileWriter file, uint64_t total);

  std::string path_;
  AtomicFileWriter file_;  // PATH.tmp until Finish
  uint64_t total_;
  uint64_t written_ = 0;
  bool failed_ = false;
  bool finished_ = false;
};

struct SafetensorsTensor {
  TensorSpec spec;
  uint64_t begin, end;  // absolute file offsets of the tensor's bytes
};

// Reads and validates the header of the safetensors file at `path`. Tensors are returned in
// data (offset) order. `metadata`, if given, receives "__metadata__" (empty if absent).
Result<std::vector<SafetensorsTensor>> ReadSafetensorsIndex(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

}  // namespace strata::runtime
