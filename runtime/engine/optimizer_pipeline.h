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
// Deferred step (Start with defer, the engine's default): the sub-groups of device-home groups
// are stepped before Start returns; those of offloaded groups (cpu/NVMe homes) are stepped on a
// worker in group order, started by the first wait for them (so all of a step's optimizer I/O
// falls between the next step's first gather and its backward): the next forward gathers unit u
// after WaitGroup(u), so the disk reads the next units' state while the model computes, and a
// unit's updated pinned copy is what its gather copies to the device (fp32 master_in_params: one
// read of the block serves both). Every sub-group's update is the one Run computes (same arguments,
// same arithmetic; only when it happens changes), so results are bitwise unchanged.
//
// Parameters without gradients (an expert no token was routed to in any micro-batch of the step,
// on any rank) are skipped as torch.optim skips a parameter whose .grad is None: no moment decay,
// no weight decay, and their own step count does not advance, so their bias correction uses
// their own count (the step less the applied steps they were skipped in, kept per parameter and
// saved in checkpoints). Their parameter copies keep their values.
// With EngineOptions::step_without_gradient (strata's own models) nothing is skipped: such a
// parameter steps on a zero gradient (momentum and weight decay move it), and a sub-group no
// hand-off reached (an expert under --page-experts that got no token) steps on zeros (StepSpan)
// without its gradient block being read or written.
//
// Threads: Run, Start and Finish on the training thread; Pending and WaitGroup from any thread
// (the coordinator's gather and its ahead all-gather worker); the deferred part on `ahead_`;
// flushes on the write-behind worker.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/worker.h"
#include "cpu_optimizer/optimizer.h"
#include "runtime/engine/engine_layout.h"
#include "runtime/engine/grad_pipeline.h"
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
  // Waits for the previous deferred part (Finish), steps the device-home sub-groups and, with
  // `defer`, hands the others to the worker (else steps them too). Returns the first error of
  // what it ran; the deferred part's errors come from Finish and WaitGroup.
  [[nodiscard]] Status Start(int64_t step, double grad_scale, double lr, bool compute, bool defer);
  // Waits until the deferred part has run; its error (once), Ok if none or nothing deferred.
  [[nodiscard]] Status Finish() EXCLUDES(mu_);
  // Whether group g is updated by a deferred part that has not reached it yet.
  bool Pending(int g) const EXCLUDES(mu_);
  // Waits until group g's update (if deferred) is done: its pinned/home copy holds the new
  // values. The deferred part's error if it failed (the group may not be updated then).
  [[nodiscard]] Status WaitGroup(int g) EXCLUDES(mu_);

  uint64_t elements() const;  // elements the optimizer updates per step

  // Per parameter of group g (ParamSlot order): the applied steps it was skipped in. REQUIRES:
  // no deferred part running (after Finish). Set from a checkpoint by set_skipped_steps.
  const std::vector<int64_t>& skipped_steps(int g) const { return skips_[g]; }
  // Whether the last Start updates group g: some parameter of it had a gradient (on some rank).
  // REQUIRES: on the training thread.
  bool Updates(int g) const;
  // Whether some parameter of group g had a gradient (on some rank) at the last Start: the units
  // the step's tokens reached. REQUIRES: on the training thread.
  bool HadGradient(int g) const { return had_gradient_[g] != 0; }
  void set_skipped_steps(int g, std::vector<int64_t> skips) { skips_[g] = std::move(skips); }

  // Called on the deferred worker as soon as an NVMe-home group's update is final in its pinned
  // copy, before the forward may gather it (GroupDone): the coordinator copies it on to the device
  // while the parameter pool still holds it (ParamCoordinator::Updated). Set once, before use.
  void set_on_updated(std::function<void(int g)> on_updated) {
    on_updated_ = std::move(on_updated);
  }

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
  // Group g's update is written (MarkDirty); deferred, on_updated_ hears of it; NVMe homes are
  // handed to the write-behind worker.
  void FinishGroupUpdate(Pin& pin, int g, bool deferred);
  // Steps the sub-groups `order` (indices, ascending) and collects their writes. `deferred`:
  // the forward runs meanwhile and gathers each group right after its update.
  Status StepSubGroups(const std::vector<int>& order, const cpu_optimizer::StepArgs& args,
                       bool compute, bool deferred);
  // Steps sub-group si's span `fs` parameter by parameter: each run of parameters with the same
  // own step count in one call, skipped ones left alone (their 16-bit copy rewritten from the
  // master when `fs` copies out, since the copy-out block is rewritten whole).
  Status StepByParameter(int si, const cpu_optimizer::FlatSpan& fs,
                         const cpu_optimizer::StepArgs& args) const;
  // cpu_.Step of `fs`, whose null grads mean a zero gradient.
  Status StepSpan(const cpu_optimizer::FlatSpan& fs, const cpu_optimizer::StepArgs& args) const;
  static constexpr uint64_t kZeroChunk = uint64_t{1} << 18;  // elements per call on zeros
  void GroupDone(int g) EXCLUDES(mu_);  // group g's update is complete: wakes its waiters
  void Kick() EXCLUDES(mu_);            // hands a queued deferred part to the worker (once)
  size_t PoolSlots() const;             // slots of the state pool (0 without one)
  // Whether sub-group si is stepped: it had a hand-off, or step_without_gradient.
  bool Steps(int si) const;

  const EngineOptions& opt_;
  const EngineLayout& layout_;
  StateStore& store_;
  GradPipeline& grads_;
  const cpu_optimizer::CpuOptimizer& cpu_;
  const cpu_optimizer::OptimizerType type_;
  // Sub-groups ahead whose blocks the eviction policy is told about.
  static constexpr size_t kPolicyWindow = 8;
  std::vector<BlockId> written_;  // blocks whose write-back started this step; writer's, then Run's
  // Per group, per parameter: applied steps skipped (see the file comment), and whether the step
  // in progress updates it (GradPipeline::received at Start, OR-ed over ranks). Written by Start
  // on the training thread before the deferred part is queued; read by StepSubGroups.
  std::vector<std::vector<int64_t>> skips_;
  std::vector<std::vector<uint8_t>> stepping_;
  std::vector<uint8_t> had_gradient_;  // per group, at the last Start (training thread)
  std::vector<PinnedBuffer> update_staging_;
  std::vector<Event> update_staging_done_;
  std::function<void(int g)> on_updated_;  // set before use; called on the deferred worker
  // This client's window of upcoming uses in the store's FutureUsePolicy (the parameter
  // coordinator has its own): set per sub-group by StepSubGroups on the thread stepping them,
  // emptied when they are done.
  FutureUsePolicy::Window policy_window_ = FutureUsePolicy::kDefaultWindow;
  mutable Mutex mu_;
  CondVar cv_;
  std::vector<uint8_t> pending_ GUARDED_BY(mu_);  // per group
  bool deferred_running_ GUARDED_BY(mu_) = false;
  Status deferred_error_ GUARDED_BY(mu_);
  std::function<Status()> queued_ GUARDED_BY(mu_);  // the deferred part, until the first wait
  std::unique_ptr<Worker> writer_;                  // its jobs use the store
  std::unique_ptr<Worker> ahead_;  // last: runs the deferred part, which uses all of the above
};

}  // namespace strata::runtime
