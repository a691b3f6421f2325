// hf_reference: an independent reference for Hugging Face Llama-family checkpoints (Llama,
// Mistral, Qwen2), for tests of strata's loader and model.
//
// Everything here is written from transformers' Python source (modeling_llama.py,
// modeling_mistral.py, modeling_qwen2.py, modeling_rope_utils.py and the configuration_*.py
// defaults), in plain libtorch ops, and deliberately shares no code with runtime/models/: it is
// what strata's Llama is checked against. It covers:
//   - RandomLlamaWeights: exactly the tensors transformers' *ForCausalLM has for a spec, HF names.
//   - LlamaConfigJson / WriteHfCheckpoint: config.json and safetensors files (one file or shards
//     with model.safetensors.index.json), written by hand, not with strata's writer.
//   - ReferenceLogits / ReferenceLoss: transformers' eager forward in fp32 (loss in double).
//
// Conventions followed (transformers >= 4.45):
//   head_dim        config "head_dim" if present, else hidden_size / num_attention_heads; it sizes
//                   q/k/v/o and RoPE, and the attention scale is head_dim^-0.5.
//   RoPE            inv_freq = 1 / theta^(arange(0, head_dim, 2) / head_dim) in fp32 (llama3 rule
//                   applied on top when rope_scaling is set); emb = cat(freqs, freqs);
//                   x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1).
//   GQA             repeat_kv: kv head j serves query heads j*n_rep .. j*n_rep + n_rep - 1.
//   Biases          Llama: attention_bias -> q,k,v,o biases; mlp_bias -> gate,up,down biases.
//                   Qwen2: q,k,v biases always, none on o or the MLP. Mistral: none.
//   Tied head       tie_word_embeddings: no lm_head.weight; the head is model.embed_tokens.weight.
//
// Thread-safety: pure functions (WriteHfCheckpoint writes only under its directory).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace strata::testing {

// rope_scaling {"rope_type": "llama3", ...} as in Llama 3.1 / 3.2 configs.
struct Llama3Scaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct LlamaSpec {
  // "LlamaForCausalLM", "MistralForCausalLM" or "Qwen2ForCausalLM".
  std::string architecture = "LlamaForCausalLM";
  int64_t vocab_size = 97, hidden_size = 64, intermediate_size = 160, num_hidden_layers = 2,
          num_attention_heads = 4, num_key_value_heads = 2;
  int64_t head_dim = 0;  // 0: absent from config.json (hidden / heads); else written and used
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // Llama only (q,k,v,o biases); Qwen2 always has q,k,v biases
  bool mlp_bias = false;        // Llama only
  std::optional<Llama3Scaling> rope_scaling;  // absent: "rope_scaling": null (Llama, Qwen2)
  int64_t max_position_embeddings = 2048;
  int64_t bos_token_id = 1, eos_token_id = 2;
};

// The head dimension transformers uses for `spec` (head_dim, or hidden / heads when 0).
int64_t HeadDim(const LlamaSpec& spec);

// "llama", "mistral" or "qwen2". Throws std::invalid_argument for another architecture.
std::string ModelType(const LlamaSpec& spec);

// Throws std::invalid_argument when transformers could not build `spec` (heads not a multiple
// of kv heads, odd head_dim, hidden not divisible by heads with head_dim 0, ...) or when a field
// does not exist for the architecture (attention_bias/mlp_bias outside Llama, rope_scaling on
// Mistral).
void ValidateSpec(const LlamaSpec& spec);

// HF tensor name -> fp32 tensor: exactly the parameters transformers' model has for `spec`.
// Deterministic in (spec, seed), independent of libtorch's RNG; each tensor is drawn from its
// own stream keyed by (seed, name), so adding a tensor (a bias) leaves the others unchanged.
// Scales keep activations O(1): embeddings and lm_head N(0, 1/sqrt(hidden)); q, k, v, gate, up
// N(0, 1/sqrt(fan_in)); o, down N(0, 0.5/sqrt(fan_in)); norm weights 1 + N(0, 0.1); biases
// N(0, 0.05).
std::map<std::string, torch::Tensor> RandomLlamaWeights(const LlamaSpec& spec, uint64_t seed);

// The config.json transformers would write for `spec`; torch_dtype is "float32", "bfloat16" or
// "float16". Llama: attention_bias, mlp_bias, pretraining_tp 1, rope_scaling (null or the llama3
// object). Mistral: sliding_window 4096, no rope_scaling key. Qwen2: rope_scaling,
// use_sliding_window false, sliding_window, max_window_layers. "head_dim" only when nonzero.
nlohmann::json LlamaConfigJson(const LlamaSpec& spec, const std::string& torch_dtype);

// Writes DIR/config.json (torch_dtype from `dtype`) and `weights` (any fp32 tensors; not checked
// against the spec, so tests can write broken checkpoints) as safetensors in `dtype` "F32",
// "BF16" or "F16" (converted with .to(kBFloat16) / .to(kHalf)). shards == 1: model.safetensors;
// shards == N > 1: model-00001-of-0000N.safetensors ... with model.safetensors.index.json
// {"metadata": {"total_size": bytes}, "weight_map": {name: file}}; tensors go to shards in name
// order, the counts as even as possible (1 <= shards <= number of tensors). Each file: 8-byte
// little-endian header length, the JSON header ({"__metadata__": {"format": "pt"}, name:
// {"dtype", "shape", "data_offsets"}}) padded with spaces to a multiple of 8, then the data in
// name order. Creates DIR if needed. Throws std::runtime_error on I/O failure.
void WriteHfCheckpoint(const std::string& dir, const LlamaSpec& spec,
                       const std::map<std::string, torch::Tensor>& weights,
                       const std::string& dtype, int shards);

// The same with `config` as config.json (its torch_dtype set from `dtype`).
void WriteHfCheckpointWithConfig(const std::string& dir, nlohmann::json config,
                                 const std::map<std::string, torch::Tensor>& weights,
                                 const std::string& dtype, int shards);

// The weights a loader sees after storing in `dtype` ("F32", "BF16", "F16") and upcasting back
// to fp32 (identity for F32).
std::map<std::string, torch::Tensor> RoundTripWeights(
    const std::map<std::string, torch::Tensor>& weights, const std::string& dtype);

// transformers' forward in fp32 (eager attention, causal mask, position_ids 0..T-1): logits
// [B, T, vocab] fp32 for ids [B, T] int64. Mistral: T must be <= its sliding window (4096).
torch::Tensor ReferenceLogits(const LlamaSpec& spec,
                              const std::map<std::string, torch::Tensor>& weights,
                              const torch::Tensor& ids);

// Mean next-token cross-entropy (nats) over windows [B, T+1] int64: inputs windows[:, :T],
// targets windows[:, 1:], averaged over all B*T targets; log_softmax in double from the fp32
// logits.
double ReferenceLoss(const LlamaSpec& spec, const std::map<std::string, torch::Tensor>& weights,
                     const torch::Tensor& windows);

// The RoPE pieces ReferenceLogits uses, exposed for the self-tests.
// inv_freq [head_dim / 2] fp32, with the llama3 rule when spec.rope_scaling is set.
torch::Tensor RopeInvFreq(const LlamaSpec& spec);
// cos, sin [T, head_dim] fp32 for positions [T] int64: emb = cat(freqs, freqs).
std::pair<torch::Tensor, torch::Tensor> RopeCosSin(const LlamaSpec& spec,
                                                   const torch::Tensor& positions);
// x * cos + rotate_half(x) * sin; x [..., T, head_dim], cos/sin [T, head_dim].
torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace strata::testing
