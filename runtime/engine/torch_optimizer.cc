#include "runtime/engine/torch_optimizer.h"

#include <cmath>
#include <sstream>
#include <vector>

#include "runtime/engine/numerics/clipping.h"

namespace strata::runtime {

Status TorchOptimizer::Make(double lr) {
  if (optim_) return Status::Ok();
  const auto& o = opt_.optimizer_options;
  using cpu_optimizer::OptimizerType;
  std::vector<torch::Tensor> all;
  for (const auto& p : model_.parameters()) {
    if (p.requires_grad()) all.push_back(p);
  }
  switch (o.type) {
    case OptimizerType::kAdam:
      optim_ = std::make_unique<torch::optim::Adam>(
          all, torch::optim::AdamOptions(lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(
                   o.weight_decay));
      break;
    case OptimizerType::kAdamW:
      optim_ = std::make_unique<torch::optim::AdamW>(
          all, torch::optim::AdamWOptions(lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(
                   o.weight_decay));
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

Status TorchOptimizer::Step(double lr, double* grad_norm, std::string* non_finite) {
  std::vector<torch::Tensor> params;
  for (const auto& p : model_.parameters()) {
    if (p.requires_grad() && p.grad().defined()) params.push_back(p);
  }
  torch::NoGradGuard no_grad;
  double total = 0;
  for (const auto& p : params) total += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  STRATA_RETURN_IF_ERROR(opt_.communicator->AllReduceSum(&total, 1));
  *grad_norm = std::sqrt(total);
  if (!std::isfinite(total)) {
    // Name the first parameter with a non-finite gradient; nothing is applied.
    for (const auto& item : model_.named_parameters()) {
      const torch::Tensor g = item.value().grad();
      if (g.defined() && !torch::isfinite(g).all().item<bool>()) {
        *non_finite = item.key();
        break;
      }
    }
    if (non_finite->empty()) *non_finite = "another rank";
    for (auto& p : model_.parameters()) p.mutable_grad() = torch::Tensor();
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
  for (auto& p : model_.parameters()) p.mutable_grad() = torch::Tensor();
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
    archive.load_from(is);
    optim_->load(archive);
  } catch (const std::exception& ex) {
    return InvalidArgumentError(std::string("torch optimizer state: ") + ex.what());
  }
  return Status::Ok();
}

}  // namespace strata::runtime
