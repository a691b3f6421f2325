// Gemma2ForCausalLM in libtorch, following transformers' numerics (modeling_gemma2.py); run by
// LlamaLm (llama.h) like every architecture of a LlamaShape. Where it differs from Llama:
//   embedding: scaled by sqrt(hidden_size) rounded to the compute dtype (a tensor in that dtype,
//             as transformers' normalizer), the product in the compute dtype
//   RMSNorm:  (x32 * rsqrt(mean(x32²) + eps) * (1 + weight32)).to(dtype of x): the product in fp32,
//             so a weight of 0 (the initialization) is the identity scale
//   layer:    h = x + post_attention_layernorm(attn(input_layernorm(x)));
//             out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))
//   attention: scores · query_pre_attn_scalar^-0.5, soft-capped cap · tanh(s / cap)
//             (attn_logit_softcapping), within sliding_window on the layers that slide
//             (LayerSlidingWindow; models/attention.h EagerAttention); rotary embeddings (rope.h)
//             and grouped-query as Llama
//   MLP:      down(gelu(gate(x)) · up(x)), GELU with the tanh approximation for
//             hidden_activation "gelu_pytorch_tanh" (exact for "gelu")
//   logits:   the (tied) head's output soft-capped by final_logit_softcapping in the compute dtype;
//             the loss takes them widened to fp32, as transformers' loss does.
// Parameter names are transformers' ("model.layers.0.pre_feedforward_layernorm.weight").
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>

#include "runtime/engine/offload_unit.h"
#include "runtime/models/attention.h"
#include "runtime/models/llama.h"
#include "runtime/models/rope.h"
#include "runtime/plan/llama_shape.h"

namespace strata::runtime {

// Gemma's RMSNorm, weight [dim] used as 1 + weight.
class Gemma2RmsNormImpl : public torch::nn::Module {
 public:
  Gemma2RmsNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(Gemma2RmsNorm);

// Self-attention of decoder layer `layer` (sliding or global as the shape says).
class Gemma2AttentionImpl : public torch::nn::Module, public CachingAttention {
 public:
  Gemma2AttentionImpl(const LlamaShape& s, int64_t layer);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

 private:
  int64_t heads_, kv_heads_, head_dim_;
  AttentionSpec spec_;
  LlamaLinear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
};
TORCH_MODULE(Gemma2Attention);

class Gemma2MlpImpl : public torch::nn::Module {
 public:
  explicit Gemma2MlpImpl(const LlamaShape& s);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  bool tanh_approximation_;
  LlamaLinear gate_proj_{nullptr}, up_proj_{nullptr}, down_proj_{nullptr};
};
TORCH_MODULE(Gemma2Mlp);

// One decoder layer: forward(hidden, {cos, sin}) as an offload unit's inner module.
class Gemma2DecoderLayerImpl : public torch::nn::Module {
 public:
  Gemma2DecoderLayerImpl(const LlamaShape& s, int64_t layer);
  torch::Tensor forward(const torch::Tensor& x, const strata::UnitInputs& rope);

 private:
  Gemma2RmsNorm input_layernorm_{nullptr}, post_attention_layernorm_{nullptr},
      pre_feedforward_layernorm_{nullptr}, post_feedforward_layernorm_{nullptr};
  Gemma2Attention self_attn_{nullptr};
  Gemma2Mlp mlp_{nullptr};
};
TORCH_MODULE(Gemma2DecoderLayer);

// "model.*" (+ "lm_head" when untied) as transformers lays out Gemma2ForCausalLM.
class Gemma2ForCausalLmImpl : public CausalLmModule {
 public:
  // REQUIRES: IsGemma2(s).
  explicit Gemma2ForCausalLmImpl(const LlamaShape& s);
  torch::Tensor forward(const torch::Tensor& ids, int64_t position_offset = 0) override;
  int num_layers() const override { return static_cast<int>(layers_->size()); }
  std::shared_ptr<torch::nn::Module> layer(int i) override { return layers_[i]; }

 private:
  LlamaShape shape_;
  RotaryEmbedding rope_;
  torch::Tensor embed_weight_;
  torch::nn::ModuleList layers_{nullptr};
  Gemma2RmsNorm norm_{nullptr};
  LlamaLinear lm_head_{nullptr};  // null when tied
};

}  // namespace strata::runtime
