// HfCheckpoint: the weights of a Hugging Face model directory, validated and read tensor by
// tensor without loading whole files.
//
// A directory holds either DIR/model.safetensors or DIR/model.safetensors.index.json
// ({"metadata": {...}, "weight_map": {tensor name: shard file name}}) and the shards it names.
// When both exist the single file is used, as transformers' from_pretrained does (it checks
// model.safetensors first). Neither is kNotFound naming DIR and both names.
//
// Open() validates everything before returning, so an offset it hands out can be trusted: every
// shard's safetensors header (ReadSafetensorsIndex: JSON, dtypes, shapes, tensors tiling the file;
// a truncated shard is kDataLoss naming the file), shard names that stay inside DIR (no '/', not
// "." or ".."), a shard the index names that does not exist (kNotFound naming it), every
// weight_map entry present in the shard it names, no tensor in a shard that the index does not
// list, and no tensor name in two shards (all kDataLoss naming the tensor and the file(s)).
//
// Ownership: the checkpoint owns one read-only fd per shard, open until it is destroyed.
// Threads: after Open(), every method is const and may be called from any number of threads at
// once (reads use pread only, each call stages into its own buffer).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "base/status.h"

namespace strata::runtime {

inline constexpr char kHfWeightsName[] = "model.safetensors";
inline constexpr char kHfWeightsIndexName[] = "model.safetensors.index.json";

struct HfTensorInfo {
  std::string name;
  std::string file;   // absolute path of its shard
  std::string dtype;  // safetensors spelling: "F32", "BF16", "F16", "I64", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // absolute file offsets of its bytes
  uint64_t numel() const;       // product of shape (1 for a scalar)
};

class HfCheckpoint {
 public:
  [[nodiscard]] static Result<std::unique_ptr<HfCheckpoint>> Open(const std::string& dir);
  HfCheckpoint(const HfCheckpoint&) = delete;
  HfCheckpoint& operator=(const HfCheckpoint&) = delete;

  // Every tensor, sorted by name.
  const std::vector<HfTensorInfo>& tensors() const { return tensors_; }
  // The tensor called `name`, or null.
  const HfTensorInfo* Find(const std::string& name) const;
  // Absolute paths of the shards (one for a single-file checkpoint), sorted by name.
  const std::vector<std::string>& files() const { return files_; }
  // The dtype that holds most of the bytes ("BF16", ...): what an export writes by default. Ties
  // go to the alphabetically first dtype; "" for a checkpoint without tensor bytes.
  std::string dominant_dtype() const;

  // Reads tensor `name` as fp32 into `dst` (numel() floats): F32 is copied, BF16 and F16 are
  // converted exactly (cpu_optimizer/convert.h). Reads with pread in chunks of at most
  // kReadChunkBytes, staging at most that much. Errors: unknown name kNotFound; another dtype
  // kInvalidArgument naming tensor, file and dtype; a short read kDataLoss and a failed read
  // kIoError, both naming the file and the offset.
  [[nodiscard]] Status ReadFloat32(const std::string& name, float* dst) const;
  // The tensor's bytes as stored (end - begin bytes) into `dst`, for a byte-exact re-export.
  [[nodiscard]] Status ReadRaw(const std::string& name, void* dst) const;
  // Whether tensors `a` and `b` hold the same values read as fp32 (same shape, every element
  // equal, as torch.equal; any dtypes ReadFloat32 reads), reading both in chunks of
  // kReadChunkBytes. Errors as ReadFloat32's.
  [[nodiscard]] Result<bool> SameValues(const std::string& a, const std::string& b) const;

  static constexpr uint64_t kReadChunkBytes = uint64_t{8} << 20;

 private:
  HfCheckpoint() = default;
  // Index into tensors_ of `name`, or -1.
  int64_t IndexOf(const std::string& name) const;
  // pread of `bytes` at file `offset` of tensor `tensor`'s shard; errors name the tensor.
  Status ReadRange(size_t tensor, uint64_t offset, void* dst, uint64_t bytes) const;
  // Tensor `tensor`'s bytes into dst, in chunks of kReadChunkBytes.
  Status ReadAll(size_t tensor, void* dst) const;
  // Elements [first, first + n) of tensor `tensor` as fp32 into dst (staging n halves).
  Status ReadFloat32Range(size_t tensor, uint64_t first, uint64_t n, float* dst) const;

  std::vector<HfTensorInfo> tensors_;  // sorted by name
  std::vector<uint32_t> shard_of_;     // tensors_[i] lives in files_[shard_of_[i]]
  std::vector<std::string> files_;
  std::vector<UniqueFd> fds_;  // parallel to files_
};

// A config that ties the head to the embedding (tie_word_embeddings) over weights that also hold
// an lm_head.weight: transformers (PreTrainedModel.tie_weights) ties them only when the two hold
// the same values, and otherwise keeps the file's head, untied, with a warning. This does the
// same: when `*tie_word_embeddings` is true and `checkpoint` holds an lm_head.weight whose values
// differ from model.embed_tokens.weight's, it sets `*tie_word_embeddings` to false and logs a
// warning naming `dir`. Errors: a failed read (as HfCheckpoint::SameValues).
[[nodiscard]] Status UntieADistinctHead(const HfCheckpoint& checkpoint, const std::string& dir,
                                        bool* tie_word_embeddings);

}  // namespace strata::runtime
