// The Llama family in libtorch (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
// Phi3ForCausalLM), following transformers' numerics (modeling_llama.py, modeling_phi3.py):
//   RMSNorm:  weight * (x32 * rsqrt(mean(x32²) + eps)).to(dtype of x)      (x32 = x in fp32)
//   RoPE:     rope.h (every rope_scaling type, partial rotary dims), tables shared by the layers
//   attention: grouped-query (kv head j serves query heads j·r ... j·r + r - 1), scores
//             q·kᵀ / sqrt(head_dim), causal mask (sliding window on the layers that slide,
//             LayerSlidingWindow), softmax in fp32 then cast, · v, o_proj (attention.h)
//   MLP:      down(silu(gate(x)) · up(x))
//   Phi3:     q, k, v are the row blocks of qkv_proj; gate and up the halves of gate_up_proj
//   head:     lm_head, or the embedding matrix when tie_word_embeddings; loss on fp32 logits.
//   MoE:      Mixtral's and Qwen2-MoE's sparse MLPs and router aux loss: models/moe.h.
// Parameter names are transformers' ("model.layers.3.self_attn.q_proj.weight"), so checkpoints
// load and export by name. Each decoder layer is one offload unit taking (hidden, {cos, sin}).
// Parameters are allocated uninitialized (see causal_lm.h's deferred initialization).
//
// LlamaLm (MakeLlama) runs every architecture of a LlamaShape: it builds the CausalLmModule of
// the shape's architecture (MakeCausalLmModule: LlamaForCausalLmImpl here, Gemma2ForCausalLmImpl
// in gemma2.h) and gives it checkpoint loading, deferred initialization, export and identity.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/engine/offload_unit.h"
#include "runtime/models/attention.h"
#include "runtime/models/causal_lm.h"
#include "runtime/models/moe.h"
#include "runtime/models/rope.h"
#include "runtime/plan/llama_shape.h"

namespace strata::runtime {

class HfCheckpoint;

// y = x·Wᵀ (+ b), parameters "weight" [out, in] and optionally "bias" [out], uninitialized.
class LlamaLinearImpl : public torch::nn::Module {
 public:
  LlamaLinearImpl(int64_t in, int64_t out, bool bias);
  torch::Tensor forward(const torch::Tensor& x) { return torch::linear(x, weight, bias); }
  torch::Tensor weight, bias;
};
TORCH_MODULE(LlamaLinear);

class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RmsNorm);

class LlamaAttentionImpl : public torch::nn::Module, public CachingAttention {
 public:
  // Attention of decoder layer `layer` (which decides its sliding window).
  LlamaAttentionImpl(const LlamaShape& s, int64_t layer);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  // As an offload unit of its own (per-expert paging): rope = {cos, sin}.
  torch::Tensor forward(const torch::Tensor& x, const strata::UnitInputs& rope) {
    return forward(x, rope.at(0), rope.at(1));
  }

 private:
  int64_t heads_, kv_heads_, head_dim_;
  AttentionSpec spec_;
  LlamaLinear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
  LlamaLinear qkv_proj_{nullptr};  // Phi3's fused q, k, v (then q/k/v_proj_ are null)
};
TORCH_MODULE(LlamaAttention);

class LlamaMlpImpl : public torch::nn::Module {
 public:
  explicit LlamaMlpImpl(const LlamaShape& s);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  LlamaLinear gate_proj_{nullptr}, up_proj_{nullptr}, down_proj_{nullptr};
  LlamaLinear gate_up_proj_{nullptr};  // Phi3's fused gate and up (then gate/up_proj_ are null)
};
TORCH_MODULE(LlamaMlp);

// One decoder layer: forward(hidden, {cos, sin}) as an offload unit's inner module. Layer `layer`
// of a mixture of experts has a SparseMoe MLP when IsSparseLayer says so (`router_loss`: the
// model's, null without aux loss). With s.page_experts the layer is not a unit: its attention,
// dense MLP and experts are units of their own, its norms and router are resident.
class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LlamaDecoderLayerImpl(const LlamaShape& s, int64_t layer,
                        std::shared_ptr<RouterLoss> router_loss = nullptr);
  torch::Tensor forward(const torch::Tensor& x, const strata::UnitInputs& rope);

 private:
  RmsNorm input_layernorm_{nullptr}, post_attention_layernorm_{nullptr};
  LlamaAttention self_attn_{nullptr};
  OffloadUnit paged_self_attn_{nullptr};  // page_experts: instead of self_attn_
  LlamaMlp mlp_{nullptr};
  OffloadUnit paged_mlp_{nullptr};  // page_experts: instead of mlp_ in dense layers
  SparseMoe moe_{nullptr};          // instead of mlp_ in sparse layers
};
TORCH_MODULE(LlamaDecoderLayer);

// What LlamaLm runs: one architecture's "model.*" (+ "lm_head") as transformers lays it out, its
// decoder layers being offload units (Offload(...)) taking (hidden, {cos, sin}).
class CausalLmModule : public torch::nn::Module {
 public:
  // logits [B, T, vocab] (compute dtype) of the tokens at positions offset .. offset + T - 1.
  virtual torch::Tensor forward(const torch::Tensor& ids, int64_t position_offset) = 0;
  virtual int num_layers() const = 0;
  virtual std::shared_ptr<torch::nn::Module> layer(int i) = 0;
  // What the loss adds for the last forward (CausalLm::AuxiliaryLoss); undefined: nothing.
  virtual torch::Tensor aux_loss() const { return torch::Tensor(); }
};

// The module of `s.architecture` (parameters allocated, uninitialized).
std::shared_ptr<CausalLmModule> MakeCausalLmModule(const LlamaShape& s);

// The model "model.*" + "lm_head" as transformers lays it out.
class LlamaForCausalLmImpl : public CausalLmModule {
 public:
  explicit LlamaForCausalLmImpl(const LlamaShape& s);
  torch::Tensor forward(const torch::Tensor& ids, int64_t position_offset = 0) override;
  int num_layers() const override { return static_cast<int>(layers_->size()); }
  std::shared_ptr<torch::nn::Module> layer(int i) override { return layers_[i]; }
  // router_aux_loss_coef × the router aux loss of the last forward (in its graph when that built
  // one); undefined unless the model is a mixture of experts with output_router_logits.
  torch::Tensor aux_loss() const override { return aux_loss_; }

 private:
  LlamaShape shape_;
  RotaryEmbedding rope_;
  std::shared_ptr<RouterLoss> router_loss_;  // MoE with output_router_logits
  torch::Tensor aux_loss_;
  std::shared_ptr<torch::nn::Module> model_;  // "model": embed_tokens, layers, norm
  torch::Tensor embed_weight_;
  torch::nn::ModuleList layers_{nullptr};
  RmsNorm norm_{nullptr};
  LlamaLinear lm_head_{nullptr};  // null when tied
};
TORCH_MODULE(LlamaForCausalLm);

// A Llama-family CausalLm: from a preset (seeded random values) or a checkpoint (`checkpoint`
// non-null: its tensors, already checked against the shape). Fills the resident parameters now.
Result<std::unique_ptr<CausalLm>> MakeLlama(const LlamaShape& shape, uint64_t seed,
                                            std::unique_ptr<HfCheckpoint> checkpoint,
                                            std::string hf_dir, nlohmann::json hf_config);

// The tensor names and shapes a checkpoint of `shape` must hold, in the model's order.
std::vector<std::pair<std::string, std::vector<int64_t>>> LlamaTensorShapes(const LlamaShape& s);

}  // namespace strata::runtime
