// OptimizerPipeline: one optimizer step over the sub-groups that received gradients
// (ARCHITECTURE.md §3): read(g+1..g+a) ∥ CPU optimizer(g) ∥ write(g-1), where a = the state pool's
// slots - 2 (at least 1).
//
//   read     the TierManager prefetches the next sub-group's state and gradient blocks (NVMe);
//   compute  the fused CPU optimizer updates the state block in place, with the clip coefficient
//            (and fp16's 1/loss scale) folded into its gradient multiplier, and writes the updated
//            parameters in the compute dtype (bf16/fp16 copy-out fused into the same pass)
//            straight into the pinned copy of the group's block (cpu/NVMe homes) or into a pinned
//            staging slot followed by an asynchronous host-to-device copy (device homes);
//   write    the write-behind worker starts the NVMe writes of the state block (and, per group,
//            the parameter block of NVMe homes) while the next sub-group computes; the writes
//            complete asynchronously (TierManager::FlushAsync) and Run collects them at the end.
// Run returns when every write has landed and every device copy is done.
//
// Threads: Run on the training thread; flushes on the write-behind worker.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "base/worker.h"
#include "cpu_optimizer/optimizer.h"
#include "runtime/engine/grad_pipeline.h"
#include "runtime/engine/layout.h"
#include "runtime/engine/options.h"
#include "runtime/engine/state_store.h"

namespace strata::runtime {

class OptimizerPipeline {
 public:
  // Takes two update staging slots of the largest sub-group from the store's arena.
  static Result<std::unique_ptr<OptimizerPipeline>> Create(const EngineOptions& options,
                                                           const EngineLayout& layout,
                                                           StateStore& store, GradPipeline& grads,
                                                           const cpu_optimizer::CpuOptimizer& cpu,
                                                           cpu_optimizer::OptimizerType type);
  ~OptimizerPipeline();

  // Steps every sub-group with gradients (1-based `step`, gradient multiplier `grad_scale`).
  // compute=false (benchmarks): the same reads and writes without the update arithmetic.
  // REQUIRES: gradients drained.
  [[nodiscard]] Status Run(int64_t step, double grad_scale, double lr, bool compute = true);

  uint64_t elements() const;  // elements the optimizer updates per step

  // Starts reading, into the state pool's free slots, the state of the sub-groups the next Run
  // steps first (optimizer on NVMe): called as backward begins, so the disk reads them while the
  // model computes instead of during the optimizer phase. Best effort; no-op otherwise.
  void PrefetchFirstStates();

 private:
  OptimizerPipeline(const EngineOptions& options, const EngineLayout& layout, StateStore& store,
                    GradPipeline& grads, const cpu_optimizer::CpuOptimizer& cpu,
                    cpu_optimizer::OptimizerType type)
      : opt_(options), layout_(layout), store_(store), grads_(grads), cpu_(cpu), type_(type) {}
  // Hands `pins` to the write-behind worker: each block is flushed (if it has an NVMe home),
  // then released.
  void WriteBehind(std::vector<Pin> pins);
  void FinishGroupUpdate(Pin& pin);
  size_t PoolSlots() const;  // slots of the state pool (0 without one)

  const EngineOptions& opt_;
  const EngineLayout& layout_;
  StateStore& store_;
  GradPipeline& grads_;
  const cpu_optimizer::CpuOptimizer& cpu_;
  const cpu_optimizer::OptimizerType type_;
  // Sub-groups ahead whose blocks the eviction policy is told about.
  static constexpr size_t kPolicyWindow = 8;
  std::vector<BlockId> written_;  // blocks whose write-back started this step; writer's, then Run's
  std::vector<PinnedBuffer> update_staging_;
  std::vector<Event> update_staging_done_;
  std::unique_ptr<Worker> writer_;  // last: its jobs use the store
};

}  // namespace strata::runtime
