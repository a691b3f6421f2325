// The per-family halves of hf_config_reference.h, dispatched by hf_config_reference.cc on
// config["architectures"][0]. Each family's .cc implements its three functions with the
// semantics hf_config_reference.h states; ConfigReferenceGreedy and WriteHfDirectory are shared.
//   hf_reference_dense.cc:  LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (sliding
//                           window, every rope_scaling type), Phi3ForCausalLM
//   hf_reference_gemma2.cc: Gemma2ForCausalLM
//   hf_reference_moe.cc:    MixtralForCausalLM, Qwen2MoeForCausalLM
#pragma once

#include "tests/testing/hf_config_reference.h"

namespace strata::testing::families {

// Shared pieces (defined in hf_reference.cc, the Llama reference):
// A tensor of `shape`, mean + std * N(0, 1) from the stream for (seed, name), independent of
// libtorch's RNG.
torch::Tensor NormalDraw(uint64_t seed, const std::string& name, std::vector<int64_t> shape,
                         double mean, double std);
// weights[name]; std::invalid_argument naming it when absent.
const torch::Tensor& Get(const HfWeights& w, const std::string& name);
// weights[name], or an undefined tensor when absent.
torch::Tensor GetOr(const HfWeights& w, const std::string& name);
// LlamaRMSNorm.forward: weight * (x32 * rsqrt(mean(x32^2, -1) + eps)), fp32.
torch::Tensor LlamaRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
// nn.Linear: x @ W^T (+ b when defined).
torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b);
// repeat_kv: [B, kv, T, D] -> [B, kv * n_rep, T, D].
torch::Tensor RepeatKv(const torch::Tensor& x, int64_t n_rep);

// Logits [B, T, vocab] fp32; `router_logits`, when non-null, receives each MoE layer's router
// logits [B*T, num_experts] (left empty by dense families).
using LogitsFn = torch::Tensor (*)(const nlohmann::json& config, const HfWeights& weights,
                                   const torch::Tensor& ids,
                                   std::vector<torch::Tensor>* router_logits);
using WeightsFn = HfWeights (*)(const nlohmann::json& config, uint64_t seed);

HfWeights DenseWeights(const nlohmann::json& config, uint64_t seed);
torch::Tensor DenseLogits(const nlohmann::json& config, const HfWeights& weights,
                          const torch::Tensor& ids, std::vector<torch::Tensor>* router_logits);

HfWeights Gemma2Weights(const nlohmann::json& config, uint64_t seed);
torch::Tensor Gemma2Logits(const nlohmann::json& config, const HfWeights& weights,
                           const torch::Tensor& ids, std::vector<torch::Tensor>* router_logits);

HfWeights MoeWeights(const nlohmann::json& config, uint64_t seed);
torch::Tensor MoeLogits(const nlohmann::json& config, const HfWeights& weights,
                        const torch::Tensor& ids, std::vector<torch::Tensor>* router_logits);
// load_balancing_loss_func(router_logits, num_experts, top_k, attention_mask=None).
double MoeLoadBalancingLoss(const nlohmann::json& config,
                            const std::vector<torch::Tensor>& router_logits);

}  // namespace strata::testing::families
