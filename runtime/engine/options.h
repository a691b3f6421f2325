// EngineOptions: everything the engine is told (runtime::Initialize fills it from a DeepSpeed
// config; tests and benchmarks fill it directly), and StepTimes, what it reports per step.
//
// `sub_group_size` lives here and in Config only: the layout (engine_layout.h) cuts groups with it
// once, and everything else (memory plan, state store, optimizer pipeline) reads that layout.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "cpu_optimizer/optimizer.h"
#include "runtime/comm/communicator.h"
#include "runtime/engine/test_hooks.h"
#include "runtime/numerics/loss_scaler.h"
#include "runtime/plan/memory_plan.h"
#include "swap/io_backend.h"
#include "tiers/device.h"
#include "tiers/tier.h"

namespace strata::runtime {

// The engine's precision is a base/dtype.h DType: the type of the parameters' copies and of the
// gradient hand-off (DTypeBytes per element; DTypeName is the spelling of checkpoints and of
// plan/placement.h). In bf16 and fp16 the optimizer keeps fp32 master weights, moments and fp32
// gradient accumulation.

struct EngineOptions {
  Home params = Home::kDevice;     // offload_param.device
  Home optimizer = Home::kDevice;  // offload_optimizer.device
  // Inference (DeepSpeed's ZeRO-Inference; `strata eval`, `strata generate`): the parameters only,
  // at `params` (paged unit by unit with prefetch when offloaded, as training's forward), with no
  // gradient buffers, no optimizer state, no optimizer swap files and no optimizer staging: the
  // optimizer settings are ignored (Create sets `optimizer` to kDevice, "nothing offloaded").
  // Backward, Step, SaveState and LoadState are refused (kFailedPrecondition); VisitParameters,
  // ParameterValues and ExportSafetensors give the parameters' values widened to fp32.
  bool inference = false;
  std::string param_nvme_path;
  std::string optimizer_nvme_path;
  cpu_optimizer::OptimizerOptions optimizer_options;
  uint64_t sub_group_size = 1'000'000'000;       // elements per optimizer sub-group
  uint64_t prefetch_bucket_size = 50'000'000;    // elements gathered ahead of use
  uint64_t max_live_parameters = 1'000'000'000;  // elements gathered on the device at once
  uint64_t persistence_threshold = 100'000;      // unit params this small stay on the device
  int param_buffer_count = 5;                    // pinned slots for NVMe parameters
  // Conditional units (experts under --page-experts) with NVMe homes: read into pinned memory
  // ahead of their layer's routing when announced at the same place in each of the last this many
  // passes (param_coordinator.h's history rule); 0: never ahead of the routing.
  int speculation_passes = 4;
  // offload_param.buffer_size (elements; 0: not given): a slot must hold the largest NVMe unit.
  uint64_t param_buffer_size = 0;
  // offload_param.max_in_cpu (elements): with params on NVMe, the leading units whose elements sum
  // to at most this keep their parameters in pinned host memory (plan's UnitsInCpu).
  uint64_t param_max_in_cpu = 0;
  // offload_optimizer.buffer_count: DeepSpeed's count of pinned swap tensors (a sub-group swaps
  // master, moments and gradient); the pools hold the pipeline's 3 sub-groups or more.
  int optimizer_buffer_count = 4;
  bool pipeline = true;  // read(g+1) ∥ step(g) ∥ write(g-1)
  double gradient_clipping = 0;
  int gradient_accumulation_steps = 1;
  // Learning rate for the step after `steps_taken` completed steps; null: optimizer.lr.
  std::function<double(int64_t steps_taken)> lr_at;
  std::string io_backend = "auto";
  IoOptions io;
  bool pin_memory = true;     // mlock the host arena
  uint64_t pinned_bytes = 0;  // host arena size; 0: sized from the model
  // The host budget (memory_plan.h HostBeside): the most host memory the run may take, the
  // pinned arena, the host-RAM tier and what is beside them together; 0: no limit but the host's.
  // A plan whose arena and beside need more is refused (kInvalidArgument) naming
  // `host_memory_source`, the need, its parts and the budget.
  uint64_t host_memory_budget = 0;
  std::string host_memory_source = "the host memory budget";
  // The host-RAM tier (memory_plan.h SplitHostCache): the host budget that sizes it; what the
  // arena and beside leave of it keeps gradient accumulators, then units' parameters, then
  // optimizer state in RAM instead of on NVMe. 0: no tier (every such block on NVMe). The engine
  // sets host_cache_bytes from it (HostCacheBytesFor) before placing groups.
  uint64_t host_cache_budget = 0;
  uint64_t host_cache_bytes = 0;
  // What the budgets keep for the process itself (kHostProcessReserve for strata's commands; 0:
  // nothing). The engine sets host_beside from it and the device (budget or not, so it can be
  // reported): on the host-emulated device (DeviceInfo::host_addressable) the device's budget is
  // host memory too.
  uint64_t host_process_reserve = 0;
  HostBeside host_beside;
  DeviceBackend* device = nullptr;  // null: a HostDevice owned by the engine
  uint64_t device_budget = 0;       // for the owned HostDevice; 0: everything fits
  torch::Device torch_device = torch::kCPU;
  // bf16 without offload keeps fp32 master weights on the device and steps them with torch::optim
  // (plan/placement.h), where the device can hold them: set for a GPU by EngineOptionsFromConfig.
  bool device_masters = false;
  // On a GPU: the stream libtorch computes on, which the caller made libtorch's current stream
  // (TorchStreamGuard) and shares between engines used on one thread; null: the engine makes its
  // own and installs it. Not owned; must outlive the engine.
  Stream* compute_stream = nullptr;
  // Mixed precision: parameters (device copies, NVMe/host blocks) and gradients in bf16 or fp16,
  // fp32 master weights, moments and gradient accumulation with the optimizer. fp16 adds dynamic
  // loss scaling (`fp16`). On the host-emulated device (torch_device CPU) libtorch cannot compute
  // in fp16: there the parameter tensors are fp32 holding the fp16 values and gradients are rounded
  // to fp16 at the hand-off (engine.h).
  DType precision = DType::kFloat32;
  // The optimizer's moments: fp32, or bf16 (bf16.bf16_optimizer_states; precision bf16 and the
  // optimizer offloaded: torch::optim has no bf16 moments). Masters stay fp32 either way.
  DType moment_dtype = DType::kFloat32;
  // Offloaded units' optimizer updates run in the background after Step returns, in unit order,
  // and the next forward waits for each unit's update before gathering it (the disk reads the
  // next units' state while the model computes). Bitwise the same results; false: Step returns
  // when every update is done (OptimizerPipeline::Start).
  bool defer_optimizer = true;
  // DeepSpeed's "fp16" section: the loss scaler's settings (read when precision is kFp16).
  Fp16Config fp16;
  bool keep_swap_files = false;
  // The swap spaces install their own SIGINT/SIGTERM handlers (remove the files, then re-raise).
  // false when the caller handles the signals itself and removes the files on a second one
  // (swap_space.h RemoveSwapFilesForSignal), as `strata train` does from its start.
  bool swap_signal_handlers = true;
  // Checksum every swap block written to NVMe and verify it on every read (strata.swap_checksums;
  // TierManagerOptions::verify_checksums).
  bool swap_checksums = true;
  // On the host-emulated device (a CPU torch_device), the cap of the process-wide cache of large
  // freed CPU tensors (host_tensor_cache.h) that the engine installs in place of libtorch's CPU
  // allocator at Init (a 1.3B step's recurring activation and gradient shapes take ~0.5 GiB;
  // blocks freed beyond the cap go back to the system). 0: the engine leaves the process's
  // allocator alone (an embedder that owns it, or installs HostTensorCache itself). Installed
  // once per process; the first cap wins.
  uint64_t host_tensor_cache_bytes = uint64_t{1} << 30;
  // A test's fault (test_hooks.h, STRATA_NAN_GRADIENT): a NaN in the gradients of the parameters
  // it names at its step, with a warning at Create. Unset: none.
  std::optional<NanGradientHook> nan_gradient;
  // Data-parallel ranks; null: a single-rank communicator. Used by the training thread (gathers,
  // the global norm, the all-gather of updated device-home blocks, checkpoints). With world > 1
  // every group is partitioned over the ranks (engine_layout.h) in offload modes; without offload
  // the model is replicated and its gradients all-reduced (DDP).
  std::shared_ptr<Communicator> communicator;
  // The gradient hand-off's process group (its worker thread reduce-scatters beside the training
  // thread's collectives); required when world > 1 with offload, same ranks as `communicator`.
  std::shared_ptr<Communicator> grad_communicator;
  // The ahead all-gathers' process group (param_coordinator.h); null: gathers all-gather on the
  // training thread only.
  std::shared_ptr<Communicator> gather_communicator;
  // Parameters that got no gradient in a step's window (an expert no token was routed to) are
  // stepped with a zero gradient, so momentum and weight decay still move them, as torch.optim
  // moves a parameter whose .grad holds zeros: strata's own models (the trainer,
  // strata.from_pretrained), because transformers 5 keeps a sparse MLP's experts in one fused
  // tensor that gets a gradient every step. false: skipped, as torch.optim skips a parameter whose
  // .grad is None (a Python model's, strata.initialize).
  bool step_without_gradient = false;
  // Called once per unit with its index just before the engine reads that unit's initial values,
  // in every mode (models built with deferred initialization: values from a seeded generator or
  // a checkpoint's shards, written into the unit's parameter tensors). A failure (e.g. an
  // unreadable shard) ends Engine::Create with that Status. Called with grad mode off.
  std::function<Status(int unit)> initialize_unit;
  // Out: how this run's layout differs from what DeepSpeed would do with the same config (e.g.
  // the optimizer moved to pinned host memory, plan/placement.h). Filled by
  // EngineOptionsFromConfig and Engine::Create; the caller shows them (the Trainer logs them).
  std::vector<std::string> warnings;
};

struct StepTimes {
  double optimizer_seconds = 0;    // Step(): from the first read to the last write
  double grad_wait_seconds = 0;    // Backward(): waiting for gradient hand-off to finish
  double gather_wait_seconds = 0;  // forward+backward: waiting for parameters to arrive
  // forward+backward: waiting for the previous step's deferred optimizer updates (part of that
  // step's optimizer work, done while this step computes; EngineOptions::defer_optimizer).
  double optimizer_wait_seconds = 0;
};

}  // namespace strata::runtime
