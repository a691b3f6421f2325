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
// Numbers: in fp32 every mode computes the same losses and parameters as plain libtorch with the
// same optimizer (tests/runtime/engine_exactness_test.cc); with gradient clipping the global norm
// is summed in another order (relative differences ~1e-7).
//
// Threads: Backward, Step and the model's forward are called from one thread (the training
// thread). The engine runs its own gradient hand-off and write-behind threads.
// Ownership: the engine keeps the model alive and attaches itself to its offload units; the
// model's offloaded parameters are views into engine memory while gathered, empty otherwise.
// The model must be on the CPU when the engine is created (its initial values are read there).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "cpu_optimizer/optimizer.h"
#include "runtime/persist/checkpoint_store.h"
#include "runtime/comm/communicator.h"
#include "swap/io_backend.h"
#include "tiers/device.h"
#include "runtime/engine/offload_unit.h"
#include "tiers/tier.h"
#include "tiers/tier_manager.h"

namespace strata::runtime {

struct EngineOptions {
  Home params = Home::kDevice;     // offload_param.device
  Home optimizer = Home::kDevice;  // offload_optimizer.device
  std::string param_nvme_path;
  std::string optimizer_nvme_path;
  cpu_optimizer::OptimizerOptions optimizer_options;
  uint64_t sub_group_size = 1'000'000'000;       // elements per optimizer sub-group
  uint64_t prefetch_bucket_size = 50'000'000;    // elements gathered ahead of use
  uint64_t max_live_parameters = 1'000'000'000;  // elements gathered on the device at once
  uint64_t persistence_threshold = 100'000;      // unit params this small stay on the device
  int param_buffer_count = 5;                    // pinned slots for NVMe parameters
  bool pipeline = true;                          // read(g+1) ∥ step(g) ∥ write(g-1)
  double gradient_clipping = 0;
  int gradient_accumulation_steps = 1;
  // Learning rate for the step after `steps_taken` completed steps; null: optimizer.lr.
  std::function<double(int64_t steps_taken)> lr_at;
  std::string io_backend = "auto";
  IoOptions io;
  bool pin_memory = true;      // mlock the host arena
  uint64_t pinned_bytes = 0;   // host arena size; 0: sized from the model
  DeviceBackend* device = nullptr;  // null: a HostDevice owned by the engine
  uint64_t device_budget = 0;       // for the owned HostDevice; 0: everything fits
  torch::Device torch_device = torch::kCPU;
  // bf16 mixed precision: parameters (device copies, NVMe/host blocks) and gradients in bf16,
  // fp32 master weights, moments and gradient accumulation with the optimizer. No loss scaling.
  bool bf16 = false;
  bool keep_swap_files = false;
  // Data-parallel ranks; null: a single-rank communicator. Only world size 1 is implemented: the
  // engine calls it where ranks meet (the global gradient norm) so more ranks need no redesign.
  std::shared_ptr<Communicator> communicator;
  // Called with a unit's index just before the engine reads that unit's initial values (models
  // built with deferred initialization, e.g. GptOptions::deferred_init).
  std::function<void(int unit)> initialize_unit;
};

struct StepTimes {
  double optimizer_seconds = 0;    // Step(): from the first read to the last write
  double grad_wait_seconds = 0;    // Backward(): waiting for gradient hand-off to finish
  double gather_wait_seconds = 0;  // forward+backward: waiting for parameters to arrive
};

class Engine final : public strata::UnitHooks {
 public:
  static Result<std::unique_ptr<Engine>> Create(std::shared_ptr<torch::nn::Module> model,
                                                EngineOptions options);
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Backpropagates loss / gradient_accumulation_steps and hands every gradient off.
  Status Backward(const torch::Tensor& loss);
  // At an accumulation boundary: clip, update every parameter, advance the step; else a no-op.
  Status Step();

  bool IsAccumulationBoundary() const;
  int64_t global_steps() const { return global_steps_; }
  int64_t micro_steps() const { return micro_steps_; }
  double learning_rate() const;
  double last_grad_norm() const { return last_grad_norm_; }
  const StepTimes& times() const { return times_; }
  TierTelemetry telemetry() const;
  const EngineOptions& options() const { return options_; }
  bool offloaded() const { return offload_; }
  uint64_t pinned_arena_bytes() const;
  // Tier occupancy now: bytes in use on the device (its budget) and in the pinned arena.
  struct Occupancy {
    uint64_t device_used = 0, device_budget = 0, pinned_used = 0, pinned_capacity = 0;
  };
  Occupancy occupancy() const;

  // Benchmarks (`strata bench step`): the I/O of one recorded forward+backward pass, and of one
  // optimizer step, without the compute. They leave gradients and parameters unspecified: use
  // them on an engine that will be discarded.
  Status ReplayPassIo();
  Status ReplayOptimizerIo();
  uint64_t optimizer_elements() const;         // elements the CPU optimizer updates per step
  uint64_t largest_subgroup_elements() const;

  // Checkpoints (runtime/checkpoint_store.h). SaveState writes "engine.json" (layout, steps),
  // "params/<group>.bin" (each group's flat fp32 parameters) and "state/<group>/<begin>.bin"
  // (each sub-group's fp32 master and moments), streaming one block at a time; in no-offload mode
  // the parameters and the torch::optim state. LoadState verifies every checksum, checks the
  // layout against this engine's model (names, shapes, sub-groups, optimizer) and every entry's
  // size before reading it, then puts the values back in every tier. REQUIRES: between steps
  // (after Step, before the next forward), gradients not accumulated.
  Status SaveState(CheckpointWriter& writer);
  Status LoadState(const CheckpointReader& reader);
  // Every trainable parameter as fp32 in one safetensors file (what DeepSpeed's zero_to_fp32
  // produces), names as the model names them, streamed group by group.
  Status ExportSafetensors(const std::string& path,
                           const std::map<std::string, std::string>& metadata = {});

  // Every trainable parameter's current value as fp32 on the CPU, in the model's order.
  Result<std::vector<std::pair<std::string, torch::Tensor>>> ParameterValues();

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

  struct Impl;

 private:
  Engine(std::shared_ptr<torch::nn::Module> model, EngineOptions options);
  Status Init();
  Status InitOffload();
  Status StepNoOffload(double lr);
  Status MakeTorchOptimizer(double lr);
  // The micro-batch being backpropagated now is the last of its accumulation window.
  bool NextMicroStepIsBoundary() const;
  nlohmann::json LayoutJson() const;
  Status StepOffload(double lr);

  std::shared_ptr<torch::nn::Module> model_;
  EngineOptions options_;
  bool offload_ = false;
  int64_t global_steps_ = 0;
  int64_t micro_steps_ = 0;
  double last_grad_norm_ = 0;
  StepTimes times_;
  std::unique_ptr<torch::optim::Optimizer> torch_optim_;  // no-offload mode
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::runtime
