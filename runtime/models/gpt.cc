#include "runtime/models/gpt.h"

#include <cmath>

#include "runtime/models/causal_lm.h"

namespace strata::runtime {

DenseImpl::DenseImpl(int64_t in, int64_t out) {
  weight = register_parameter("weight", torch::empty({out, in}));
  bias = register_parameter("bias", torch::empty({out}));
}

void DenseImpl::Initialize(uint64_t seed, const std::string& prefix) {
  torch::NoGradGuard no_grad;
  weight.normal_(0.0, 0.02, NamedGenerator(seed, prefix + "weight"));
  bias.zero_();
}

GptBlockImpl::GptBlockImpl(const GptOptions& o, int index)
    : n_heads_(o.n_heads), seed_(o.seed), prefix_("blocks." + std::to_string(index) + ".") {
  const int64_t d = o.d_model;
  ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  qkv_ = register_module("qkv", Dense(d, 3 * d));
  proj_ = register_module("proj", Dense(d, d));
  ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  fc_ = register_module("fc", Dense(d, 4 * d));
  fc2_ = register_module("fc2", Dense(4 * d, d));
  if (!o.deferred_init) Initialize();
}

void GptBlockImpl::Initialize() {
  qkv_->Initialize(seed_, prefix_ + "qkv.");
  proj_->Initialize(seed_, prefix_ + "proj.");
  fc_->Initialize(seed_, prefix_ + "fc.");
  fc2_->Initialize(seed_, prefix_ + "fc2.");
}

torch::Tensor GptBlockImpl::forward(torch::Tensor x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  const int64_t hd = C / n_heads_;
  auto qkv = qkv_(ln1_(x)).view({B, T, 3, n_heads_, hd}).permute({2, 0, 3, 1, 4});
  auto q = qkv[0], k = qkv[1], v = qkv[2];  // [B, H, T, hd]
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  auto mask = torch::ones({T, T}, torch::dtype(torch::kBool).device(x.device())).triu(1);
  att = torch::softmax(att.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
  auto y = torch::matmul(att, v).transpose(1, 2).reshape({B, T, C});
  x = x + proj_(y);
  return x + fc2_(torch::gelu(fc_(ln2_(x))));
}

GptImpl::GptImpl(const GptOptions& o) : options_(o) {
  tok_emb_ = register_module("tok_emb", torch::nn::Embedding(o.vocab, o.d_model));
  pos_emb_ = register_module("pos_emb", torch::nn::Embedding(o.seq_len, o.d_model));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int i = 0; i < o.n_layers; ++i) {
    block_impls_.push_back(GptBlock(o, i));
    blocks_->push_back(Offload(block_impls_.back()));
  }
  ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
  head_ = register_module(
      "head", torch::nn::Linear(torch::nn::LinearOptions(o.d_model, o.vocab).bias(false)));
  torch::NoGradGuard no_grad;
  tok_emb_->weight.normal_(0.0, 0.02, NamedGenerator(o.seed, "tok_emb.weight"));
  pos_emb_->weight.normal_(0.0, 0.02, NamedGenerator(o.seed, "pos_emb.weight"));
  head_->weight.normal_(0.0, 0.02, NamedGenerator(o.seed, "head.weight"));
}

void GptImpl::InitializeBlock(int i) { block_impls_.at(i)->Initialize(); }

torch::Tensor GptImpl::forward(torch::Tensor idx) {
  const int64_t T = idx.size(1);
  TORCH_CHECK(T <= options_.seq_len, "sequence of ", T, " tokens is longer than seq_len ",
              options_.seq_len);
  auto pos = torch::arange(T, torch::dtype(torch::kLong).device(idx.device()));
  torch::Tensor x = tok_emb_(idx) + pos_emb_(pos).unsqueeze(0);
  for (const auto& block : *blocks_) x = block->as<OffloadUnitImpl>()->forward(x);
  return head_(ln_f_(x));
}

torch::Tensor GptImpl::Loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  return NextTokenLoss(forward(idx), targets);
}

}  // namespace strata::runtime
