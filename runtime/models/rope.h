// Rotary position embeddings as transformers computes them (modeling_rope_utils.py, the models'
// *RotaryEmbedding.forward and apply_rotary_pos_emb), for every rope type LlamaShape describes:
//
//   RotaryEmbedding rope(shape);                                    // once per model
//   RopeTables t = rope.Tables(offset, T, torch::kBFloat16, device);  // once per forward
//   q = ApplyRotary(q, t.cos, t.sin);                               // [B, heads, T, head_dim]
//
// Numerics: inverse frequencies in fp32 (1 / theta^(arange(0, dim, 2) / dim), then the type's
// scaling: linear divides by the factor; dynamic recomputes the base from the sequence length
// once it passes max_position_embeddings; yarn blends interpolated and extrapolated frequencies
// over its correction range; longrope divides by the long factors past the original length, else
// by the short ones; llama3 smooths between the two wavelength bounds); cos and sin of
// cat(f, f) with f = position · inv_freq in fp32, times the attention factor (yarn, longrope),
// then cast to the compute dtype. The dims past rotary_dim (partial_rotary_factor < 1) pass
// through unrotated.
//
// "Sequence length" is position_offset + T, what transformers' dynamic_rope_update takes from
// max(position_ids) + 1, so a generation step with a cache rotates as a full forward would.
//
// Thread-safety: a RotaryEmbedding is immutable after construction.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>

#include "runtime/plan/llama_shape.h"

namespace strata::runtime {

struct RopeTables {
  torch::Tensor cos, sin;  // [T, rotary_dim] each
};

class RotaryEmbedding {
 public:
  // rope_theta, head_dim · partial_rotary_factor, max_position_embeddings and rope_scaling of
  // `s` (already checked by ParseHfConfig).
  explicit RotaryEmbedding(const LlamaShape& s);

  // The inverse frequencies [rotary_dim / 2], fp32, of a forward over sequences of `seq_len`.
  torch::Tensor InverseFrequencies(int64_t seq_len) const;
  // cos and sin of positions offset .. offset + T - 1, in `dtype` on `device`.
  RopeTables Tables(int64_t position_offset, int64_t T, torch::ScalarType dtype,
                    const torch::Device& device) const;
  int64_t rotary_dim() const { return dim_; }

 private:
  torch::Tensor DefaultFrequencies() const;

  double theta_;
  int64_t dim_;
  int64_t max_position_embeddings_;
  std::optional<RopeScaling> scaling_;
  torch::Tensor inv_freq_;       // every type's frequencies within the original length
  torch::Tensor long_inv_freq_;  // longrope past the original length
};

// x·cos + rotate_half(x)·sin on the first cos.size(-1) dims of x's last dimension
// (rotate_half(y) = cat(-y2, y1)); the others are copied. cos and sin broadcast against x.
torch::Tensor ApplyRotary(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin);

}  // namespace strata::runtime
