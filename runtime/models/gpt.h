// runtime/models/ holds the models strata trains, built from offload units
// (runtime/engine/offload_unit.h) so the engine can page their parameters.
//
// A GPT-style language model over bytes (vocabulary 256), the model `strata train` trains and the
// engine's tests use. Architecture (GPT-2 layout, pre-norm, no dropout so recomputation is exact):
//   x = tok_emb[idx] + pos_emb[0..T)
//   each block (an offload unit): x = x + proj(attn(ln1(x)));  x = x + fc2(gelu(fc(ln2(x))))
//   logits = head(ln_f(x))           (head has no bias and is not tied to tok_emb)
// Parameters per block: 12·d² + 13·d. Initialization as GPT-2: weights N(0, 0.02), biases 0,
// LayerNorm 1/0; each weight from a generator seeded by (GptOptions::seed, its name), so the
// values do not depend on when a block is initialized (eagerly, or deferred in any order).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "runtime/engine/offload_unit.h"

namespace strata::runtime {

struct GptOptions {
  int n_layers = 2;
  int d_model = 64;
  int n_heads = 4;
  int seq_len = 64;
  int vocab = 256;
  uint64_t seed = 1234;
  // Allocate the blocks' weight matrices without writing them (their pages are not resident
  // until touched) and initialize block i only when InitializeBlock(i) runs: the engine does it
  // just before it copies the block out (EngineOptions::initialize_unit), so host memory never
  // holds the whole model. The values are those of eager initialization.
  bool deferred_init = false;
};

// y = x·Wᵀ + b with parameters "weight" [out, in] and "bias" [out] (as torch::nn::Linear), but not
// initialized at construction (GPT-2 init is applied by the owner).
class DenseImpl : public torch::nn::Module {
 public:
  DenseImpl(int64_t in, int64_t out);
  torch::Tensor forward(const torch::Tensor& x) { return torch::linear(x, weight, bias); }
  // weight N(0, 0.02) from NamedGenerator(seed, prefix + "weight"), bias 0.
  void Initialize(uint64_t seed, const std::string& prefix);
  torch::Tensor weight, bias;
};
TORCH_MODULE(Dense);

class GptBlockImpl : public torch::nn::Module {
 public:
  GptBlockImpl(const GptOptions& options, int index);
  torch::Tensor forward(torch::Tensor x);
  void Initialize();

 private:
  int n_heads_;
  uint64_t seed_;
  std::string prefix_;  // "blocks.<index>."
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  Dense qkv_{nullptr}, proj_{nullptr}, fc_{nullptr}, fc2_{nullptr};
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
  // Initializes block i (for deferred_init; idempotent use is the caller's business).
  void InitializeBlock(int i);

 private:
  GptOptions options_;
  std::vector<GptBlock> block_impls_;
  torch::nn::Embedding tok_emb_{nullptr}, pos_emb_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(Gpt);

}  // namespace strata::runtime
