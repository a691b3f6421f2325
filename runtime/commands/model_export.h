// The Hugging Face export of a trained model (Llama-family models: a preset or a Hugging Face
// directory): what `strata train --export` and every --save of such a model (SAVE/hf) write.
//
// ExportHf writes `dir` as transformers reads it: safetensors shards of at most max_shard_size
// with model.safetensors.index.json (runtime/persist/hf_export.h: written so that an interrupted
// export leaves the directory as it was), tensors named as the input's and in its dtypes (or
// ExportOptions::dtype), config.json (the input's, torch_dtype naming the dtype most parameters
// are written in), and the tokenizer and generation files of the input directory copied. The
// weights stream unit by unit out of the engine, so host memory never holds the model.
//
// Ranks: every rank calls ExportHf at the same point (the engine gathers each unit across them);
// rank 0 alone writes. Threads: the engine's training thread, between steps. `stop` (may be null)
// is read before each tensor with one rank: once set, the export ends with kCancelled.
#pragma once

#include <atomic>
#include <string>

#include "base/status.h"

namespace strata::runtime {

class CausalLm;
class Engine;

// Where and how Export writes a Hugging Face directory.
struct ExportOptions {
  std::string dir;
  std::string dtype;                   // "" (each tensor as the input's), fp32, bf16, fp16
  std::string max_shard_size = "5GB";  // transformers' max_shard_size
};

// What ExportHf would refuse before writing anything: a GPT model (`model` names it, as the user
// gave it), no directory, a directory that is or holds the input model's, a bad dtype or shard
// size. kInvalidArgument.
Status CheckHfExport(const CausalLm& lm, const std::string& model, const ExportOptions& options);

// Writes the engine's current weights of `lm` to options.dir (see above); `rank` of `world`.
Status ExportHf(Engine& engine, const CausalLm& lm, const std::string& model, int rank, int world,
                const std::atomic<bool>* stop, const ExportOptions& options);

}  // namespace strata::runtime
