// Offload units. The forward runs inside a custom autograd Function so that autograd stores only
// the unit's input (the activation checkpoint), never the unit's internal activations or
// references to its parameters' storage (which is released after the forward). The backward
// rebuilds the graph by recomputing the forward with the parameters gathered again and
// differentiates it with torch::autograd::grad (a reentrant backward, as activation checkpointing
// does), so parameter gradients come back as values the engine can move off the device at once
// instead of accumulating in .grad.
#include "runtime/engine/offload_unit.h"

namespace strata {
namespace {

struct UnitFunction : public torch::autograd::Function<UnitFunction> {
  // `anchor` is a 0-element leaf that requires grad: it makes the output require grad even when
  // `x` does not (the unit's parameters still need gradients).
  // `extra`: the unit's constant inputs, kept for the recomputation (no gradient flows to them).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               torch::Tensor anchor, OffloadUnitImpl* unit,
                               const UnitInputs* extra) {
    ctx->saved_data["unit"] = reinterpret_cast<int64_t>(unit);
    c10::List<torch::Tensor> kept;
    for (const torch::Tensor& t : *extra) kept.push_back(t.detach());
    ctx->saved_data["extra"] = kept;
    ctx->save_for_backward({x});
    UnitHooks* hooks = unit->hooks();
    hooks->Gather(unit->index(), /*tracked=*/true);
    torch::Tensor y = unit->RunInner(x, *extra);
    hooks->Release(unit->index());
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto* unit = reinterpret_cast<OffloadUnitImpl*>(ctx->saved_data["unit"].toInt());
    UnitHooks* hooks = unit->hooks();
    TORCH_CHECK(hooks != nullptr, "offload unit ", unit->index(), " was detached before backward");
    const torch::Tensor x = ctx->get_saved_variables()[0];
    UnitInputs extra;
    for (const torch::Tensor& t : ctx->saved_data["extra"].toTensorList()) extra.push_back(t);
    const int index = unit->index();
    hooks->Gather(index, /*tracked=*/true);
    torch::Tensor grad_x;
    std::vector<torch::Tensor> param_grads;
    {
      torch::AutoGradMode enable(true);
      torch::Tensor xd = x.detach();
      const bool want_x = x.requires_grad();
      if (want_x) xd.requires_grad_(true);
      torch::Tensor y = unit->RunInner(xd, extra);
      std::vector<torch::Tensor> inputs = hooks->GradParameters(index);
      if (want_x) inputs.push_back(xd);
      std::vector<torch::Tensor> grads;
      if (!inputs.empty() && y.requires_grad()) {
        grads = torch::autograd::grad({y}, inputs, {grad_outputs[0]}, /*retain_graph=*/false,
                                      /*create_graph=*/false, /*allow_unused=*/true);
      } else {
        grads.resize(inputs.size());
      }
      if (want_x) {
        grad_x = grads.back();
        grads.pop_back();
      }
      param_grads = std::move(grads);
    }
    hooks->GradientsReady(index, std::move(param_grads));
    hooks->Release(index);
    return {grad_x, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

void TorchBoundary::Throw(Status s) {
  error_ = s;
  TORCH_CHECK(false, s.ToString());
}

Status TorchBoundary::Take(const std::exception& e) {
  if (!error_.ok()) {
    Status s = std::move(error_);
    error_ = Status::Ok();
    return s;
  }
  return InternalError(std::string("libtorch: ") + e.what());
}

OffloadUnitImpl::OffloadUnitImpl(std::shared_ptr<torch::nn::Module> inner, RunFn run)
    : inner_(std::move(inner)), run_(std::move(run)) {
  const std::shared_ptr<torch::nn::Module>& m = inner_;
  for (const auto& item : m->named_children()) register_module(item.key(), item.value());
  for (const auto& item : m->named_parameters(/*recurse=*/false))
    register_parameter(item.key(), item.value(), item.value().requires_grad());
  for (const auto& item : m->named_buffers(/*recurse=*/false))
    register_buffer(item.key(), item.value());
}

void OffloadUnitImpl::train(bool on) {
  torch::nn::Module::train(on);
  inner_->train(on);
}

void OffloadUnitImpl::Attach(UnitHooks* hooks, int index) {
  hooks_ = hooks;
  index_ = index;
}

torch::Tensor OffloadUnitImpl::forward(torch::Tensor x, const UnitInputs& extra) {
  if (hooks_ == nullptr) return run_(x, extra);
  const bool needs_graph = torch::GradMode::is_enabled() &&
                           (x.requires_grad() || !hooks_->GradParameters(index_).empty());
  if (!needs_graph) {
    hooks_->Gather(index_, /*tracked=*/false);
    torch::Tensor y = run_(x, extra);
    hooks_->Release(index_);
    return y;
  }
  static const torch::Tensor anchor = torch::empty({0}).requires_grad_(true);
  return UnitFunction::apply(x, anchor, this, &extra);
}

}  // namespace strata
