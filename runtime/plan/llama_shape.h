// The Llama family's shapes (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
// Phi3ForCausalLM, Gemma2ForCausalLM, and the mixtures of experts MixtralForCausalLM and
// Qwen2MoeForCausalLM) as a Hugging Face config.json states them, the presets of the common
// models, and their parameter counts. Torch-free: `strata estimate` plans these models without
// libtorch; runtime/models/llama.h builds them.
//
// The architecture (transformers' modeling_llama.py; Mistral is the same layout, Qwen2 adds
// biases to q/k/v): token embedding [vocab, hidden]; num_hidden_layers decoder layers (the offload
// units), each input_layernorm (RMSNorm) -> self_attn (q [heads·head_dim, hidden], k and v
// [kv_heads·head_dim, hidden], o [hidden, heads·head_dim], rotary embeddings, grouped-query
// attention) -> residual, post_attention_layernorm -> mlp (gate, up [intermediate, hidden], down
// [hidden, intermediate], SwiGLU) -> residual; final norm; lm_head [vocab, hidden], absent when
// tie_word_embeddings (the head is the embedding). Phi3 (modeling_phi3.py) fuses q, k and v into
// self_attn.qkv_proj [(heads + 2·kv_heads)·head_dim, hidden] (rows q, k, v) and gate and up into
// mlp.gate_up_proj [2·intermediate, hidden] (rows gate, up), without biases.
//
// Gemma 2 (modeling_gemma2.py; runtime/models/gemma2.h computes it): two more norms per layer
// (pre_feedforward_layernorm, post_feedforward_layernorm), GeGLU instead of SwiGLU, attention
// scaled by query_pre_attn_scalar^-0.5 and soft-capped, every other layer within sliding_window,
// soft-capped logits; the same tensor shapes otherwise (head tied in the released models).
//
// Mixtures of experts (modeling_mixtral.py, modeling_qwen2_moe.py): the attention is Mistral's
// (Mixtral) or Qwen2's (Qwen2-MoE, q/k/v biases); a sparse layer's MLP is a router (Mixtral
// "block_sparse_moe.gate", Qwen2-MoE "mlp.gate" [num_experts, hidden]) choosing num_experts_per_tok
// of num_experts SwiGLU experts per token (Mixtral "block_sparse_moe.experts.E.w1/w3"
// [moe_intermediate, hidden] and "w2"; Qwen2-MoE "mlp.experts.E.gate_proj/up_proj/down_proj"),
// plus, for Qwen2-MoE, a shared expert "mlp.shared_expert.*" [shared_expert_intermediate] gated
// by sigmoid("mlp.shared_expert_gate" [1, hidden]). Qwen2-MoE layers listed in mlp_only_layers,
// or whose (index + 1) is not a multiple of decoder_sparse_step, are dense (intermediate_size).
//
// ParseHfConfig reads what strata needs from config.json, with transformers' defaults for absent
// keys (per model_type), and refuses what it cannot train: another architecture, hidden_act other
// than silu (Gemma 2: hidden_activation other than gelu_pytorch_tanh or gelu), a rope type it does
// not know, inconsistent head counts. Errors name the file
// (`source`) and the key.
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

// ---- Positions: rope scaling and sliding windows (modeling_rope_utils.py, masking_utils.py) ----

// config.json's "rope_scaling" (v5: "rope_parameters"), resolved as transformers resolves it:
// factor, original length and attention factor hold the values the formulas use (runtime/models/
// rope.h computes the frequencies).
struct RopeScaling {
  enum class Type { kLinear, kDynamic, kYarn, kLongrope, kLlama3 };
  Type type = Type::kLlama3;
  // linear: inv_freq / factor. dynamic: the NTK base grows with the sequence past
  // max_position_embeddings. yarn, longrope: explicit, else max_position_embeddings / original.
  double factor = 8.0;
  // llama3, yarn, longrope: the pretraining length (top-level key, else rope_scaling's, else
  // max_position_embeddings).
  int64_t original_max_position_embeddings = 8192;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  double beta_fast = 32.0;        // yarn
  double beta_slow = 1.0;         // yarn
  bool truncate = true;           // yarn: floor/ceil the correction range
  // yarn and longrope multiply cos and sin by it (1 for the other types).
  double attention_factor = 1.0;
  std::vector<double> short_factor, long_factor;  // longrope: rotary_dim / 2 each
};
// rope_scaling's type name as config.json spells it ("linear", ..., "llama3").
const char* RopeTypeName(RopeScaling::Type type);

struct LlamaShape {
  std::string name;  // preset name, or the directory it came from
  // "LlamaForCausalLM" | "MistralForCausalLM" | "Qwen2ForCausalLM" | "Phi3ForCausalLM" |
  // "Gemma2ForCausalLM"
  std::string architecture;
  std::string model_type;  // "llama" | "mistral" | "qwen2" | "phi3" | "gemma2"
  int64_t vocab_size = 32000;
  // The embedding row that takes no gradient from the lookup (transformers builds embed_tokens as
  // nn.Embedding(vocab_size, hidden_size, padding_idx=pad_token_id)), in 0 .. vocab_size - 1;
  // null: none. A tied head still trains that row through the logits, as in transformers.
  std::optional<int64_t> pad_token_id;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;
  int64_t head_dim = 128;  // config's head_dim, else hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;  // null: the default frequencies
  double partial_rotary_factor = 1.0;       // rotary_dim = int(head_dim · factor)
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // Llama: biases on q, k, v and o
  bool qkv_bias = false;        // Qwen2: biases on q, k, v (not o)
  bool mlp_bias = false;        // Llama: biases on gate, up, down
  int64_t max_position_embeddings = 2048;
  // The window of the layers that slide (Mistral, Qwen2 with use_sliding_window, Phi3, Gemma 2);
  // null: no layer slides. Which layers slide: sliding_layers[i] (from "layer_types" or Qwen2's
  // max_window_layers); empty: all of them.
  std::optional<int64_t> sliding_window;
  std::vector<bool> sliding_layers;
  std::string torch_dtype = "float32";  // config.json's torch_dtype (what export writes)
  double initializer_range = 0.02;      // std of random initialization (presets)

  // ---- Gemma2ForCausalLM only (model_type "gemma2"; ignored by the other architectures) ----
  // Attention scores are scaled by query_pre_attn_scalar^-0.5 (not head_dim^-0.5).
  double query_pre_attn_scalar = 256;
  // cap · tanh(x / cap) of the attention scores and of the logits; null: not capped.
  std::optional<double> attn_logit_softcapping;
  std::optional<double> final_logit_softcapping;
  // The MLP's activation: "gelu_pytorch_tanh" (GELU, tanh approximation) or "gelu" (exact).
  std::string hidden_activation = "gelu_pytorch_tanh";
  // ---- end Gemma2ForCausalLM ----

  // ---- Mixture of experts (Mixtral, Qwen2-MoE); num_experts == 0: a dense model. ----
  int64_t num_experts = 0;                      // Mixtral num_local_experts, Qwen2-MoE num_experts
  int64_t num_experts_per_tok = 0;              // top-k
  int64_t moe_intermediate_size = 0;            // each expert's (Mixtral: intermediate_size)
  int64_t shared_expert_intermediate_size = 0;  // Qwen2-MoE's shared expert; 0: none
  bool norm_topk_prob = true;  // renormalise the top-k weights (Mixtral always; Qwen2-MoE's key)
  int64_t decoder_sparse_step = 1;       // Qwen2-MoE: layer i is sparse if (i + 1) % step == 0
  std::vector<int64_t> mlp_only_layers;  // Qwen2-MoE: dense layers
  bool output_router_logits = false;     // the loss adds router_aux_loss_coef × load balancing
  double router_aux_loss_coef = 0.001;
  // Per-expert paging (not from config.json: `strata train --page-experts`): every expert, and
  // each layer's attention, shared expert and dense MLP, is an offload unit of its own, so a
  // step reads, hands off and updates only the experts its tokens were routed to.
  bool page_experts = false;
  // ---- end of mixture of experts ----
};

// Whether decoder layer `layer` of `s` has a sparse (routed experts) MLP.
bool IsSparseLayer(const LlamaShape& s, int64_t layer);
// The number of sparse layers (the layers whose router logits the auxiliary loss averages).
int64_t SparseLayerCount(const LlamaShape& s);

// Reads a config.json object. `source` names it in errors (e.g. "DIR/config.json").
// The window layer `layer` attends within (attention.h's AttentionSpec), null: full causal.
std::optional<int64_t> LayerSlidingWindow(const LlamaShape& s, int64_t layer);
// The dims of each head that rotate: head_dim · partial_rotary_factor.
int64_t RotaryDim(const LlamaShape& s);
// Phi3: fused qkv_proj and gate_up_proj.
inline bool FusedProjections(const LlamaShape& s) { return s.model_type == "phi3"; }
// Gemma2ForCausalLM (the fields of its block above apply).
inline bool IsGemma2(const LlamaShape& s) { return s.model_type == "gemma2"; }

Result<LlamaShape> ParseHfConfig(const nlohmann::json& config, const std::string& source);
// The config.json transformers would write for `shape` (for synthetic checkpoints and exports of
// presets), with torch_dtype set to `torch_dtype`.
nlohmann::json HfConfigJson(const LlamaShape& shape, const std::string& torch_dtype);

// Every preset: llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, llama-2-7b, llama-2-13b, mistral-7b,
// qwen2.5-7b, llama-3.1-70b, phi-3-mini-4k, phi-3-medium-4k, gemma-2-2b, gemma-2-9b, gemma-2-27b,
// mixtral-8x7b, qwen1.5-moe-a2.7b (shapes as their published config.json), plus "llama-tiny" and
// "mixtral-tiny" (tests) and "mixtral-mini" (Mixtral's shape scaled down, for benchmarks).
std::span<const LlamaShape> LlamaPresets();
// The preset called `name` (case-insensitive). NotFound lists the presets.
Result<LlamaShape> FindLlamaPreset(std::string_view name);

// Parameters of decoder layer `layer`, outside the layers (embedding, final norm, head), and in
// all. Without `layer`: the largest layer (all layers are alike except Qwen2-MoE's dense ones).
uint64_t LlamaLayerParams(const LlamaShape& s, int64_t layer);
uint64_t LlamaLayerParams(const LlamaShape& s);
// The elements of each parameter tensor of decoder layer `layer` (they sum to LlamaLayerParams).
std::vector<uint64_t> LlamaLayerTensorNumels(const LlamaShape& s, int64_t layer);
std::vector<uint64_t> LlamaLayerTensorNumels(const LlamaShape& s);
uint64_t LlamaResidentParams(const LlamaShape& s);

// The offload units of decoder layer `layer` as runtime/models builds them, in the engine's unit
// order (module registration order), each as its tensors' element counts: the whole layer as one
// unit; or, with s.page_experts (a mixture of experts), the attention, then each routed expert
// (num_experts of them) and the shared expert (sparse layers) or the MLP (dense layers). With
// page_experts the layer's other tensors (its norms, the router, the shared expert's gate) are
// outside units: appended to `outside` when given. The units' and outside tensors together are
// LlamaLayerTensorNumels(s, layer) (in another order).
struct LlamaUnitTensors {
  enum class Kind { kLayer, kAttention, kExpert, kSharedExpert, kMlp };
  Kind kind = Kind::kLayer;
  std::vector<uint64_t> tensors;
  uint64_t numel() const;
};
std::vector<LlamaUnitTensors> LlamaLayerUnits(const LlamaShape& s, int64_t layer,
                                              std::vector<uint64_t>* outside = nullptr);
// Uniform routing (each token's top-k a uniformly random k-subset of the E experts): the
// probability that a given expert gets at least one of `tokens` tokens, 1 - (1 - k/E)^tokens.
// 0 for a dense model (E == 0) or no tokens.
double ExpertHitProbability(const LlamaShape& s, double tokens);
uint64_t LlamaTotalParams(const LlamaShape& s);
// The largest single tensor of a layer (the engine's per-tensor staging is sized by it).
uint64_t LlamaLargestLayerTensor(const LlamaShape& s);

}  // namespace strata::runtime
