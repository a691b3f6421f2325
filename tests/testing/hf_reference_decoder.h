// Pieces the Gemma 2 and mixture-of-experts references (hf_reference_gemma2.cc,
// hf_reference_moe.cc) share: reading config.json keys with transformers' defaults, the default
// RoPE, the (sliding-window) causal mask of masking_utils.py and eager attention. Written from
// transformers' Python source like the rest of hf_config_reference.h; errors are
// std::invalid_argument naming the key.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "tests/testing/hf_config_reference.h"

namespace strata::testing::families {

// config[key] when present and not null, else `fallback`; std::invalid_argument when of the
// wrong type.
int64_t IntKey(const nlohmann::json& config, const char* key, int64_t fallback);
double DoubleKey(const nlohmann::json& config, const char* key, double fallback);
bool BoolKey(const nlohmann::json& config, const char* key, bool fallback);
std::string StringKey(const nlohmann::json& config, const char* key, const std::string& fallback);
// A key whose null means "none" (sliding_window, softcaps): absent -> `fallback`, null -> none.
std::optional<int64_t> OptionalIntKey(const nlohmann::json& config, const char* key,
                                      std::optional<int64_t> fallback);
std::optional<double> OptionalDoubleKey(const nlohmann::json& config, const char* key,
                                        std::optional<double> fallback);

// rope_theta for the default (unscaled) RoPE: config "rope_theta", or "rope_theta" inside newer
// transformers' "rope_parameters", else `fallback`. A non-null "rope_scaling" (or
// rope_parameters of a type other than "default") is not covered by these families'
// references: std::invalid_argument.
double DefaultRopeTheta(const nlohmann::json& config, double fallback);

// "layer_types"[layer] == "sliding_attention" when the config lists layer types; nullopt when it
// has no "layer_types" key (the family then applies its own rule).
std::optional<bool> ListedLayerSlides(const nlohmann::json& config, int64_t layer,
                                      int64_t num_layers);

// Checks ids [B, T] lie in [0, vocab) and returns them as contiguous int64.
torch::Tensor CheckedIds(const torch::Tensor& ids, int64_t vocab_size);

// The additive mask [T, T] fp32 eager attention adds to the scores: 0 where key kv is visible
// from query q (kv <= q, and kv > q - window when `window` is set: masking_utils.py's
// causal_mask_function and sliding_window_overlay), finfo(fp32).min elsewhere. The planted bug
// "sliding_window_off_by_one" widens the window by one key.
torch::Tensor CausalMask(int64_t t, std::optional<int64_t> window);

struct AttentionShape {
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  bool qkv_bias = false, o_bias = false;
};

// One decoder layer's self-attention on x [B, T, hidden] with weights
// `prefix`{q,k,v,o}_proj.{weight,bias}: RoPE (cos/sin [T, head_dim]), repeat_kv, scores * scaling,
// then softcap(s) = tanh(s / cap) * cap when `softcap` is set, + mask, softmax in fp32, @ v,
// o_proj. Returns [B, T, hidden].
torch::Tensor SelfAttention(const torch::Tensor& x, const HfWeights& weights,
                            const std::string& prefix, const AttentionShape& shape,
                            const std::pair<torch::Tensor, torch::Tensor>& cos_sin,
                            const torch::Tensor& mask, double scaling,
                            std::optional<double> softcap);

// cos, sin [T, head_dim] of the default RoPE with base `theta` for positions 0..T-1.
std::pair<torch::Tensor, torch::Tensor> DefaultRope(int64_t head_dim, double theta, int64_t t);

}  // namespace strata::testing::families
