// The sparse MLPs and the router auxiliary loss (moe.h). State: RouterLoss holds the last forward
// pass's routing per sparse layer (overwritten by each forward of that layer, so a recomputation
// in backward leaves it unchanged) and the objective's gradient w.r.t. the aux value (set in
// backward by AttachAuxLoss's node, which runs before every layer's backward). One thread.
#include "runtime/models/moe.h"

#include <utility>

namespace strata::runtime {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A child module `name` of `parent` holding an uninitialized "weight" [out, in]: transformers'
// nn.Linear(bias=False) names. Returns the weight.
torch::Tensor AddLinear(torch::nn::Module& parent, const std::string& name, int64_t out,
                        int64_t in) {
  auto linear = std::make_shared<torch::nn::Module>("Linear");
  torch::Tensor w = linear->register_parameter("weight", torch::empty({out, in}));
  parent.register_module(name, linear);
  return w;
}

// Returns `out` unchanged; backward gives `probs_mean` (a sparse layer's mean router
// probabilities) the aux loss's gradient.
struct RouterGradient : public torch::autograd::Function<RouterGradient> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& out,
                               const torch::Tensor& probs_mean, RouterLoss* loss) {
    ctx->saved_data["loss"] = reinterpret_cast<int64_t>(loss);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* loss = reinterpret_cast<RouterLoss*>(ctx->saved_data["loss"].toInt());
    return {grads[0], loss->ProbabilityGradient(), torch::Tensor()};
  }
};

// Returns (hidden, aux) unchanged; backward records d(objective)/d(aux).
struct AuxLossNode : public torch::autograd::Function<AuxLossNode> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& aux, RouterLoss* loss) {
    ctx->saved_data["loss"] = reinterpret_cast<int64_t>(loss);
    return {hidden, aux.clone()};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* loss = reinterpret_cast<RouterLoss*>(ctx->saved_data["loss"].toInt());
    loss->set_objective_gradient(grads[1].defined() ? grads[1].item<double>() : 0.0);
    return {grads[0], torch::Tensor(), torch::Tensor()};
  }
};

// Returns `out` unchanged; backward, which runs before the backward of every unit that produced
// `out`, announces `units` (the experts the forward ran, in the order autograd recomputes them)
// to `unit`'s hooks, so their reads start before the first recomputation asks for one.
struct ExpectInBackward : public torch::autograd::Function<ExpectInBackward> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& out,
                               strata::OffloadUnitImpl* unit, std::vector<int64_t> units) {
    ctx->saved_data["unit"] = reinterpret_cast<int64_t>(unit);
    ctx->saved_data["units"] = std::move(units);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* unit = reinterpret_cast<strata::OffloadUnitImpl*>(ctx->saved_data["unit"].toInt());
    if (strata::UnitHooks* hooks = unit->hooks()) {
      std::vector<int> units;
      for (const int64_t u : ctx->saved_data["units"].toIntVector()) {
        units.push_back(static_cast<int>(u));
      }
      hooks->Expect(units);
    }
    return {grads[0], torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

RouterLoss::RouterLoss(int sparse_layers, int64_t num_experts, int64_t top_k)
    : layers_(sparse_layers),
      experts_(num_experts),
      top_k_(top_k),
      counts_(sparse_layers),
      prob_sums_(sparse_layers) {}

void RouterLoss::Record(int slot, const torch::Tensor& selected, const torch::Tensor& probs) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(slot >= 0 && slot < layers_, "no sparse layer ", slot);
  counts_[slot] = torch::bincount(selected.reshape({-1}), {}, experts_).to(torch::kFloat32);
  prob_sums_[slot] = probs.detach().sum(0);
  tokens_ = probs.size(0);
}

torch::Tensor RouterLoss::Fractions() const {
  torch::Tensor total = counts_[0];
  for (int l = 1; l < layers_; ++l) total = total + counts_[l];
  return total / static_cast<double>(layers_ * tokens_);
}

torch::Tensor RouterLoss::Value() const {
  torch::NoGradGuard no_grad;
  for (int l = 0; l < layers_; ++l) {
    TORCH_CHECK(counts_[l].defined(), "sparse layer ", l, " has not run in this pass");
  }
  torch::Tensor prob = prob_sums_[0];
  for (int l = 1; l < layers_; ++l) prob = prob + prob_sums_[l];
  prob = prob / static_cast<double>(layers_ * tokens_);
  return (Fractions() * prob).sum() * static_cast<double>(experts_);
}

torch::Tensor RouterLoss::ProbabilityGradient() const {
  torch::NoGradGuard no_grad;
  return Fractions() *
         (objective_gradient_ * static_cast<double>(experts_) / static_cast<double>(layers_));
}

ExpertMlpImpl::ExpertMlpImpl(int64_t hidden, int64_t intermediate, bool mixtral_names) {
  // Registered in transformers' order (Mixtral: w1, w2, w3; Qwen2-MoE: gate, up, down).
  if (mixtral_names) {
    gate_ = AddLinear(*this, "w1", intermediate, hidden);
    down_ = AddLinear(*this, "w2", hidden, intermediate);
    up_ = AddLinear(*this, "w3", intermediate, hidden);
  } else {
    gate_ = AddLinear(*this, "gate_proj", intermediate, hidden);
    up_ = AddLinear(*this, "up_proj", intermediate, hidden);
    down_ = AddLinear(*this, "down_proj", hidden, intermediate);
  }
}

torch::Tensor ExpertMlpImpl::forward(const torch::Tensor& x) {
  return torch::linear(torch::silu(torch::linear(x, gate_)) * torch::linear(x, up_), down_);
}

SparseMoeImpl::SparseMoeImpl(const LlamaShape& s, int slot, std::shared_ptr<RouterLoss> router_loss)
    : num_experts_(s.num_experts),
      top_k_(s.num_experts_per_tok),
      norm_topk_prob_(s.model_type == "mixtral" || s.norm_topk_prob),
      slot_(slot),
      router_loss_(std::move(router_loss)) {
  const bool mixtral = s.model_type == "mixtral";
  gate_ = AddLinear(*this, "gate", num_experts_, s.hidden_size);
  auto experts = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < num_experts_; ++e) {
    ExpertMlp expert(s.hidden_size, s.moe_intermediate_size, mixtral);
    if (s.page_experts) {
      paged_experts_.push_back(Offload(expert));
      paged_experts_.back()->set_conditional(true);  // run only for the tokens routed to it
      experts->push_back(paged_experts_.back());
    } else {
      experts_.push_back(expert);
      experts->push_back(expert);
    }
  }
  if (s.shared_expert_intermediate_size > 0) {
    ExpertMlp shared(s.hidden_size, s.shared_expert_intermediate_size, false);
    if (s.page_experts) {
      paged_shared_expert_ = register_module("shared_expert", Offload(shared));
    } else {
      shared_expert_ = register_module("shared_expert", shared);
    }
    shared_expert_gate_ = AddLinear(*this, "shared_expert_gate", 1, s.hidden_size);
  }
}

torch::Tensor SparseMoeImpl::RunExpert(int64_t e, const torch::Tensor& x) {
  return paged_experts_.empty() ? experts_[e]->forward(x) : paged_experts_[e]->forward(x);
}

torch::Tensor SparseMoeImpl::RunSharedExpert(const torch::Tensor& x) {
  return paged_shared_expert_ ? paged_shared_expert_->forward(x) : shared_expert_->forward(x);
}

torch::Tensor SparseMoeImpl::forward(const torch::Tensor& x) {
  const int64_t hidden = x.size(-1);
  const torch::Tensor h = x.reshape({-1, hidden});
  const torch::Tensor logits = torch::linear(h, gate_);
  const torch::Tensor probs = torch::softmax(logits, 1, torch::kFloat32);
  auto [weights, selected] = torch::topk(probs, top_k_, -1);
  if (norm_topk_prob_) weights = weights / weights.sum(-1, /*keepdim=*/true);
  weights = weights.to(x.scalar_type());

  torch::Tensor out = torch::zeros_like(h);
  // [E, k, tokens]: which (choice, token) pairs picked each expert.
  const torch::Tensor mask = torch::one_hot(selected, num_experts_).permute({2, 1, 0});
  const torch::Tensor hit = mask.sum({-1, -2}).gt(0).nonzero().reshape({-1}).cpu();
  const int64_t* experts_hit = hit.data_ptr<int64_t>();
  // Paged: the engine starts reading the experts about to run, in the order they run (moe.h).
  const bool announce = !paged_experts_.empty() && paged_experts_[0]->attached();
  std::vector<int> units;
  if (announce) {
    for (int64_t i = 0; i < hit.numel(); ++i) {
      units.push_back(paged_experts_[experts_hit[i]]->index());
    }
    paged_experts_[0]->hooks()->Expect(units);
  }
  for (int64_t i = 0; i < hit.numel(); ++i) {
    const int64_t e = experts_hit[i];
    const std::vector<torch::Tensor> where = torch::where(mask[e]);
    const torch::Tensor& choice = where[0];
    const torch::Tensor& token = where[1];
    const torch::Tensor y =
        RunExpert(e, h.index_select(0, token)) * weights.index({token, choice}).unsqueeze(-1);
    out.index_add_(0, token, y.to(x.scalar_type()));
  }
  if (shared_expert_gate_.defined()) {
    // The shared expert takes h through a view of its own, so the gradients of its two uses of
    // its input (gate_proj, up_proj) are summed before they join h's: paged (a unit of its own,
    // --page-experts) the unit hands back that sum, so both ways add h's gradient in one order.
    const torch::Tensor shared_input = h.view_as(h);
    out =
        out + torch::sigmoid(torch::linear(h, shared_expert_gate_)) * RunSharedExpert(shared_input);
  }
  out = out.reshape(x.sizes());
  if (router_loss_) {
    router_loss_->Record(slot_, selected, probs);
    if (torch::GradMode::is_enabled() && probs.requires_grad()) {
      out = RouterGradient::apply(out, probs.mean(0), router_loss_.get());
    }
  }
  if (announce && torch::GradMode::is_enabled() && out.requires_grad()) {
    // Autograd recomputes the experts in the reverse of the forward's order (each expert's
    // index_add_ node comes after the previous one's, and the later node runs first; checked in
    // tests/runtime/models/moe_test.cc). The shared expert, unconditional, is left to the
    // recorded order.
    std::vector<int64_t> backward(units.rbegin(), units.rend());
    out = ExpectInBackward::apply(out, paged_experts_[0].get(), std::move(backward));
  }
  return out;
}

std::vector<torch::Tensor> AttachAuxLoss(const torch::Tensor& hidden, const torch::Tensor& aux,
                                         RouterLoss* loss) {
  if (!torch::GradMode::is_enabled() || !hidden.requires_grad()) return {hidden, aux};
  return AuxLossNode::apply(hidden, aux, loss);
}

}  // namespace strata::runtime
