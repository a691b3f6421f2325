// GPT model shapes strata trains, by preset name, and their parameter counts.
//
// The architecture (built with libtorch in runtime/, counted here without it):
//   * byte-level tokens (vocab 256), a learned token embedding [vocab, d] and a learned position
//     embedding [seq, d];
//   * n_layers blocks, each: LayerNorm (weight, bias), attention qkv Linear(d, 3d, bias), attention
//     out Linear(d, d, bias), LayerNorm, MLP Linear(d, 4d, bias), Linear(4d, d, bias):
//     12·d² + 13·d parameters per block;
//   * a final LayerNorm (2·d) and an LM head Linear(d, vocab, no bias), not tied to the embedding.
// Blocks are the offload units; everything else (embeddings, final norm, head) is "resident" and
// stays on the compute device.
//
// Presets: "tiny" (tests), "small" (the demo, a few million parameters), then GPT-3 sizes
// "125M", "350M", "1.3B", "2.7B", "6.7B", "13B" (layers/width/heads as in the GPT-3 paper,
// sequence length 2048).
//
// Thread-safety: everything here is immutable or a pure function.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace strata::runtime {

struct GptShape {
  std::string name;
  int n_layers = 0;
  int d_model = 0;
  int n_heads = 0;
  int seq_len = 0;
  int vocab = 256;
};

// Every preset, smallest first.
std::span<const GptShape> GptPresets();

// The preset called `name` (case-insensitive: "1.3b" finds "1.3B"). NotFound lists the presets.
Result<GptShape> FindGptPreset(std::string_view name);

// Parameters in one transformer block: 12·d² + 13·d.
uint64_t BlockParams(const GptShape& shape);
// The elements of each parameter tensor of one block (norms, weights and biases; they sum to
// BlockParams), for the tensors' split by stage3_param_persistence_threshold.
std::vector<uint64_t> BlockTensorNumels(const GptShape& shape);
// Parameters outside the blocks: 2·vocab·d (embedding + head) + seq·d + 2·d (final LayerNorm).
uint64_t ResidentParams(const GptShape& shape);
// n_layers·BlockParams + ResidentParams.
uint64_t TotalParams(const GptShape& shape);

}  // namespace strata::runtime
