// The model `strata estimate --model` names, and the counts its --params/--largest-layer take: a
// GPT preset, a Llama-family preset or a Hugging Face model directory (its config.json) resolved
// to a shape, DeepSpeed's largest-leaf parameter count of each, and counts written "1.3e9",
// "125M", "6.7B", "350k". Stateless functions; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"
#include "runtime/plan/llama_shape.h"
#include "runtime/plan/model_presets.h"

namespace strata::runtime {

// "1.3e9", "125M", "6.7B", "350k": decimal multipliers (k, M, B or G, T). kInvalidArgument for
// anything else, and for counts below 1 or above 1e15.
Result<uint64_t> ParseCount(const std::string& text);
// "1.30 B", "125.00 M", "350.00 k", "999".
std::string FormatCount(uint64_t n);

// DeepSpeed's L: the largest parameter count of one leaf module of the GPT (what _all_live
// measures): the MLP's first Linear (4d² + 4d) or an embedding / the head (vocab·d, seq·d).
uint64_t LargestLeafParams(const GptShape& s);
// The same for a Llama-family model: the largest Linear of a layer (LlamaLargestLayerTensor) or
// the embedding / the head (vocab·hidden).
uint64_t LargestLeafParams(const LlamaShape& s);

// The model --model names: exactly one of the two is set.
struct ModelChoice {
  std::optional<GptShape> gpt;
  std::optional<LlamaShape> llama;
};

// "GPT presets: ...; Llama-family presets: ..." (for messages).
std::string PresetNames();

// --model: a GPT preset, else a Llama-family preset, else a Hugging Face model directory (a
// preset's name wins over a directory of the same name; write ./NAME for the directory). Errors
// name the flag (or the directory's config.json): kNotFound, kInvalidArgument.
Result<ModelChoice> ResolveModel(const std::string& name);

}  // namespace strata::runtime
