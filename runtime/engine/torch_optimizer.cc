#include "runtime/engine/torch_optimizer.h"

#include <cmath>
#include <sstream>
#include <vector>

#include "runtime/numerics/clipping.h"

namespace strata::runtime {

Status TorchOptimizer::Make(double lr) {
  if (optim_) return Status::Ok();
  const auto& o = opt_.optimizer_options;
  using cpu_optimizer::OptimizerType;
  const std::vector<torch::Tensor>& all = Stepped();
  switch (o.type) {
    case OptimizerType::kAdam:
      optim_ = std::make_unique<torch::optim::Adam>(all, torch::optim::AdamOptions(lr)
                                                             .betas({o.beta1, o.beta2})
                                                             .eps(o.eps)
                                                             .weight_decay(o.weight_decay));
      break;
    case OptimizerType::kAdamW:
      optim_ = std::make_unique<torch::optim::AdamW>(all, torch::optim::AdamWOptions(lr)
                                                              .betas({o.beta1, o.beta2})
                                                              .eps(o.eps)
                                                              .weight_decay(o.weight_decay));
      break;
    case OptimizerType::kAdagrad:
      optim_ = std::make_unique<torch::optim::Adagrad>(
          all, torch::optim::AdagradOptions(lr)
                   .lr_decay(o.lr_decay)
                   .weight_decay(o.weight_decay)
                   .initial_accumulator_value(o.initial_accumulator_value)
                   .eps(o.eps));
      break;
    case OptimizerType::kLion:
      return InvalidArgumentError("Lion needs offload_optimizer cpu or nvme");
  }
  return Status::Ok();
}

TorchOptimizer::TorchOptimizer(torch::nn::Module& model, const EngineOptions& options)
    : model_(model), opt_(options) {
  for (const auto& item : model_.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    names_.push_back(item.key());
    params_.push_back(item.value());
  }
}

Status TorchOptimizer::Init() {
  if (!opt_.device_masters || opt_.precision != DType::kBFloat16) return Status::Ok();
  torch::NoGradGuard no_grad;
  try {
    for (torch::Tensor& p : params_) {
      masters_.push_back(p.detach().to(torch::kFloat32).clone());
      p.set_data(p.detach().to(torch::kBFloat16));
    }
  } catch (const std::exception& e) {
    return ResourceExhaustedError(std::string("keeping fp32 master weights on the device: ") +
                                  e.what());
  }
  return Status::Ok();
}

void TorchOptimizer::AccumulateGradients() {
  if (masters_.empty()) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& g = params_[i].mutable_grad();
    if (!g.defined()) continue;
    torch::Tensor& acc = masters_[i].mutable_grad();
    if (acc.defined()) {
      acc.add_(g.to(torch::kFloat32));
    } else {
      acc = g.to(torch::kFloat32);
    }
    g = torch::Tensor();
  }
}

void TorchOptimizer::DiscardGradients() {
  for (torch::Tensor& p : params_) p.mutable_grad() = torch::Tensor();
  for (torch::Tensor& m : masters_) m.mutable_grad() = torch::Tensor();
}

int64_t TorchOptimizer::IndexOf(const torch::Tensor& param) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].is_same(param)) return static_cast<int64_t>(i);
  }
  return -1;
}

torch::Tensor TorchOptimizer::Fp32Value(const torch::Tensor& param) const {
  const int64_t i = masters_.empty() ? -1 : IndexOf(param);
  return i < 0 ? param : masters_[static_cast<size_t>(i)];
}

void TorchOptimizer::Assign(const torch::Tensor& param, const torch::Tensor& value) {
  torch::NoGradGuard no_grad;
  const int64_t i = masters_.empty() ? -1 : IndexOf(param);
  if (i >= 0) masters_[static_cast<size_t>(i)].copy_(value);
  torch::Tensor(param).copy_(value);
}

Status TorchOptimizer::Step(double lr, double* grad_norm, std::string* non_finite) {
  torch::NoGradGuard no_grad;
  if (opt_.communicator->world_size() > 1) {
    // Data parallel without partitioning (DDP): every rank's gradients are summed into every
    // rank's and divided by the world size, in one flat all-reduce over all trainable parameters
    // in the model's order (a missing gradient counts as zeros), so every rank applies the same
    // update to the same replica. The flat buffer ends with one flag per parameter (1 where this
    // rank has its gradient): a parameter no rank has a gradient for stays without one, as on one
    // rank (the optimizer leaves it alone).
    std::vector<torch::Tensor> all = Stepped();
    int64_t total_numel = 0;
    for (const auto& p : all) total_numel += p.numel();
    const int64_t flags = static_cast<int64_t>(all.size());
    torch::Tensor flat = torch::zeros({total_numel + flags}, torch::kFloat32);
    float* has = flat.data_ptr<float>() + total_numel;
    int64_t at = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      const torch::Tensor& p = all[i];
      if (p.grad().defined()) {
        flat.narrow(0, at, p.numel()).copy_(p.grad().reshape({-1}));
        has[i] = 1;
      }
      at += p.numel();
    }
    STRATA_RETURN_IF_ERROR(opt_.communicator->AllReduceSumFloat(
        flat.data_ptr<float>(), static_cast<size_t>(total_numel + flags)));
    flat.narrow(0, 0, total_numel).mul_(1.0 / opt_.communicator->world_size());
    at = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      torch::Tensor& p = all[i];
      torch::Tensor g = flat.narrow(0, at, p.numel()).view(p.sizes());
      at += p.numel();
      if (has[i] == 0) continue;
      if (p.grad().defined()) {
        p.mutable_grad().copy_(g);
      } else {
        p.mutable_grad() = g.clone();
      }
    }
  }
  std::vector<torch::Tensor> params;
  for (const auto& p : Stepped()) {
    if (p.grad().defined()) params.push_back(p);
  }
  double total = 0;
  for (const auto& p : params) total += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  *grad_norm = std::sqrt(total);
  if (!std::isfinite(total)) {
    // Name the first parameter with a non-finite gradient; nothing is applied.
    std::string where = "another rank";
    for (size_t i = 0; i < Stepped().size(); ++i) {
      const torch::Tensor g = Stepped()[i].grad();
      if (g.defined() && !torch::isfinite(g).all().item<bool>()) {
        where = names_[i];
        break;
      }
    }
    for (auto p : Stepped()) p.mutable_grad() = torch::Tensor();
    if (non_finite == nullptr) return FailedPreconditionError("non-finite gradient in " + where);
    *non_finite = where;
    return Status::Ok();
  }
  const double multiplier = ClipMultiplier(*grad_norm, opt_.gradient_clipping);
  if (multiplier != 1.0) {
    for (auto& p : params) p.mutable_grad().mul_(multiplier);
  }
  STRATA_RETURN_IF_ERROR(Make(lr));
  for (auto& group : optim_->param_groups()) group.options().set_lr(lr);
  try {
    optim_->step();
  } catch (const std::exception& e) {
    return InternalError(std::string("torch optimizer step failed: ") + e.what());
  }
  for (auto p : Stepped()) p.mutable_grad() = torch::Tensor();
  // The updated masters, rounded into the bf16 parameters the model computes with.
  for (size_t i = 0; i < masters_.size(); ++i) params_[i].copy_(masters_[i]);
  return Status::Ok();
}

Result<std::string> TorchOptimizer::Save() const {
  if (!optim_) return std::string();
  std::ostringstream os;
  try {
    torch::serialize::OutputArchive archive;
    optim_->save(archive);
    archive.save_to(os);
  } catch (const std::exception& ex) {
    return InternalError(std::string("serializing the torch optimizer: ") + ex.what());
  }
  return os.str();
}

Status TorchOptimizer::Load(const std::string& bytes, double lr) {
  STRATA_RETURN_IF_ERROR(Make(lr));
  try {
    std::istringstream is(bytes);
    torch::serialize::InputArchive archive;
    archive.load_from(is, opt_.torch_device);  // the state beside the parameters
    optim_->load(archive);
  } catch (const std::exception& ex) {
    return InvalidArgumentError(std::string("torch optimizer state: ") + ex.what());
  }
  return Status::Ok();
}

}  // namespace strata::runtime
