// hf_reference_dense: the RoPE tables of the dense-family reference (hf_reference_dense.cc),
// exposed so its self-tests can check each rope_scaling type against hand-computed values.
// Everything else of the dense families is reached through hf_config_reference.h.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>

namespace strata::testing::families {

// What the rotary embedding of a LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM /
// Phi3ForCausalLM built from `config` uses in a forward over positions 0..seq_len-1 (after
// transformers' dynamic_rope_update: dynamic NTK recomputed when seq_len exceeds
// max_position_embeddings, longrope's long factors when seq_len exceeds
// original_max_position_embeddings).
struct DenseRopeTables {
  torch::Tensor inv_freq;  // [rotary_dim / 2] fp32
  torch::Tensor cos, sin;  // [seq_len, rotary_dim] fp32, already multiplied by attention_scaling
  double attention_scaling = 1.0;
  int64_t rotary_dim = 0;  // int(head_dim * partial_rotary_factor)
};

// std::invalid_argument for a rope_scaling transformers would reject for the architecture.
DenseRopeTables DenseRope(const nlohmann::json& config, int64_t seq_len);

}  // namespace strata::testing::families
