#include "runtime/engine/initialize.h"

#include <algorithm>
#include <limits>

#include "runtime/numerics/lr_schedule.h"
#include "runtime/plan/model_spec.h"
#include "runtime/plan/placement.h"

namespace strata::runtime {

Result<EngineOptions> EngineOptionsFromConfig(const Config& config,
                                              const InitializeOptions& options) {
  if (config.fp16.enabled && config.bf16.enabled) {
    return InvalidArgumentError("fp16.enabled and bf16.enabled: choose one precision");
  }
  EngineOptions e;
  const ZeroConfig& z = config.zero;
  e.precision = config.fp16.enabled   ? DType::kFloat16
                : config.bf16.enabled ? DType::kBFloat16
                                      : DType::kFloat32;
  e.fp16 = config.fp16;
  if (config.bf16.enabled && config.bf16.optimizer_states) e.moment_dtype = DType::kBFloat16;
  e.params = z.offload_param.device;  // config and engine share tiers/tier.h's Home
  // Where strata can run the optimizer for this layout (the same mapping `strata estimate` plans).
  e.device_masters = !options.torch_device.is_cpu();
  e.inference = options.inference;
  if (options.inference) {
    e.optimizer = Home::kDevice;  // none (EngineOptions::inference); the config's is not used
  } else {
    const OptimizerPlacement placed = PlaceOptimizer(e.params, z.offload_optimizer.device,
                                                     DTypeName(e.precision), e.device_masters);
    e.optimizer = placed.home;
    if (!placed.warning.empty()) e.warnings.push_back(placed.warning);
  }
  e.param_nvme_path = z.offload_param.nvme_path;
  e.optimizer_nvme_path = z.offload_optimizer.nvme_path;
  e.optimizer_options = config.optimizer.value_or(cpu_optimizer::OptimizerOptions{});
  e.optimizer_options.threads = options.optimizer_threads;
  e.sub_group_size = static_cast<uint64_t>(z.sub_group_size);
  e.prefetch_bucket_size = static_cast<uint64_t>(z.prefetch_bucket_size);
  e.max_live_parameters = static_cast<uint64_t>(z.max_live_parameters);
  e.persistence_threshold = static_cast<uint64_t>(z.param_persistence_threshold);
  // The offload buffers as `strata estimate` plans them (model_spec.h's one reading of the keys).
  const PlanSettings plan = PlanSettingsFor(config);
  e.param_buffer_count = plan.param_buffer_count;
  e.param_buffer_size = plan.param_buffer_size;
  e.param_max_in_cpu = plan.max_in_cpu;
  e.optimizer_buffer_count = plan.optimizer_buffer_count;
  e.pipeline = plan.pipeline;
  e.gradient_clipping = config.gradient_clipping;
  e.gradient_accumulation_steps = static_cast<int>(config.gradient_accumulation_steps);
  if (e.gradient_accumulation_steps < 1) e.gradient_accumulation_steps = 1;
  if (config.scheduler) {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<LrSchedule> schedule,
                            MakeLrSchedule(*config.scheduler, e.optimizer_options.lr));
    std::shared_ptr<LrSchedule> shared(std::move(schedule));
    e.lr_at = [shared](int64_t steps_taken) { return shared->LearningRate(steps_taken); };
  }
  e.io_backend = options.io_backend;
  e.io.block_size = static_cast<uint64_t>(config.aio.block_size);
  e.io.queue_depth = static_cast<uint32_t>(config.aio.queue_depth);
  e.io.intra_op_parallelism = static_cast<uint32_t>(config.aio.intra_op_parallelism);
  e.io.single_submit = config.aio.single_submit;
  e.io.overlap_events = config.aio.overlap_events;
  e.pin_memory = z.offload_param.pin_memory || z.offload_optimizer.pin_memory;
  e.pinned_bytes = options.pinned_bytes;
  e.host_memory_budget = options.host_memory_budget;
  e.host_memory_source = options.host_memory_source;
  e.host_cache_budget = options.host_cache_budget;
  e.host_process_reserve = options.host_process_reserve;
  e.device = options.device;
  e.device_budget = options.device_budget;
  e.torch_device = options.torch_device;
  e.keep_swap_files = options.keep_swap_files;
  e.swap_signal_handlers = options.swap_signal_handlers;
  e.nan_gradient = options.nan_gradient;
  e.step_without_gradient = options.step_without_gradient;
  e.swap_checksums = config.strata.swap_checksums;
  e.communicator = options.communicator;
  e.grad_communicator = options.grad_communicator;
  e.gather_communicator = options.gather_communicator;
  e.initialize_unit = options.initialize_unit;
  return e;
}

Result<std::unique_ptr<Engine>> Initialize(std::shared_ptr<torch::nn::Module> model,
                                           const Config& config, const InitializeOptions& options) {
  STRATA_ASSIGN_OR_RETURN(EngineOptions e, EngineOptionsFromConfig(config, options));
  return Engine::Create(std::move(model), std::move(e));
}

}  // namespace strata::runtime
