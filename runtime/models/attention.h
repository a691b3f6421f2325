// Eager attention as transformers computes it (eager_attention_forward and masking_utils.py), the
// one implementation every family's attention module calls, and the key/value cache that
// generation keeps per attention layer.
//
//   AttentionSpec spec{.scaling = 1 / sqrt(head_dim), .sliding_window = 4096};
//   auto [keys, values] = cache_.Remember(k, v);          // the cache, when generating
//   torch::Tensor out = EagerAttention(q, keys, values, spec);   // [B, T, H * D]
//
// Numerics (bit for bit what the Llama family has always computed): scores = q·kᵀ · scaling in
// the compute dtype; Gemma 2's soft-capping tanh(scores / cap) · cap when set; masked positions
// set to -inf; softmax in fp32, cast back to q's dtype; · v.
//
// Positions: q holds the last T of the S positions k and v hold (S == T without a cache), so the
// query at row i is at absolute position S - T + i. Key j is visible to it when j <= that
// position (causal) and, with a sliding window W, when j > position - W (transformers'
// sliding_window_overlay: a query sees W keys, itself included).
//
// Threads: a module's cache belongs to the thread running the model. Errors: TORCH_CHECK (the
// libtorch boundary) on inconsistent shapes.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <utility>

namespace strata::runtime {

struct AttentionSpec {
  double scaling = 1.0;                   // multiplies q·kᵀ (head_dim^-0.5, or Gemma 2's scalar)
  std::optional<int64_t> sliding_window;  // keys per query, itself included; null: all before it
  std::optional<double> logit_softcap;    // Gemma 2's attn_logit_softcapping
};

// q [B, H, T, D], k and v [B, KV, S, D] with H a multiple of KV and S >= T (grouped-query: kv head
// j serves query heads j·H/KV ... (j+1)·H/KV - 1). Returns [B, T, H·D] in q's dtype.
torch::Tensor EagerAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const AttentionSpec& spec);

// The boolean mask [T, S] of the keys a query may NOT see (true = masked), on `device`.
torch::Tensor HiddenKeys(int64_t queries, int64_t keys, std::optional<int64_t> sliding_window,
                         const torch::Device& device);

// The keys and values an attention layer has seen so far in one generation ([B, KV, S, D] each).
// Off (the default) during training and evaluation: Remember returns its inputs. On, it is for
// forwards without autograd only (Remember refuses a grad-mode forward: an offload unit's backward
// recomputes its forward, which would append the same keys twice); that is what lets a cache live
// inside an offload unit, a decoder layer's or an attention paged on its own (--page-experts).
class KvCache {
 public:
  // Starts caching (empty); the next forward is at position 0.
  void Start() {
    on_ = true;
    keys_ = torch::Tensor();
    values_ = torch::Tensor();
  }
  // Stops caching and frees what was kept.
  void Stop() {
    on_ = false;
    keys_ = torch::Tensor();
    values_ = torch::Tensor();
  }
  bool on() const { return on_; }
  // Positions held (0 when off or empty).
  int64_t length() const { return keys_.defined() ? keys_.size(2) : 0; }
  // Appends the new tokens' k, v [B, KV, T, D] when on; returns all keys and values so far.
  std::pair<torch::Tensor, torch::Tensor> Remember(const torch::Tensor& k, const torch::Tensor& v);

 private:
  bool on_ = false;
  torch::Tensor keys_, values_;
};

// What an attention module that can generate with a cache derives from (next to
// torch::nn::Module), so CausalLm::SetKvCaching finds every layer's cache by walking the modules.
class CachingAttention {
 public:
  virtual ~CachingAttention() = default;
  KvCache kv_cache;  // off except while generating
};

}  // namespace strata::runtime
