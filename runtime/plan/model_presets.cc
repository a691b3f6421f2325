#include "runtime/plan/model_presets.h"

#include <array>
#include <cctype>

namespace strata::runtime {
namespace {

// GPT-3 rows: Brown et al. 2020, table 2.1 (n_layers, d_model, n_heads), context 2048.
const std::array<GptShape, 8> kPresets = {{
    {"tiny", 2, 64, 4, 64},
    {"small", 4, 256, 8, 128},
    {"125M", 12, 768, 12, 2048},
    {"350M", 24, 1024, 16, 2048},
    {"1.3B", 24, 2048, 16, 2048},
    {"2.7B", 32, 2560, 32, 2048},
    {"6.7B", 32, 4096, 32, 2048},
    {"13B", 40, 5120, 40, 2048},
}};

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::span<const GptShape> GptPresets() { return kPresets; }

Result<GptShape> FindGptPreset(std::string_view name) {
  std::string names;
  for (const GptShape& shape : kPresets) {
    if (EqualsIgnoreCase(shape.name, name)) return shape;
    if (!names.empty()) names += ", ";
    names += shape.name;
  }
  return NotFoundError("unknown model preset '" + std::string(name) + "'; presets: " + names);
}

uint64_t BlockParams(const GptShape& shape) {
  const uint64_t d = static_cast<uint64_t>(shape.d_model);
  return 12 * d * d + 13 * d;
}

std::vector<uint64_t> BlockTensorNumels(const GptShape& shape) {
  const uint64_t d = static_cast<uint64_t>(shape.d_model);
  // ln1 (weight, bias), qkv, proj, ln2, fc1, fc2 (weight, bias each): gpt.cc's GptBlock.
  return {d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d};
}

uint64_t ResidentParams(const GptShape& shape) {
  const uint64_t d = static_cast<uint64_t>(shape.d_model);
  return 2 * static_cast<uint64_t>(shape.vocab) * d + static_cast<uint64_t>(shape.seq_len) * d +
         2 * d;
}

uint64_t TotalParams(const GptShape& shape) {
  return static_cast<uint64_t>(shape.n_layers) * BlockParams(shape) + ResidentParams(shape);
}

}  // namespace strata::runtime
