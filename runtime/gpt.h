// A GPT-style language model over bytes (vocabulary 256), the model `strata train` trains and the
// engine's tests use. Architecture (GPT-2 layout, pre-norm, no dropout so recomputation is exact):
//   x = tok_emb[idx] + pos_emb[0..T)
//   each block (an offload unit): x = x + proj(attn(ln1(x)));  x = x + fc2(gelu(fc(ln2(x))))
//   logits = head(ln_f(x))           (head has no bias and is not tied to tok_emb)
// Parameters per block: 12·d² + 13·d. Initialization as GPT-2: weights N(0, 0.02), biases 0,
// LayerNorm 1/0, from torch's global generator (seed it for reproducible runs).
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "runtime/offload.h"

namespace strata::runtime {

struct GptOptions {
  int n_layers = 2;
  int d_model = 64;
  int n_heads = 4;
  int seq_len = 64;
  int vocab = 256;
};

class GptBlockImpl : public torch::nn::Module {
 public:
  explicit GptBlockImpl(const GptOptions& options);
  torch::Tensor forward(torch::Tensor x);

 private:
  int n_heads_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(GptBlock);

class GptImpl : public torch::nn::Module {
 public:
  explicit GptImpl(const GptOptions& options);
  // idx: [B, T] int64 byte values, T <= seq_len. Returns logits [B, T, vocab].
  torch::Tensor forward(torch::Tensor idx);
  // Mean cross-entropy of predicting targets [B, T] from idx [B, T].
  torch::Tensor Loss(const torch::Tensor& idx, const torch::Tensor& targets);
  const GptOptions& options() const { return options_; }

 private:
  GptOptions options_;
  torch::nn::Embedding tok_emb_{nullptr}, pos_emb_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(Gpt);

}  // namespace strata::runtime
