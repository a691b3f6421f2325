// The engine's optimizer step at an accumulation boundary (Engine::Step): the gradient norm over
// every rank, fp16's overflow check and loss scale, clipping, the optimizer pipeline started on
// the offloaded sub-groups (deferred into the next forward when EngineOptions::defer_optimizer)
// and the device homes gathered across ranks; without offload, torch::optim's step. A step whose
// gradients are not finite (outside fp16) is refused before it changes anything.
// Lock rule: none here; runs on the training thread (engine.cc has the states).
#include <cmath>
#include <string>

#include "base/clock.h"
#include "base/logging.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_impl.h"
#include "runtime/engine/torch_optimizer.h"
#include "runtime/numerics/clipping.h"

namespace strata::runtime {
namespace {

Status NonFiniteGradientError(int64_t step, const std::string& where) {
  return FailedPreconditionError(
      "step " + std::to_string(step) + ": the gradients are not finite (inf or NaN in " + where +
      "); the step was not applied and training stops. Parameters and optimizer state are those "
      "of step " +
      std::to_string(step - 1) +
      ", so checkpoints saved before are intact. Lower the learning rate, check the data, or "
      "train in bf16 or with fp16 loss scaling");
}

}  // namespace

Status Engine::Step() {
  if (options_.inference) {
    return FailedPreconditionError(
        "Step: this engine was created for inference (no gradients or optimizer state)");
  }
  if (micro_steps_ == 0 || !IsAccumulationBoundary()) return Status::Ok();
  // This window's waits for the previous step's deferred updates (every micro-batch's).
  times_.optimizer_wait_seconds = optimizer_wait_seconds_;
  optimizer_wait_seconds_ = 0;
  const double lr = learning_rate();
  Stopwatch watch;
  bool skipped = false;
  if (!impl_ && options_.nan_gradient) {
    for (auto& item : model_->named_parameters()) {
      torch::Tensor& grad = item.value().mutable_grad();
      if (grad.defined()) grad = Poisoned(item.key(), grad);
    }
  }
  Status s;
  if (impl_) {
    s = StepOffload(lr, &skipped);
  } else {
    std::string non_finite;
    s = torch_optim_->Step(lr, &last_grad_norm_, &non_finite);
    if (s.ok() && !non_finite.empty()) s = NonFiniteGradientError(global_steps_ + 1, non_finite);
  }
  times_.optimizer_seconds = watch.Seconds();
  if (!s.ok()) return s;
  ++global_steps_;  // DeepSpeed counts skipped steps too; applied_steps() does not
  last_step_skipped_ = skipped;
  if (skipped) ++skipped_steps_;
  return s;
}

std::vector<bool> Engine::UnitsUpdatedByLastStep() const {
  std::vector<bool> out;
  if (!impl_ || !impl_->optimizer) return out;
  for (int u = 0; u < impl_->layout.resident_group; ++u) {
    out.push_back(impl_->optimizer->Updates(u));
  }
  return out;
}

std::vector<bool> Engine::UnitsWithGradientsInLastStep() const {
  std::vector<bool> out;
  if (!impl_ || !impl_->optimizer) return out;
  for (int u = 0; u < impl_->layout.resident_group; ++u) {
    out.push_back(impl_->optimizer->HadGradient(u));
  }
  return out;
}

Status Engine::FinishStep() {
  return impl_ && impl_->optimizer ? impl_->optimizer->Finish() : Status::Ok();
}

Status Engine::StepOffload(double lr, bool* skipped) {
  Impl& m = *impl_;
  // On a GPU: the backward's last kernels are done before the optimizer writes device homes.
  STRATA_RETURN_IF_ERROR(m.store->WaitForCompute());
  STRATA_RETURN_IF_ERROR(m.grads->Drain());
  STRATA_RETURN_IF_ERROR(m.grads->RefreshSums());
  double total = m.grads->SumOfSquares();
  STRATA_RETURN_IF_ERROR(options_.communicator->AllReduceSum(&total, 1));
  double grad_scale = 1.0;
  if (scaler_) {
    // The gradients hold loss_scale times their values; a non-finite sum of squares means some
    // gradient overflowed fp16 (or is NaN) on some rank.
    const double scale = scaler_->scale();
    if (!std::isfinite(total)) {
      scaler_->Update(/*overflow=*/true);
      if (scaler_->overflow_at_min_scale() && overflow_at_min_warnings_++ < 5) {
        STRATA_LOG(kWarning) << "fp16 gradients overflowed with the loss scale already at "
                                "fp16.min_loss_scale ("
                             << scale
                             << "); the step is skipped and training goes on (DeepSpeed stops "
                                "here): the model may be diverging";
      }
      for (int si = 0; si < static_cast<int>(m.layout.subgroups.size()); ++si) m.grads->Reset(si);
      m.grads->ClearReceived();
      m.coordinator->PrefetchNextPass();
      *skipped = true;
      return Status::Ok();
    }
    const double scaled_norm = std::sqrt(total);
    last_grad_norm_ = scaled_norm / scale;
    grad_scale = UnscaleAndClipMultiplier(scaled_norm, scale, options_.gradient_clipping);
  } else {
    if (!std::isfinite(total)) {
      const int si = m.grads->FirstNonFiniteSubgroup();
      const std::string where =
          si < 0 ? std::string("another rank") : m.layout.groups[m.layout.subgroups[si].group].name;
      return NonFiniteGradientError(global_steps_ + 1, where);
    }
    last_grad_norm_ = std::sqrt(total);
    grad_scale = ClipMultiplier(last_grad_norm_, options_.gradient_clipping);
  }
  // Offloaded units are updated in the background while the next forward runs (it waits for each
  // unit's update before gathering it); device homes now.
  STRATA_RETURN_IF_ERROR(m.optimizer->Start(applied_steps() + 1, grad_scale, lr, /*compute=*/true,
                                            options_.defer_optimizer));
  if (scaler_) scaler_->Update(/*overflow=*/false);
  STRATA_RETURN_IF_ERROR(GatherDeviceHomes());
  m.store->RefreshDeviceHomeTensors();
  m.coordinator->PrefetchNextPass();
  return Status::Ok();
}

Status Engine::GatherDeviceHomes() {
  Impl& m = *impl_;
  if (m.layout.world == 1) return Status::Ok();
  // The optimizer updated this rank's slice of each device-home block (the resident group, and
  // every unit when parameters stay on the device): every rank's slices, in place.
  const uint64_t c = m.sizes.compute_bytes;
  for (int gi = 0; gi < static_cast<int>(m.layout.groups.size()); ++gi) {
    const ParamGroup& g = m.layout.groups[gi];
    if (g.home != Home::kDevice || g.numel == 0) continue;
    auto* base = static_cast<std::byte*>(m.store->group(gi).home_pin.data());
    STRATA_RETURN_IF_ERROR(options_.communicator->AllGather(
        base + static_cast<uint64_t>(m.layout.rank) * g.part * c, base, g.part * c));
  }
  return Status::Ok();
}

}  // namespace strata::runtime
