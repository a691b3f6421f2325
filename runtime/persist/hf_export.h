// HfExportWriter: writes a Hugging Face weights directory (what transformers' save_pretrained
// writes and from_pretrained loads), streamed tensor by tensor.
//
// Sharding is huggingface_hub's split_state_dict_into_shards: walking the tensors in the given
// order, a tensor larger than max_shard_bytes gets a shard of its own (numbered where it is met);
// any other tensor starts a new shard when adding it would take the current one past
// max_shard_bytes. One shard is DIR/model.safetensors; N > 1 shards are
// DIR/model-00001-of-0000N.safetensors ... (5 digits, as transformers) plus
// DIR/model.safetensors.index.json, written as transformers writes it (sorted keys, 2-space
// indent, ASCII, trailing newline):
//   {"metadata": {"total_parameters": <sum of numel>, "total_size": <sum of bytes>},
//    "weight_map": {tensor name: shard file name}}
// (transformers' total_parameters is model.num_parameters(): the same unless the export holds
// buffers, which it counts here too).
// `metadata` becomes every shard's "__metadata__" (transformers refuses to load a shard without
// "format": "pt", the default).
//
// Crash consistency: each shard streams into its own PATH.tmp (SafetensorsWriter) and nothing in
// DIR changes until Finish(), which renames the shards into place one by one (each file is
// replaced atomically), then writes the index atomically, then removes what an earlier export
// left that this one does not replace: model-NNNNN-of-MMMMM.safetensors files of another count,
// the index when this export is a single file, model.safetensors when it is sharded (transformers
// would load it first). An export that fails or is abandoned before Finish() removes its .tmp
// files and leaves DIR as it was; a crash or error during Finish() may leave some shards new and
// some old (each whole).
//
// Threads: one thread at a time. Errors: a write out of order or twice (kFailedPrecondition), of
// an unknown name, the wrong size or (WriteFloat32) a non-float dtype (kInvalidArgument) is
// refused and changes nothing; an I/O error fails the writer for good (later calls:
// kFailedPrecondition).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace strata::runtime {

class SafetensorsWriter;

struct HfExportTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16" (WriteFloat32); any safetensors dtype for WriteRaw
  std::vector<int64_t> shape;
};

// transformers' `max_shard_size` strings, as bytes: "5GB" = 5*10^9 (also KB, MB, TB), "5GiB" =
// 5*2^30 (also KiB, MiB, TiB), a plain integer = bytes. Unit letters in any case, except that a
// decimal unit ending in a lowercase 'b' is refused (transformers reads "5Gb" as gigabits). A
// number with a unit may have a fraction ("1.5GB", rounded down to a byte, as huggingface_hub).
// Empty, malformed, zero or more than 2^64-1: kInvalidArgument naming the text and the forms.
[[nodiscard]] Result<uint64_t> ParseShardSize(const std::string& text);

class HfExportWriter {
 public:
  // Validates the tensors (distinct non-empty names, known dtypes, non-negative shapes),
  // max_shard_bytes > 0, creates DIR if missing and plans the shards. Writes nothing in DIR yet
  // but each shard's PATH.tmp as its first tensor arrives.
  [[nodiscard]] static Result<std::unique_ptr<HfExportWriter>> Create(
      const std::string& dir, std::vector<HfExportTensor> tensors, uint64_t max_shard_bytes,
      std::map<std::string, std::string> metadata = {{"format", "pt"}});
  ~HfExportWriter();  // without a successful Finish: removes the .tmp files
  HfExportWriter(const HfExportWriter&) = delete;
  HfExportWriter& operator=(const HfExportWriter&) = delete;

  // The next tensor, in the order given to Create, each exactly once. WriteFloat32 converts
  // `numel` fp32 values to the tensor's dtype (F32 copied; BF16/F16 rounded to nearest even by
  // cpu_optimizer/convert.h, staging at most kStagingBytes at a time). WriteRaw takes the bytes
  // already in the tensor's dtype (little-endian, as safetensors stores them).
  [[nodiscard]] Status WriteFloat32(const std::string& name, const float* values, uint64_t numel);
  [[nodiscard]] Status WriteRaw(const std::string& name, const void* bytes, uint64_t size);
  // Requires every tensor written. Finishes the shards (fsync + rename), writes the index when
  // there is more than one shard, removes a previous export's leftovers and fsyncs DIR.
  [[nodiscard]] Status Finish();

  // Absolute paths of the shards, in shard order (known from Create on).
  const std::vector<std::string>& files() const { return files_; }
  // For each tensor in the given order, the index into files() of its shard.
  const std::vector<size_t>& shard_of() const { return shard_of_; }

  static constexpr uint64_t kStagingBytes = uint64_t{4} << 20;

 private:
  HfExportWriter() = default;
  // The index of `name` if it is the tensor to write next; else why not.
  Result<size_t> Next(const std::string& name) const;
  // Appends bytes of tensor `i` to its shard, creating the shard's writer on its first tensor.
  Status WriteTensor(size_t i, const void* data, uint64_t bytes);

  std::string dir_;
  std::vector<HfExportTensor> tensors_;
  std::vector<uint64_t> bytes_;                     // per tensor
  std::vector<size_t> shard_of_;                    // per tensor
  std::vector<std::vector<size_t>> shard_tensors_;  // per shard: its tensors, in order
  std::vector<std::string> files_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::unique_ptr<SafetensorsWriter>> writers_;  // per shard, opened lazily
  uint64_t total_parameters_ = 0;
  uint64_t total_size_ = 0;
  size_t next_ = 0;  // the tensor to write next
  bool failed_ = false;
  bool finished_ = false;
};

}  // namespace strata::runtime
