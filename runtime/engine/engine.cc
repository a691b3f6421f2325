// Engine states (training): created -> (Backward)* within an accumulation window -> Step at the
// boundary ->
// ... ; Backward counts micro-steps and Step acts only at a boundary. Offload mode builds the
// parts in engine_impl.h in this order: layout (PartitionModel attaches the units), state store
// (device, I/O, arena, TierManager), coordinator, gradient pipeline, optimizer pipeline (each
// takes its staging from the arena), then the store's blocks and their initial values.
// Inference (EngineOptions::inference): created -> forwards only; without offloaded parameters
// it is the model on its device and nothing else, with them the layout, store and coordinator
// (no gradient pipeline, no optimizer pipeline).
// Lock rule: none here; the engine's own threads live in the pipelines (see their files).
#include "runtime/engine/engine.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

#include "base/clock.h"
#include "base/logging.h"
#include "runtime/engine/engine_impl.h"
#include "runtime/engine/host_tensor_cache.h"
#include "runtime/engine/torch_optimizer.h"
#include "runtime/plan/placement.h"

namespace strata::runtime {

Engine::Engine(std::shared_ptr<torch::nn::Module> model, EngineOptions options)
    : model_(std::move(model)), options_(std::move(options)) {}

Engine::~Engine() {
  if (!impl_) return;
  for (const auto& item : model_->modules()) {
    if (auto* u = dynamic_cast<OffloadUnitImpl*>(item.get())) u->Detach();
  }
  impl_->optimizer.reset();
  impl_->grads.reset();
  // Parameters viewing engine memory must not outlive it. (No store: Init failed before it
  // existed, and no parameter views engine memory yet.)
  if (impl_->store != nullptr) {
    torch::NoGradGuard no_grad;
    for (const ParamGroup& g : impl_->layout.groups) {
      for (const ParamSlot& p : g.params) {
        torch::Tensor var = p.var;
        var.set_data(impl_->store->Empty());
      }
    }
  }
  impl_.reset();
}

Result<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<torch::nn::Module> model,
                                               EngineOptions options) {
  if (model == nullptr) return InvalidArgumentError("Engine::Create: no model");
  if (options.gradient_accumulation_steps < 1) {
    return InvalidArgumentError("gradient_accumulation_steps must be >= 1");
  }
  // The same mapping EngineOptionsFromConfig applies (a no-op after it), for callers that fill
  // EngineOptions themselves.
  if (options.inference) {
    options.optimizer = Home::kDevice;  // none: nothing of an optimizer is offloaded
  } else {
    const OptimizerPlacement placed = PlaceOptimizer(
        options.params, options.optimizer, DTypeName(options.precision), options.device_masters);
    options.optimizer = placed.home;
    if (!placed.warning.empty()) options.warnings.push_back(placed.warning);
    STRATA_RETURN_IF_ERROR(options.optimizer_options.Validate());
  }
  std::optional<LossScaler> scaler;
  if (options.precision == DType::kFloat16 && !options.inference) {
    Fp16Config fp16 = options.fp16;
    fp16.enabled = true;
    STRATA_ASSIGN_OR_RETURN(LossScaler s, LossScaler::Create(fp16));
    scaler.emplace(s);
  }
  if (options.communicator == nullptr) options.communicator = MakeSingleRankCommunicator();
  if (options.grad_communicator == nullptr && options.communicator->world_size() == 1) {
    options.grad_communicator = MakeSingleRankCommunicator();
  }
  if (options.communicator->world_size() > 1 && !options.torch_device.is_cpu() &&
      options.communicator->backend() != "nccl") {
    return InvalidArgumentError(
        "world size " + std::to_string(options.communicator->world_size()) + " on " +
        options.torch_device.str() + " over " + options.communicator->backend() +
        ": data-parallel ranks on GPUs need the NCCL communicator (ConnectGloo with the rank's "
        "CUDA device); Gloo's collectives work on host memory only");
  }
  std::unique_ptr<Engine> e(new Engine(std::move(model), std::move(options)));
  e->scaler_ = scaler;
  if (e->options_.nan_gradient) {
    bool matches = false;
    for (const auto& item : e->model_->named_parameters()) {
      matches = matches || item.key().rfind(e->options_.nan_gradient->parameter, 0) == 0;
    }
    if (!matches) {
      return InvalidArgumentError("STRATA_NAN_GRADIENT=" + e->options_.nan_gradient->parameter +
                                  "@" + std::to_string(e->options_.nan_gradient->step) +
                                  ": no parameter's name starts with " +
                                  e->options_.nan_gradient->parameter);
    }
    STRATA_LOG(kWarning) << "STRATA_NAN_GRADIENT is set (a test hook): the gradient of "
                         << e->options_.nan_gradient->parameter << "* gets a NaN at step "
                         << e->options_.nan_gradient->step;
  }
  STRATA_RETURN_IF_ERROR(e->Init());
  return e;
}

Status Engine::Init() {
  // The host-emulated device computes in libtorch CPU tensors: cache their large blocks as a GPU's
  // caching allocator would, so steady-state steps do not fault in fresh pages. Installed here,
  // after the model is built, not when the program starts: a model streamed in through the cache
  // would keep its load's blocks (peak RSS grew 1.32x on HfRssTest).
  if (options_.torch_device.is_cpu() && options_.host_tensor_cache_bytes > 0) {
    HostTensorCache::Install(options_.host_tensor_cache_bytes);
  }
  if (options_.moment_dtype != DType::kFloat32 &&
      (options_.moment_dtype != DType::kBFloat16 || options_.precision != DType::kBFloat16)) {
    return InvalidArgumentError(
        "bf16 optimizer states (bf16.bf16_optimizer_states) need bf16.enabled: moments are fp32 "
        "with " +
        std::string(DTypeName(options_.precision)));
  }
  // (bf16 always runs the CPU optimizer: Create placed it, plan/placement.h.) Inference pages
  // the parameters through the offload parts when they are offloaded, else runs as no offload.
  const bool offload =
      options_.inference ? options_.params != Home::kDevice : options_.optimizer != Home::kDevice;
  if (!offload) {
    if (!options_.inference &&
        options_.optimizer_options.type == cpu_optimizer::OptimizerType::kLion) {
      return InvalidArgumentError(
          "optimizer Lion needs zero_optimization.offload_optimizer.device cpu or nvme (no "
          "offload uses torch::optim, which has no Lion)");
    }
    if (options_.initialize_unit) {
      torch::NoGradGuard no_grad;
      int unit = 0;
      for (const auto& item : model_->modules()) {
        if (dynamic_cast<OffloadUnitImpl*>(item.get()) != nullptr) {
          STRATA_RETURN_IF_ERROR(options_.initialize_unit(unit++));
        }
      }
    }
    // No offload on a GPU: the model lives there and torch::optim updates it there.
    if (!options_.torch_device.is_cpu()) {
      try {
        model_->to(options_.torch_device);
      } catch (const std::exception& e) {
        return ErrorFromException(e);
      }
    }
    if (options_.inference) return Status::Ok();
    torch_optim_ = std::make_unique<TorchOptimizer>(*model_, options_);
    return torch_optim_->Init();
  }
  impl_ = std::make_unique<Impl>();
  Impl& m = *impl_;
  m.opt_type = options_.optimizer_options.type;
  STRATA_ASSIGN_OR_RETURN(auto cpu,
                          cpu_optimizer::CpuOptimizer::Create(options_.optimizer_options));
  m.cpu_opt.emplace(cpu);
  STRATA_ASSIGN_OR_RETURN(
      m.layout, PartitionModel(*model_, options_.params, options_.persistence_threshold,
                               options_.sub_group_size, this, options_.communicator->world_size(),
                               options_.communicator->rank()));
  if (options_.precision == DType::kFloat16 && options_.torch_device.is_cpu()) {
    STRATA_LOG(kInfo) << "fp16 on the host-emulated device: compute runs in fp32 on the "
                         "fp16-rounded values (libtorch's CPU backend cannot compute in fp16)";
  }
  m.sizes.compute_bytes = DTypeBytes(options_.precision);
  m.sizes.state_arrays = StateArrays(m.opt_type);
  m.sizes.moment_bytes = DTypeBytes(options_.moment_dtype);
  // offload_param.max_in_cpu's units pinned; fp32 masters in the parameter blocks.
  // The host budget holds the process and, on the host-emulated device, the device's memory
  // beside the pinned arena; the host-RAM tier is what it leaves beyond them (the units it keeps
  // are placed as max_in_cpu's are).
  options_.host_beside = {.process = options_.host_process_reserve};
  if (options_.device == nullptr) {
    options_.host_beside.emulated_device = OwnedHostDeviceBudget(options_, m.layout, m.sizes);
  } else if (options_.device->info().host_addressable) {
    options_.host_beside.emulated_device = options_.device->info().budget_bytes;
  }
  options_.host_cache_bytes = 0;
  if (options_.host_cache_budget != 0 && options_.pinned_bytes == 0) {
    options_.host_cache_bytes = HostCacheBytesFor(PlanInputFor(options_, m.layout, m.sizes),
                                                  options_.host_cache_budget, options_.host_beside);
  }
  PlaceGroups(options_, m.layout, m.sizes);
  STRATA_ASSIGN_OR_RETURN(m.store, StateStore::Create(options_, m.layout, m.sizes));
  m.coordinator = std::make_unique<ParamCoordinator>(options_, m.layout, *m.store, boundary_);
  // Inference: no gradient hand-off and no optimizer (their staging is not in the plan either).
  if (options_.inference) return m.store->InitBlocks(*m.cpu_opt, m.opt_type);
  STRATA_ASSIGN_OR_RETURN(m.grads, GradPipeline::Create(options_, m.layout, *m.store, boundary_));
  STRATA_ASSIGN_OR_RETURN(m.optimizer, OptimizerPipeline::Create(options_, m.layout, *m.store,
                                                                 *m.grads, *m.cpu_opt, m.opt_type));
  m.coordinator->set_optimizer(m.optimizer.get());
  m.optimizer->set_on_updated([c = m.coordinator.get()](int g) { c->Updated(g); });
  return m.store->InitBlocks(*m.cpu_opt, m.opt_type);
}

bool Engine::NextMicroStepIsBoundary() const {
  return (micro_steps_ + 1) % options_.gradient_accumulation_steps == 0;
}

bool Engine::IsAccumulationBoundary() const {
  return micro_steps_ % options_.gradient_accumulation_steps == 0;
}

double Engine::learning_rate() const {
  return options_.lr_at ? options_.lr_at(applied_steps()) : options_.optimizer_options.lr;
}

TierTelemetry Engine::telemetry() const {
  return impl_ ? impl_->store->tm().telemetry() : TierTelemetry{};
}

Engine::SpeculativeReads Engine::speculative_reads() const {
  if (!impl_) return {};
  const ParamCoordinator::Speculation& s = impl_->coordinator->speculation();
  return {s.bytes, s.wasted_bytes};
}

uint64_t Engine::pinned_arena_bytes() const { return impl_ ? impl_->store->arena().capacity() : 0; }

std::optional<ModelLayout> Engine::plan_layout() const {
  if (!impl_) return std::nullopt;
  return impl_->layout.Plan();
}

std::optional<PlanInput> Engine::plan_input() const {
  if (!impl_) return std::nullopt;
  PlanInput in = PlanInputFor(options_, impl_->layout, impl_->sizes);
  in.device_unit_slots = impl_->store->device_slots();
  return in;
}

Engine::Occupancy Engine::occupancy() const {
  Occupancy o;
  if (!impl_) return o;
  StateStore& s = *impl_->store;
  o.device_used = s.device().used_bytes();
  o.device_budget = s.device().info().budget_bytes;
  o.device_peak = s.device().peak_bytes();
  o.pinned_used = s.arena().used_bytes();
  o.pinned_capacity = s.arena().capacity();
  o.pinned_peak = s.arena().peak_bytes();
  return o;
}

Status Engine::ErrorFromException(const std::exception& e) { return boundary_.Take(e); }

Status Engine::Backward(const torch::Tensor& loss) {
  if (options_.inference) {
    return FailedPreconditionError(
        "Backward: this engine was created for inference (no gradients or optimizer state)");
  }
  if (!loss.defined() || loss.numel() != 1) {
    return InvalidArgumentError("Backward needs a scalar loss");
  }
  const bool boundary = NextMicroStepIsBoundary();
  // The previous step's deferred updates are done (the forward waited for the units it used):
  // its remaining writes and errors; a unit the forward did not use is updated before its
  // gradients can arrive.
  if (impl_) {
    Stopwatch wait;
    Status finished = impl_->optimizer->Finish();
    optimizer_wait_seconds_ += wait.Seconds();
    STRATA_RETURN_IF_ERROR(finished);
  }
  // The optimizer's first state blocks are read while backward computes.
  if (boundary && impl_) impl_->optimizer->PrefetchFirstStates();
  try {
    // DeepSpeed's order: the loss over gas here; the ranks' gradients are summed by the
    // reduce-scatter (all-reduce without offload) and divided by the world size after it, so
    // 16-bit gradients are not made world times smaller (closer to underflow) before the sum.
    const int gas = options_.gradient_accumulation_steps;
    torch::Tensor scaled = gas > 1 ? loss / static_cast<double>(gas) : loss;
    if (scaler_) scaled = scaled * scaler_->scale();  // DeepSpeed: (loss / gas) * cur_scale
    scaled.backward();
    if (torch_optim_) torch_optim_->AccumulateGradients();
  } catch (const std::exception& e) {
    Status s = ErrorFromException(e);
    DiscardWindow();
    return s;
  }
  ++micro_steps_;
  if (!impl_) return Status::Ok();
  // The resident group's gradients (parameters outside units and small unit parameters).
  const ParamGroup& r = impl_->layout.groups[impl_->layout.resident_group];
  std::vector<torch::Tensor> grads;
  grads.reserve(r.params.size());
  for (const ParamSlot& p : r.params) {
    grads.push_back(p.var.grad());
    if (options_.nan_gradient && grads.back().defined())
      grads.back() = Poisoned(p.name, grads.back());
  }
  try {
    impl_->grads->Submit(impl_->layout.resident_group, std::move(grads), boundary);
  } catch (const std::exception& e) {
    Status s = ErrorFromException(e);
    --micro_steps_;
    DiscardWindow();
    return s;
  }
  Stopwatch watch;
  Status s = impl_->grads->Drain();
  times_.grad_wait_seconds = watch.Seconds();
  for (const ParamSlot& p : r.params) {
    torch::Tensor var = p.var;
    var.mutable_grad() = torch::Tensor();
  }
  impl_->coordinator->EndPass();
  times_.gather_wait_seconds = impl_->coordinator->TakeGatherWaitSeconds();
  optimizer_wait_seconds_ += impl_->coordinator->TakeOptimizerWaitSeconds();
  if (!s.ok()) {
    --micro_steps_;
    DiscardWindow();
  }
  return s;
}

void Engine::DiscardWindow() {
  micro_steps_ -= micro_steps_ % options_.gradient_accumulation_steps;
  if (torch_optim_) torch_optim_->DiscardGradients();
  if (!impl_) return;
  impl_->grads->Drain().IgnoreError();  // the hand-offs in flight end before the reset
  for (int si = 0; si < static_cast<int>(impl_->layout.subgroups.size()); ++si) {
    impl_->grads->Reset(si);
  }
  impl_->grads->ClearReceived();
  for (const ParamSlot& p : impl_->layout.groups[impl_->layout.resident_group].params) {
    torch::Tensor var = p.var;
    var.mutable_grad() = torch::Tensor();
  }
  impl_->coordinator->EndPass();
}

Status Engine::WaitForCompute() {
  if (options_.torch_device.is_cpu()) return Status::Ok();
  try {
    c10::impl::VirtualGuardImpl impl(options_.torch_device.type());
    impl.synchronizeStream(impl.getStream(options_.torch_device));
  } catch (const std::exception& e) {
    return ErrorFromException(e);
  }
  return Status::Ok();
}

void Engine::Gather(int unit, bool tracked) {
  // An inference engine's forwards are its passes: tracked, so they prefetch (EndForward).
  impl_->coordinator->Gather(unit, tracked || options_.inference);
}

void Engine::EndForward() {
  if (!impl_ || !options_.inference) return;
  impl_->coordinator->EndPass();
  impl_->coordinator->PrefetchNextPass();
}
void Engine::Release(int unit) { impl_->coordinator->Release(unit); }
void Engine::Expect(const std::vector<int>& units) {
  if (impl_) impl_->coordinator->Expect(units);
}
const std::vector<torch::Tensor>& Engine::GradParameters(int unit) {
  return impl_->layout.unit_grad_params[unit];
}

void Engine::GradientsReady(int unit, std::vector<torch::Tensor> grads) {
  const bool boundary = NextMicroStepIsBoundary();
  const EngineLayout& l = impl_->layout;
  const auto& targets = l.unit_grad_targets[unit];
  std::vector<torch::Tensor> unit_grads(l.groups[unit].params.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    const GradTarget& t = targets[i];
    if (options_.nan_gradient && grads[i].defined()) {
      const int g = t.resident ? l.resident_group : unit;
      grads[i] = Poisoned(l.groups[g].params[t.slot].name, grads[i]);
    }
    if (!t.resident) {
      unit_grads[t.slot] = std::move(grads[i]);
      continue;
    }
    if (!grads[i].defined()) continue;
    // A small unit parameter kept on the device: accumulate into its .grad like a resident one.
    torch::Tensor var = l.groups[l.resident_group].params[t.slot].var;
    torch::Tensor& acc = var.mutable_grad();
    torch::NoGradGuard no_grad;
    if (acc.defined()) {
      acc.add_(grads[i]);
    } else {
      acc = grads[i].detach().clone();
    }
  }
  impl_->grads->Submit(unit, std::move(unit_grads), boundary);
}

torch::Tensor Engine::Poisoned(const std::string& name, const torch::Tensor& grad) const {
  if (!options_.nan_gradient || global_steps_ + 1 != options_.nan_gradient->step ||
      name.compare(0, options_.nan_gradient->parameter.size(), options_.nan_gradient->parameter) !=
          0) {
    return grad;
  }
  torch::NoGradGuard no_grad;
  torch::Tensor poisoned = grad.clone();  // the hook must not write into autograd's buffers
  poisoned.view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
  return poisoned;
}

}  // namespace strata::runtime
