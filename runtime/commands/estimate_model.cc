// The model `strata estimate --model` names, and counts: see estimate_model.h.
#include "runtime/commands/estimate_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "base/json_text.h"
#include "runtime/persist/hf_checkpoint.h"

namespace strata::runtime {

using nlohmann::json;

// "1.3e9", "125M", "6.7B", "350k": decimal multipliers (k, M, B or G, T).
Result<uint64_t> ParseCount(const std::string& text) {
  size_t end = 0;
  double v = 0;
  try {
    v = std::stod(text, &end);
  } catch (const std::exception&) {
    return InvalidArgumentError("not a count: '" + text + "'");
  }
  std::string suffix = text.substr(end);
  double scale = 1;
  if (suffix == "k" || suffix == "K") {
    scale = 1e3;
  } else if (suffix == "M" || suffix == "m") {
    scale = 1e6;
  } else if (suffix == "B" || suffix == "b" || suffix == "G" || suffix == "g") {
    scale = 1e9;
  } else if (suffix == "T" || suffix == "t") {
    scale = 1e12;
  } else if (!suffix.empty()) {
    return InvalidArgumentError("bad suffix in count '" + text + "' (k, M, B, T)");
  }
  v *= scale;
  if (!(v >= 1) || v > 1e15) return InvalidArgumentError("count out of range: '" + text + "'");
  return static_cast<uint64_t>(std::llround(v));
}

std::string FormatCount(uint64_t n) {
  char buf[32];
  if (n >= 1000000000) {
    std::snprintf(buf, sizeof(buf), "%.2f B", n / 1e9);
  } else if (n >= 1000000) {
    std::snprintf(buf, sizeof(buf), "%.2f M", n / 1e6);
  } else if (n >= 1000) {
    std::snprintf(buf, sizeof(buf), "%.2f k", n / 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(n));
  }
  return buf;
}

// DeepSpeed's L: the largest parameter count of one leaf module of the GPT (what _all_live
// measures): the MLP's first Linear (4d² + 4d) or an embedding / the head (vocab·d, seq·d).
uint64_t LargestLeafParams(const GptShape& s) {
  const uint64_t d = static_cast<uint64_t>(s.d_model);
  return std::max({4 * d * d + 4 * d, static_cast<uint64_t>(s.vocab) * d,
                   static_cast<uint64_t>(s.seq_len) * d});
}

// The same for a Llama-family model: the largest Linear of a layer (LlamaLargestLayerTensor) or
// the embedding / the head (vocab·hidden).
uint64_t LargestLeafParams(const LlamaShape& s) {
  return std::max(static_cast<uint64_t>(s.vocab_size) * static_cast<uint64_t>(s.hidden_size),
                  LlamaLargestLayerTensor(s));
}

std::string PresetNames() {
  std::string gpt, llama;
  for (const GptShape& s : GptPresets()) gpt += (gpt.empty() ? "" : ", ") + s.name;
  for (const LlamaShape& s : LlamaPresets()) llama += (llama.empty() ? "" : ", ") + s.name;
  return "GPT presets: " + gpt + "; Llama-family presets: " + llama;
}

namespace {

// DIR/config.json as a LlamaShape named DIR. Errors name the file: missing (NotFound), not JSON
// or not a model strata can train (InvalidArgument, from ParseHfConfig).
Result<LlamaShape> ReadHfModelDir(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string path = dir + "/config.json";
  Result<json> read = ReadJsonFile(path);
  if (read.status().code() == StatusCode::kNotFound) {
    return NotFoundError(path +
                         ": cannot be read (a Hugging Face model directory holds config.json)");
  }
  STRATA_ASSIGN_OR_RETURN(const json config, std::move(read));
  STRATA_ASSIGN_OR_RETURN(LlamaShape shape, ParseHfConfig(config, path));
  shape.name = dir;
  // The head train builds (a tied config over a distinct lm_head trains it untied). Weights are
  // optional here: a directory with config.json alone is estimated as its config says.
  if (Result<std::unique_ptr<HfCheckpoint>> ckpt = HfCheckpoint::Open(dir); ckpt.ok()) {
    STRATA_RETURN_IF_ERROR(UntieADistinctHead(**ckpt, dir, &shape.tie_word_embeddings));
  }
  return shape;
}

}  // namespace

// --model: a GPT preset, else a Llama-family preset, else a directory (a preset's name wins over
// a directory of the same name; write ./NAME for the directory).
Result<ModelChoice> ResolveModel(const std::string& name) {
  ModelChoice out;
  if (Result<GptShape> gpt = FindGptPreset(name); gpt.ok()) {
    out.gpt = std::move(*gpt);
    return out;
  }
  if (Result<LlamaShape> llama = FindLlamaPreset(name); llama.ok()) {
    out.llama = std::move(*llama);
    return out;
  }
  std::error_code ec;
  if (std::filesystem::is_directory(name, ec)) {
    STRATA_ASSIGN_OR_RETURN(out.llama, ReadHfModelDir(name));
    return out;
  }
  if (std::filesystem::exists(name, ec)) {
    return InvalidArgumentError("--model " + name +
                                ": not a directory (give the Hugging Face model directory that "
                                "holds config.json)");
  }
  return NotFoundError("--model " + name + ": no such preset or directory (" + PresetNames() +
                       "; or a Hugging Face model directory with a config.json)");
}

}  // namespace strata::runtime
