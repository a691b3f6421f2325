// The Llama family's shapes (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM) as a Hugging
// Face config.json states them, the presets of the common models, and their parameter counts.
// Torch-free: `strata estimate` plans these models without libtorch; runtime/models/llama.h builds
// them.
//
// The architecture (transformers' modeling_llama.py; Mistral is the same layout, Qwen2 adds
// biases to q/k/v): token embedding [vocab, hidden]; num_hidden_layers decoder layers (the offload
// units), each input_layernorm (RMSNorm) -> self_attn (q [heads·head_dim, hidden], k and v
// [kv_heads·head_dim, hidden], o [hidden, heads·head_dim], rotary embeddings, grouped-query
// attention) -> residual, post_attention_layernorm -> mlp (gate, up [intermediate, hidden], down
// [hidden, intermediate], SwiGLU) -> residual; final norm; lm_head [vocab, hidden], absent when
// tie_word_embeddings (the head is the embedding).
//
// ParseHfConfig reads what strata needs from config.json, with transformers' defaults for absent
// keys (per model_type), and refuses what it cannot train: another architecture, hidden_act other
// than silu, a rope_scaling type other than llama3/default, inconsistent head counts. Errors name
// the file (`source`) and the key.
//
// Thread-safety: pure functions and immutable data.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace strata::runtime {

// rope_scaling {"rope_type": "llama3", ...} (Llama 3.1+).
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct LlamaShape {
  std::string name;          // preset name, or the directory it came from
  std::string architecture;  // "LlamaForCausalLM" | "MistralForCausalLM" | "Qwen2ForCausalLM"
  std::string model_type;    // "llama" | "mistral" | "qwen2"
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;
  int64_t head_dim = 128;  // config's head_dim, else hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<Llama3RopeScaling> rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // Llama: biases on q, k, v and o
  bool qkv_bias = false;        // Qwen2: biases on q, k, v (not o)
  bool mlp_bias = false;        // Llama: biases on gate, up, down
  int64_t max_position_embeddings = 2048;
  std::optional<int64_t> sliding_window;  // Mistral; null: full attention
  std::string torch_dtype = "float32";    // config.json's torch_dtype (what export writes)
  double initializer_range = 0.02;        // std of random initialization (presets)
};

// Reads a config.json object. `source` names it in errors (e.g. "DIR/config.json").
Result<LlamaShape> ParseHfConfig(const nlohmann::json& config, const std::string& source);
// The config.json transformers would write for `shape` (for synthetic checkpoints and exports of
// presets), with torch_dtype set to `torch_dtype`.
nlohmann::json HfConfigJson(const LlamaShape& shape, const std::string& torch_dtype);

// Every preset: llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, llama-2-7b, llama-2-13b, mistral-7b,
// qwen2.5-7b, llama-3.1-70b (shapes as their published config.json), plus "llama-tiny" (tests).
std::span<const LlamaShape> LlamaPresets();
// The preset called `name` (case-insensitive). NotFound lists the presets.
Result<LlamaShape> FindLlamaPreset(std::string_view name);

// Parameters of one decoder layer, outside the layers (embedding, final norm, head), and in all.
uint64_t LlamaLayerParams(const LlamaShape& s);
// The elements of each parameter tensor of one decoder layer (they sum to LlamaLayerParams).
std::vector<uint64_t> LlamaLayerTensorNumels(const LlamaShape& s);
uint64_t LlamaResidentParams(const LlamaShape& s);
uint64_t LlamaTotalParams(const LlamaShape& s);
// The largest single tensor of a layer (the engine's per-tensor staging is sized by it).
uint64_t LlamaLargestLayerTensor(const LlamaShape& s);

}  // namespace strata::runtime
