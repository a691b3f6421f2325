// Mixtures of experts in libtorch: the sparse MLP of Mixtral and Qwen2-MoE and the router
// auxiliary (load-balancing) loss, following transformers (modeling_mixtral.py,
// modeling_qwen2_moe.py):
//   router:   logits = gate(x) [tokens, E]; p = softmax(logits) in fp32; the top-k of p per token
//             (topk's order), renormalised to sum 1 (Mixtral; Qwen2-MoE when norm_topk_prob),
//             cast to the compute dtype
//   experts:  for each expert with tokens, in expert order: y[token] += expert(x[token]) · weight
//             (index_add over the tokens that chose it); an expert no token chose is not run, so
//             its parameters get no gradient (the optimizer then leaves them alone, as
//             torch.optim does for a parameter without .grad)
//   shared:   Qwen2-MoE adds sigmoid(shared_expert_gate(x)) · shared_expert(x)
//   aux loss: with output_router_logits the causal-LM loss adds router_aux_loss_coef ·
//             load_balancing_loss_func = coef · E · Σ_e f_e · P_e, where f_e is the fraction of
//             top-k choices (over every sparse layer's tokens) that picked expert e and P_e the
//             mean router probability of e over the same rows.
//
// The aux loss across offload units. A decoder layer is an offload unit: it returns one tensor and
// its backward recomputes it, so the aux loss cannot be a graph the loss reaches. Instead (as
// Megatron's MoEAuxLossAutoScaler): each sparse layer records its routing (counts and probability
// sums) in the model's RouterLoss during the forward; the model computes the aux value after the
// last layer and passes it through AttachAuxLoss, whose backward captures d(objective)/d(aux) (the
// loss's scale: 1/accumulation steps, fp16's loss scale) before any layer's backward runs; each
// layer's output passes through a function whose backward feeds its mean router probabilities
// P^l the gradient d(objective)/d(aux) · E/L · f (f global, known since the forward). That is the
// exact gradient of coef · E · Σ_e f_e · (1/L) Σ_l P^l_e, f carrying none (a count), as in
// transformers.
//
// Threads: the thread running the model. Errors: TORCH_CHECK (the libtorch boundary).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/engine/offload_unit.h"
#include "runtime/plan/llama_shape.h"

namespace strata::runtime {

// The routing of one forward pass over every sparse layer of a model, for the aux loss.
class RouterLoss {
 public:
  RouterLoss(int sparse_layers, int64_t num_experts, int64_t top_k);

  // Sparse layer `slot`'s routing: `selected` [tokens, k] expert ids, `probs` [tokens, E] fp32.
  // A recomputation records the same values again (idempotent).
  void Record(int slot, const torch::Tensor& selected, const torch::Tensor& probs);
  // load_balancing_loss_func of the last records (unscaled by the coefficient): fp32 scalar.
  torch::Tensor Value() const;
  // The gradient of the objective w.r.t. sparse layer l's mean router probabilities [E] fp32.
  torch::Tensor ProbabilityGradient() const;
  // d(objective)/d(aux value), set by the backward of AttachAuxLoss.
  void set_objective_gradient(double g) { objective_gradient_ = g; }

  int sparse_layers() const { return layers_; }

 private:
  torch::Tensor Fractions() const;  // f [E]

  int layers_;
  int64_t experts_;
  int64_t top_k_;
  std::vector<torch::Tensor> counts_;     // per layer [E] fp32: top-k choices of each expert
  std::vector<torch::Tensor> prob_sums_;  // per layer [E] fp32: Σ over tokens of p
  int64_t tokens_ = 0;                    // per layer
  double objective_gradient_ = 0;
};

// One SwiGLU expert: down(silu(gate(x)) · up(x)), named w1/w3/w2 (Mixtral) or gate_proj/up_proj/
// down_proj (Qwen2-MoE).
class ExpertMlpImpl : public torch::nn::Module {
 public:
  ExpertMlpImpl(int64_t hidden, int64_t intermediate, bool mixtral_names);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::Tensor gate_, up_, down_;  // [i, h], [i, h], [h, i]
};
TORCH_MODULE(ExpertMlp);

// The sparse MLP of a Mixtral ("block_sparse_moe") or Qwen2-MoE ("mlp") decoder layer. With
// s.page_experts each expert and the shared expert are offload units of their own (the router and
// the shared expert's gate stay outside units): an expert no token chose is never gathered, never
// read from NVMe by the gathers and never updated. The experts' units are conditional
// (OffloadUnitImpl::set_conditional: the engine keeps them out of its recorded gather order); the
// shared expert runs for every token and is not. Right after the router's top-k the layer
// announces the experts it is about to run, in order (UnitHooks::Expect), and its output passes
// through a node whose backward announces the same experts in the order autograd recomputes them
// (the reverse), before the first of them: the engine fetches exactly those, each read overlapping
// the previous expert's compute. Neither changes any value computed.
class SparseMoeImpl : public torch::nn::Module {
 public:
  // `slot`: this layer's index among the sparse layers; `router_loss` null without aux loss.
  SparseMoeImpl(const LlamaShape& s, int slot, std::shared_ptr<RouterLoss> router_loss);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t num_experts_, top_k_;
  bool norm_topk_prob_;
  int slot_;
  std::shared_ptr<RouterLoss> router_loss_;
  // Expert e's (or the shared expert's) output for the rows `x`, through its unit when paged.
  torch::Tensor RunExpert(int64_t e, const torch::Tensor& x);
  torch::Tensor RunSharedExpert(const torch::Tensor& x);

  torch::Tensor gate_;                      // [E, h]
  std::vector<ExpertMlp> experts_;          // unpaged
  std::vector<OffloadUnit> paged_experts_;  // page_experts
  ExpertMlp shared_expert_{nullptr};
  OffloadUnit paged_shared_expert_{nullptr};
  torch::Tensor shared_expert_gate_;  // [1, h]
};
TORCH_MODULE(SparseMoe);

// Passes the final hidden state `hidden` and the aux value through; in backward, records the
// objective's gradient w.r.t. the aux value in `loss` (see the file comment). Returns {hidden,
// aux}: the loss must use both outputs. Without a graph (no grad mode, or hidden needs none)
// returns the inputs.
std::vector<torch::Tensor> AttachAuxLoss(const torch::Tensor& hidden, const torch::Tensor& aux,
                                         RouterLoss* loss);

}  // namespace strata::runtime
