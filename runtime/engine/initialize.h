// strata::Initialize: builds an Engine for a model from a DeepSpeed config
// (runtime/config/config.h).
//
//   auto config = runtime::LoadConfigFile("ds_config.json").value();
//   auto engine = runtime::Initialize(model, config).value();
//
// The config decides the mode (offload_param / offload_optimizer devices and nvme paths), the
// optimizer and its schedule, clipping, gradient accumulation, sub-groups, prefetch budgets and the
// aio settings, the precision (fp32, bf16, fp16 with its loss scaler). What a DeepSpeed config
// cannot say (which device computes, its memory budget, the host arena size) comes from
// InitializeOptions. Where strata places state differently from DeepSpeed (offload_optimizer none
// with offloaded parameters or 16-bit precision: the optimizer runs on the CPU, plan/placement.h),
// EngineOptions::warnings says so; the caller shows it.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "runtime/config/config.h"
#include "runtime/engine/engine.h"

namespace strata::runtime {

struct InitializeOptions {
  // EngineOptions::inference: the parameters only (the config's offload_param), no gradients, no
  // optimizer state; the config's optimizer, scheduler and offload_optimizer are not used.
  bool inference = false;
  DeviceBackend* device = nullptr;  // null: host emulation (HostDevice) owned by the engine
  uint64_t device_budget = 0;       // HostDevice budget; 0: everything fits
  torch::Device torch_device = torch::kCPU;
  uint64_t pinned_bytes = 0;        // 0: sized from the model
  uint64_t host_memory_budget = 0;  // EngineOptions::host_memory_budget (0: no limit)
  // What sets host_memory_budget, named in errors (the trainer: "--host-memory").
  std::string host_memory_source = "the host memory budget";
  uint64_t host_cache_budget = 0;     // EngineOptions::host_cache_budget (0: no host-RAM tier)
  uint64_t host_process_reserve = 0;  // EngineOptions::host_process_reserve
  std::string io_backend = "auto";    // auto|uring|aio|posix
  bool keep_swap_files = false;
  bool swap_signal_handlers = true;                 // EngineOptions::swap_signal_handlers
  int optimizer_threads = 0;                        // 0: every core this process may use
  std::function<Status(int unit)> initialize_unit;  // see EngineOptions::initialize_unit
  std::optional<NanGradientHook> nan_gradient;      // EngineOptions::nan_gradient (a test's)
  bool step_without_gradient = false;               // EngineOptions::step_without_gradient
  // Data-parallel ranks (EngineOptions::communicator, grad_communicator); null: one rank.
  std::shared_ptr<Communicator> communicator;
  std::shared_ptr<Communicator> grad_communicator;
  std::shared_ptr<Communicator> gather_communicator;
};

Result<EngineOptions> EngineOptionsFromConfig(const Config& config,
                                              const InitializeOptions& options = {});

Result<std::unique_ptr<Engine>> Initialize(std::shared_ptr<torch::nn::Module> model,
                                           const Config& config,
                                           const InitializeOptions& options = {});

}  // namespace strata::runtime
