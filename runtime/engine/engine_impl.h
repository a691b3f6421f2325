// Engine::Impl: the parts of an offloading engine, in construction order (destroyed in reverse:
// pipelines stop their workers before the store's blocks and arena go). Internal to engine/.
#pragma once

#include <memory>
#include <optional>

#include "cpu_optimizer/optimizer.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_layout.h"
#include "runtime/engine/grad_pipeline.h"
#include "runtime/engine/optimizer_pipeline.h"
#include "runtime/engine/param_coordinator.h"
#include "runtime/engine/state_store.h"

namespace strata::runtime {

struct Engine::Impl {
  cpu_optimizer::OptimizerType opt_type{};
  std::optional<cpu_optimizer::CpuOptimizer> cpu_opt;
  EngineLayout layout;
  BlockSizes sizes;
  std::unique_ptr<StateStore> store;
  std::unique_ptr<ParamCoordinator> coordinator;
  std::unique_ptr<GradPipeline> grads;
  std::unique_ptr<OptimizerPipeline> optimizer;

  ~Impl() {
    optimizer.reset();
    grads.reset();
    coordinator.reset();
    store.reset();
  }
};

}  // namespace strata::runtime
