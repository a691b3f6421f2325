// Gemma2ForCausalLM's modules (gemma2.h).
#include "runtime/models/gemma2.h"

#include <cmath>

namespace strata::runtime {

Gemma2RmsNormImpl::Gemma2RmsNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::empty({dim}));
}

torch::Tensor Gemma2RmsNormImpl::forward(const torch::Tensor& x) {
  torch::Tensor h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  // Unlike Llama (cast, then scale), the scale applies in fp32 before the cast.
  return (h * (weight.to(torch::kFloat32) + 1.0)).to(x.scalar_type());
}

Gemma2AttentionImpl::Gemma2AttentionImpl(const LlamaShape& s, int64_t layer)
    : heads_(s.num_attention_heads), kv_heads_(s.num_key_value_heads), head_dim_(s.head_dim) {
  const bool bias = s.attention_bias;
  q_proj_ = register_module("q_proj", LlamaLinear(s.hidden_size, heads_ * head_dim_, bias));
  k_proj_ = register_module("k_proj", LlamaLinear(s.hidden_size, kv_heads_ * head_dim_, bias));
  v_proj_ = register_module("v_proj", LlamaLinear(s.hidden_size, kv_heads_ * head_dim_, bias));
  o_proj_ = register_module("o_proj", LlamaLinear(heads_ * head_dim_, s.hidden_size, bias));
  spec_.scaling = std::pow(s.query_pre_attn_scalar, -0.5);
  spec_.logit_softcap = s.attn_logit_softcapping;
  spec_.sliding_window = LayerSlidingWindow(s, layer);
}

torch::Tensor Gemma2AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                           const torch::Tensor& sin) {
  const int64_t B = x.size(0), T = x.size(1);
  torch::Tensor q = q_proj_(x).view({B, T, heads_, head_dim_}).transpose(1, 2);
  torch::Tensor k = k_proj_(x).view({B, T, kv_heads_, head_dim_}).transpose(1, 2);
  torch::Tensor v = v_proj_(x).view({B, T, kv_heads_, head_dim_}).transpose(1, 2);
  const torch::Tensor c = cos.unsqueeze(0).unsqueeze(0), s = sin.unsqueeze(0).unsqueeze(0);
  q = ApplyRotary(q, c, s);
  k = ApplyRotary(k, c, s);
  const auto [keys, values] = kv_cache.Remember(k, v);
  return o_proj_(EagerAttention(q, keys, values, spec_));
}

Gemma2MlpImpl::Gemma2MlpImpl(const LlamaShape& s)
    : tanh_approximation_(s.hidden_activation == "gelu_pytorch_tanh") {
  gate_proj_ = register_module("gate_proj", LlamaLinear(s.hidden_size, s.intermediate_size, false));
  up_proj_ = register_module("up_proj", LlamaLinear(s.hidden_size, s.intermediate_size, false));
  down_proj_ = register_module("down_proj", LlamaLinear(s.intermediate_size, s.hidden_size, false));
}

torch::Tensor Gemma2MlpImpl::forward(const torch::Tensor& x) {
  const torch::Tensor gate = torch::gelu(gate_proj_(x), tanh_approximation_ ? "tanh" : "none");
  return down_proj_(gate * up_proj_(x));
}

Gemma2DecoderLayerImpl::Gemma2DecoderLayerImpl(const LlamaShape& s, int64_t layer) {
  self_attn_ = register_module("self_attn", Gemma2Attention(s, layer));
  mlp_ = register_module("mlp", Gemma2Mlp(s));
  auto norm = [&](const char* name) {
    return register_module(name, Gemma2RmsNorm(s.hidden_size, s.rms_norm_eps));
  };
  input_layernorm_ = norm("input_layernorm");
  post_attention_layernorm_ = norm("post_attention_layernorm");
  pre_feedforward_layernorm_ = norm("pre_feedforward_layernorm");
  post_feedforward_layernorm_ = norm("post_feedforward_layernorm");
}

torch::Tensor Gemma2DecoderLayerImpl::forward(const torch::Tensor& x,
                                              const strata::UnitInputs& rope) {
  TORCH_CHECK(rope.size() == 2, "a Gemma 2 decoder layer takes (hidden, {cos, sin})");
  const torch::Tensor h =
      x + post_attention_layernorm_(self_attn_(input_layernorm_(x), rope[0], rope[1]));
  return h + post_feedforward_layernorm_(mlp_(pre_feedforward_layernorm_(h)));
}

Gemma2ForCausalLmImpl::Gemma2ForCausalLmImpl(const LlamaShape& s) : shape_(s), rope_(s) {
  auto model = register_module("model", std::make_shared<torch::nn::Module>("Gemma2Model"));
  auto embed = std::make_shared<torch::nn::Module>("Embedding");
  embed_weight_ = embed->register_parameter("weight", torch::empty({s.vocab_size, s.hidden_size}));
  model->register_module("embed_tokens", embed);
  layers_ = model->register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < s.num_hidden_layers; ++i)
    layers_->push_back(Offload(Gemma2DecoderLayer(s, i)));
  norm_ = model->register_module("norm", Gemma2RmsNorm(s.hidden_size, s.rms_norm_eps));
  if (!s.tie_word_embeddings) {
    lm_head_ = register_module("lm_head", LlamaLinear(s.hidden_size, s.vocab_size, false));
  }
}

torch::Tensor Gemma2ForCausalLmImpl::forward(const torch::Tensor& ids, int64_t position_offset) {
  // padding_idx: the pad row gets no gradient from the lookup, as nn.Embedding(padding_idx=...).
  torch::Tensor x = torch::embedding(embed_weight_, ids, shape_.pad_token_id.value_or(-1));
  // transformers rounds sqrt(hidden_size) to the compute dtype (55.4256 is 55.5 in bf16) first.
  x = x * torch::scalar_tensor(std::sqrt(static_cast<double>(shape_.hidden_size)), x.options());
  const RopeTables tables =
      rope_.Tables(position_offset, ids.size(1), x.scalar_type(), ids.device());
  const strata::UnitInputs rope = {tables.cos, tables.sin};
  for (const auto& layer : *layers_) x = layer->as<OffloadUnitImpl>()->forward(x, rope);
  x = norm_(x);
  torch::Tensor logits = lm_head_ ? lm_head_(x) : torch::linear(x, embed_weight_);
  if (shape_.final_logit_softcapping) {
    const double cap = *shape_.final_logit_softcapping;
    logits = torch::tanh(logits / cap) * cap;
  }
  return logits;
}

}  // namespace strata::runtime
