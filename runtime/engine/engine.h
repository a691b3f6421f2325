// Engine: trains a libtorch model whose parameters, gradients and optimizer state live in the
// tiers the config chooses (ARCHITECTURE.md §1, §3, §5). Modes:
//   - no offload (params and optimizer on the device): plain libtorch training with torch::optim;
//   - ZeRO-Offload (optimizer = cpu|nvme, params on the device): fp32 gradients accumulate in
//     pinned host memory (and go to NVMe with the optimizer state); the fused CPU optimizer
//     updates sub-groups and copies the new parameters back to the device;
//   - ZeRO-3 offload (params = cpu|nvme too): each offload unit's parameters live in one flat block
//     in host memory or on NVMe and are gathered onto the device only while the unit runs.
//
//   auto engine = Engine::Create(model, options).value();
//   for (...) { auto loss = model->Loss(x, y); CHECK_OK(engine->Backward(loss));
//               CHECK_OK(engine->Step()); }
//
// The house: this class is a facade over its parts, each in its own file with its own test:
//   engine_layout.h      the groups and sub-groups (the one split, shared with the memory plan)
//   state_store.h        device, I/O, pinned arena, TierManager and every block at its home
//   param_coordinator.h  gather/release of units, order recording and prefetching
//   grad_pipeline.h      device -> host gradient hand-off and fp32 accumulation
//   optimizer_pipeline.h read(g+1) ∥ CPU optimizer(g) ∥ write(g-1)
//   torch_optimizer.h    the no-offload mode's torch::optim
//   numerics/            LR schedules, loss scaler, the clipping rule
//   offload_unit.h       the wrapper module and the libtorch boundary
//   engine_state.cc      checkpoints (SaveState/LoadState) and the safetensors export
//   io_replay.h          the I/O of a step without compute, for `strata bench step`
//
// Numbers: in fp32 every mode computes the same losses and parameters as plain libtorch with the
// same optimizer (tests/runtime/engine/engine_exactness_test.cc); with gradient clipping the
// global norm is summed in another order (relative differences ~1e-7). In bf16 and fp16 every
// offload mode computes the same numbers as every other (bitwise).
//
// Layouts DeepSpeed runs with the optimizer on the device (offload_optimizer none with offloaded
// parameters, or bf16/fp16) run the CPU optimizer with its state in pinned host memory here
// (plan/placement.h; Create notes it in options().warnings). No offload is fp32 only.
//
// fp16 (DeepSpeed's semantics): Backward backpropagates loss * loss_scale(). At Step, a gradient
// that is inf or NaN (the boundary's sum of squares is not finite) skips the step: parameters and
// optimizer state stay, the gradients are dropped, the optimizer's step count and the learning
// rate schedule do not advance (global_steps() does, as DeepSpeed's), and the loss scaler
// (numerics/loss_scaler.h) lowers the scale. Otherwise the gradients are unscaled and clipped by
// one multiplier (numerics/clipping.h's UnscaleAndClipMultiplier). Where DeepSpeed raises at an
// overflow with the scale already at min_loss_scale, the engine skips the step, logs a warning and
// goes on. On the host-emulated device the model computes in fp32 on the fp16 values and the
// gradients are rounded to fp16 at the hand-off (state_store.h, grad_pipeline.h).
//
// Non-finite gradients outside fp16 (fp32, bf16): Step refuses to apply them. A gradient norm
// that is inf or NaN fails Step with FailedPrecondition naming the step and the unit (group) whose
// gradients hold the first non-finite value; parameters and optimizer state are left as the last
// applied step wrote them, so a checkpoint saved before is the last good state. Test hook
// (EngineOptions::nan_gradient, test_hooks.h): a NaN in the gradient of every parameter whose name
// starts with PARAM during optimizer step STEP (1-based), with a warning at Create.
//
// Threads: Backward, Step and the model's forward are called from one thread (the training
// thread, T). The engine's own threads: the gradient hand-off worker (H, grad_pipeline.h), the
// optimizer's deferred-step worker (D) and write-behind worker (W, optimizer_pipeline.h), the
// ahead all-gather worker (A, ranks only, param_coordinator.h), and the I/O and device-copy
// threads, which run TierManager completions and touch only the TierManager's state, under its
// lock. Who owns what, phase by phase:
//   forward   T gathers and releases units (ParamCoordinator: its gathered units, the recorded
//             order, its eviction window). With a deferred step in flight, D updates groups in
//             group order and owns the parameter, state and gradient blocks of every group it has
//             not reached (OptimizerPipeline::Pending); T's gather of such a unit first waits for
//             D's update of it (WaitGroup), and stops prefetching there. T and D each set their
//             own window of upcoming uses (FutureUsePolicy::Window), so neither overwrites the
//             other's.
//   backward  T first waits for D to finish (OptimizerPipeline::Finish): D is idle from here to
//             the step. T hands each unit's gradients to H (GradPipeline::Submit); H alone writes
//             the gradient accumulators (the fp32 gradient blocks and the per-sub-group counters
//             and sums of squares) and starts their NVMe writes.
//   step      T drains H (GradPipeline::Drain), reads the sums of squares, and steps the
//             device-home sub-groups itself (without deferral: all of them), reading and resetting
//             their accumulators; an fp16 overflow resets them all on T. W writes behind.
//   deferred  (Step with deferral, the default) the other sub-groups are queued for D and started
//             by the next forward's first wait (or by Finish); D reads and resets their
//             accumulators, W writes behind.
// So the gradient accumulators have one writer at a time, in turn: H (backward) -> T (step) ->
// D (deferred step) -> H (next backward). Each hand-off goes through a lock that orders the writes
// before it with those after it: GradPipeline::Drain (the hand-off worker's queue lock, H -> T),
// the deferred part's hand-over to D (OptimizerPipeline::mu_ and D's queue lock, T -> D), and
// Finish, which waits on OptimizerPipeline::mu_ for D to end (D -> T, then H at Submit). The lock
// order below TierManager's lock is in tiers/tier_manager.h.
// Ownership: the engine keeps the model alive and attaches itself to its offload units; the
// model's offloaded parameters are views into engine memory while gathered, empty otherwise.
// The model must be on the CPU when the engine is created (its initial values are read there).
// Errors: every failure is a Status; one raised inside a unit's forward or backward crosses
// libtorch as a c10::Error and comes back with its code (ErrorFromException).
#pragma once

#include <torch/torch.h>

#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "runtime/engine/offload_unit.h"
#include "runtime/engine/options.h"
#include "runtime/numerics/loss_scaler.h"
#include "runtime/persist/checkpoint_store.h"
#include "runtime/plan/layout.h"
#include "runtime/plan/memory_plan.h"
#include "tiers/tier.h"
#include "tiers/tier_manager.h"

namespace strata::runtime {

class Engine final : public strata::UnitHooks {
 public:
  static Result<std::unique_ptr<Engine>> Create(std::shared_ptr<torch::nn::Module> model,
                                                EngineOptions options);
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Backpropagates loss / gradient_accumulation_steps (times loss_scale() in fp16) and hands
  // every gradient off. On failure (an I/O error, a unit's exception) part of the micro-batch's
  // gradients may have been accumulated: the accumulation window's gradients are all dropped and
  // micro_steps() goes back to the window's first micro-batch, so the caller can feed the window
  // again (or stop) without training on a partial gradient.
  Status Backward(const torch::Tensor& loss);
  // At an accumulation boundary: clip, update every parameter (fp16: unless a gradient overflowed,
  // which skips the update) and advance the step; else a no-op. With offload and
  // EngineOptions::defer_optimizer (the default) the offloaded units' updates may still run when
  // it returns: the next forward waits for each unit's, and everything that reads or replaces
  // state (SaveState, LoadState, ParameterValues, exports, the next Backward) waits for all.
  Status Step();
  // Waits until the last Step's updates are all done and written; their error, if any (also
  // reported by whatever waits for them first). For benchmarks timing a whole step.
  [[nodiscard]] Status FinishStep();
  // Blocks until libtorch's work queued on the device so far has run (a GPU computes
  // asynchronously: phase timings call this at their end). No-op on the host-emulated device.
  [[nodiscard]] Status WaitForCompute();

  // Inference (EngineOptions::inference): a forward of the model ended. Units gathered by
  // forwards are tracked in inference (their order recorded, later forwards prefetch along it, as
  // training's forward does), and a pass ends here: the first one records the order, and the first
  // units of the next forward start moving at once. A no-op in a training engine (its passes end
  // in Backward). Call it after each forward, also one that failed.
  void EndForward();

  bool IsAccumulationBoundary() const;
  // Steps taken, skipped fp16 steps included (DeepSpeed's global_steps).
  int64_t global_steps() const { return global_steps_; }
  int64_t micro_steps() const { return micro_steps_; }
  // Steps that updated the parameters: the optimizer's step count and the LR schedule's position.
  int64_t applied_steps() const { return global_steps_ - skipped_steps_; }
  // The learning rate the next applied step uses.
  double learning_rate() const;
  // The global gradient norm of the last applied step (unscaled), before clipping.
  double last_grad_norm() const { return last_grad_norm_; }
  // fp16: the loss scale the next Backward multiplies by; 1 otherwise.
  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  // The last Step at a boundary found an fp16 overflow and did not update anything.
  bool last_step_skipped() const { return last_step_skipped_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  const StepTimes& times() const { return times_; }
  TierTelemetry telemetry() const;
  // Reads of conditional units (experts under --page-experts) started ahead of their routing by
  // the router's history, and the wasted ones (param_coordinator.h), since the engine was made.
  struct SpeculativeReads {
    uint64_t bytes = 0, wasted_bytes = 0;
  };
  SpeculativeReads speculative_reads() const;
  const EngineOptions& options() const { return options_; }
  bool offloaded() const { return impl_ != nullptr; }
  uint64_t pinned_arena_bytes() const;
  // The layout the memory plan was made for (this rank's units and resident group, sub-groups):
  // what `strata estimate` predicts for the same flags. nullopt without offload.
  std::optional<ModelLayout> plan_layout() const;
  // The memory plan's whole input for this engine (layout, placements, the host-RAM tier's bytes):
  // PlanMemory and NvmeTrafficPerStep of it are this run's. nullopt without offload.
  std::optional<PlanInput> plan_input() const;
  // Per offload unit: whether the last Step updated it (some micro-batch on some rank gave it a
  // gradient, or EngineOptions::step_without_gradient: every unit; without it an expert no token
  // was routed to, paged as a unit of its own, is not). Empty without offload.
  std::vector<bool> UnitsUpdatedByLastStep() const;
  // Per offload unit: whether some micro-batch on some rank gave it a gradient in the last Step
  // (the units its tokens reached). Empty without offload.
  std::vector<bool> UnitsWithGradientsInLastStep() const;
  // Tier occupancy now: bytes in use on the device (its budget) and in the pinned arena.
  struct Occupancy {
    uint64_t device_used = 0, device_budget = 0, pinned_used = 0, pinned_capacity = 0;
    uint64_t device_peak = 0;  // the most the engine's device memory held at once
    uint64_t pinned_peak = 0;
  };
  Occupancy occupancy() const;

  // Checkpoints (runtime/persist/checkpoint_store.h). SaveState writes "engine.json" (layout,
  // steps, compute dtype, fp16's loss scaler and skipped steps), "params/<group>.bin" (each group's
  // flat parameters) and "state/<group>/<begin>.bin" (each sub-group's fp32 master and moments),
  // streaming one block at a time; in no-offload mode the parameters and the torch::optim state.
  // LoadState verifies every checksum, checks the layout against this engine's model (the same
  // parameter names and shapes, optimizer, compute dtype: an fp16 checkpoint does not load into a
  // bf16 or fp32 engine, nor the reverse) and every entry's size before reading it, then puts the
  // values back in every tier. Parameters are read by name, so a checkpoint loads whatever offload
  // units, sub-groups and ranks cut the model when it was saved (per-expert paging or not,
  // another persistence threshold, sub_group_size or world size). REQUIRES: between steps (after
  // Step, before the next forward), gradients not accumulated.
  Status SaveState(CheckpointWriter& writer);
  Status LoadState(const CheckpointReader& reader);
  // Every trainable parameter as fp32 in one safetensors file (what DeepSpeed's zero_to_fp32
  // produces), names as the model names them, streamed group by group.
  Status ExportSafetensors(const std::string& path,
                           const std::map<std::string, std::string>& metadata = {});

  // Every trainable parameter's current value as fp32 on the CPU, in the model's order.
  Result<std::vector<std::pair<std::string, torch::Tensor>>> ParameterValues();
  // Streams every trainable parameter's current fp32 value (the master weights) to `fn` in the
  // model's order (named_parameters: what an export writes, the same whichever offload units the
  // model has, e.g. with and without --page-experts), reading one group (offload unit) at a time:
  // host memory holds one unit's values and the resident group's (kept from its first parameter
  // to the end), never the model's. `values` is valid during the call only. The first failing
  // `fn` ends the walk with its Status. REQUIRES: between steps.
  using ParameterVisitor = std::function<Status(
      const std::string& name, const std::vector<int64_t>& shape, const float* values)>;
  Status VisitParameters(const ParameterVisitor& fn);
  // The names and shapes VisitParameters gives, in its order, without reading any value.
  std::vector<std::pair<std::string, std::vector<int64_t>>> ParameterOrder() const;

  // A Status thrown out of an offload unit's forward or backward (it crosses libtorch as a
  // c10::Error) comes back from here with its code and message, e.g. an NVMe read error during
  // forward stays kIoError; any other exception is kInternal with its what(). Call it in the
  // catch block of code that runs the model's forward (Backward does it itself).
  Status ErrorFromException(const std::exception& e);

  // UnitHooks (called by the offload units; throw c10::Error on failure).
  void Gather(int unit, bool tracked) override;
  void Release(int unit) override;
  const std::vector<torch::Tensor>& GradParameters(int unit) override;
  void GradientsReady(int unit, std::vector<torch::Tensor> grads) override;
  void Expect(const std::vector<int>& units) override;

  struct Impl;  // the offload parts (engine_impl.h); null in no-offload mode
  Impl* impl() { return impl_.get(); }

 private:
  Engine(std::shared_ptr<torch::nn::Module> model, EngineOptions options);
  Status Init();
  // The micro-batch being backpropagated now is the last of its accumulation window.
  bool NextMicroStepIsBoundary() const;
  // After a failed Backward: drops the window's gradients and restarts it (see Backward).
  void DiscardWindow();
  nlohmann::json LayoutJson() const;
  Status StepOffload(double lr, bool* skipped);
  // Ranks: all-gathers the device-home blocks after the optimizer updated this rank's slices.
  Status GatherDeviceHomes();
  // EngineOptions::nan_gradient (a test hook): `grad` of parameter `name` with a NaN in a copy if
  // the hook names the parameter and this is the hook's step; else `grad` itself.
  torch::Tensor Poisoned(const std::string& name, const torch::Tensor& grad) const;
  Status SaveOffloadState(CheckpointWriter& writer);
  // Group gi's fp32 masters, the whole padded group (collective with ranks: an all-gather).
  Status GroupMasters(int gi, std::vector<float>& whole);
  Status LoadOffloadState(const CheckpointReader& reader);
  // The offload layout's (group, slot) of every trainable parameter, in the model's order.
  std::vector<std::pair<int, int>> ModelOrderSlots() const;

  std::shared_ptr<torch::nn::Module> model_;
  EngineOptions options_;
  int64_t global_steps_ = 0;
  int64_t micro_steps_ = 0;
  double last_grad_norm_ = 0;
  std::optional<LossScaler> scaler_;  // fp16 only
  int64_t skipped_steps_ = 0;
  bool last_step_skipped_ = false;
  int overflow_at_min_warnings_ = 0;
  StepTimes times_;
  double optimizer_wait_seconds_ = 0;  // since the last Step: waits for deferred updates
  TorchBoundary boundary_;
  std::unique_ptr<class TorchOptimizer> torch_optim_;  // no-offload mode
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::runtime
