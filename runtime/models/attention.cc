// See attention.h.
#include "runtime/models/attention.h"

#include <limits>

namespace strata::runtime {

torch::Tensor HiddenKeys(int64_t queries, int64_t keys, std::optional<int64_t> sliding_window,
                         const torch::Device& device) {
  const auto long_options = torch::dtype(torch::kInt64).device(device);
  // Absolute positions: queries are the last `queries` of `keys`.
  const torch::Tensor query_pos =
      torch::arange(keys - queries, keys, long_options).unsqueeze(1);            // [T, 1]
  const torch::Tensor key_pos = torch::arange(keys, long_options).unsqueeze(0);  // [1, S]
  torch::Tensor hidden = key_pos > query_pos;
  if (sliding_window) hidden = hidden.logical_or(key_pos <= query_pos - *sliding_window);
  return hidden;
}

torch::Tensor EagerAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const AttentionSpec& spec) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention takes [B, heads, T, D]");
  const int64_t B = q.size(0), heads = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t kv_heads = k.size(1), S = k.size(2);
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0 && S >= T && v.size(2) == S,
              "attention: inconsistent q/k/v shapes");
  torch::Tensor keys = k, values = v;
  if (kv_heads != heads) {  // kv head j serves query heads j*rep .. j*rep + rep - 1
    const int64_t rep = heads / kv_heads;
    keys = k.unsqueeze(2).expand({B, kv_heads, rep, S, D}).reshape({B, heads, S, D});
    values = v.unsqueeze(2).expand({B, kv_heads, rep, S, D}).reshape({B, heads, S, D});
  }
  torch::Tensor scores = torch::matmul(q, keys.transpose(2, 3)) * spec.scaling;
  if (spec.logit_softcap) scores = torch::tanh(scores / *spec.logit_softcap) * *spec.logit_softcap;
  scores = scores.masked_fill(HiddenKeys(T, S, spec.sliding_window, q.device()),
                              -std::numeric_limits<float>::infinity());
  const torch::Tensor probs = torch::softmax(scores, -1, torch::kFloat32).to(q.scalar_type());
  return torch::matmul(probs, values).transpose(1, 2).reshape({B, T, heads * D});
}

std::pair<torch::Tensor, torch::Tensor> KvCache::Remember(const torch::Tensor& k,
                                                          const torch::Tensor& v) {
  if (!on_) return {k, v};
  // An offload unit's backward recomputes its forward, which would append these keys again: the
  // cache is for generation, whose forwards build no graph.
  TORCH_CHECK(!torch::GradMode::is_enabled(),
              "the KV cache is on in a forward that builds a graph (a training forward); turn it "
              "off (CausalLm::SetKvCaching(false)) or run under torch::NoGradGuard");
  keys_ = keys_.defined() ? torch::cat({keys_, k}, 2) : k;
  values_ = values_.defined() ? torch::cat({values_, v}, 2) : v;
  return {keys_, values_};
}

}  // namespace strata::runtime
