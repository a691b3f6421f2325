// GradPipeline: moves each unit's gradients off the device as soon as its backward ends and
// accumulates them in fp32 at the optimizer's home (ARCHITECTURE.md §3).
//
// Submit queues device -> pinned copies of a group's gradients into one of two staging slots (so
// the next unit's backward overlaps the hand-off) and hands them to the hand-off worker, which adds
// them into each sub-group's fp32 gradient block (overwrite on the first micro-batch; bf16/fp16
// widened exactly), computes the sub-group's sum of squares at the accumulation boundary, and
// starts the block's write to NVMe when the optimizer lives there (without waiting for it). The sum
// of squares doubles as fp16's overflow check: it is inf or NaN exactly when some accumulated
// gradient is (squares of finite fp32 values cannot overflow a double), so no second pass over the
// gradients is needed.
//
// Data-parallel ranks (engine_layout.h): the worker first reduce-scatters the group's gradients
// (summed over ranks through EngineOptions::grad_communicator, a process group of its own since it
// runs beside the training thread's collectives) and accumulates this rank's slice only.
//
// Threads: Submit and Drain on the training thread; accumulation on the worker. The accumulators
// (per-sub-group counters micro_batches and sumsq, and the gradient blocks) are the worker's during
// backward; the training thread reads them only after Drain, and the optimizer resets them at the
// step, on the training thread or on its deferred worker (engine.h, "Threads": one writer at a
// time, each hand-off through a lock). Submit throws through the TorchBoundary (it runs inside
// backward).
#pragma once

#include <memory>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/worker.h"
#include "runtime/engine/engine_layout.h"
#include "runtime/engine/offload_unit.h"
#include "runtime/engine/options.h"
#include "runtime/engine/state_store.h"

namespace strata::runtime {

class GradPipeline {
 public:
  // Takes two staging slots of the largest group from the store's arena.
  static Result<std::unique_ptr<GradPipeline>> Create(const EngineOptions& options,
                                                      const EngineLayout& layout, StateStore& store,
                                                      TorchBoundary& boundary);
  ~GradPipeline();

  // Group gi's gradients (aligned with its params; an undefined one counts as zeros).
  // `boundary`: the last micro-batch of the accumulation window.
  void Submit(int gi, std::vector<torch::Tensor> grads, bool boundary);
  // Every submitted hand-off is done and its NVMe writes have landed; the first error.
  [[nodiscard]] Status Drain();

  // Sub-group si: micro-batches accumulated since the last step, and the sum of squares of the
  // accumulated gradient at the boundary. REQUIRES: after Drain.
  int micro_batches(int si) const { return accum_[si].micro_batches; }
  // Sum over sub-groups with gradients, in sub-group order (deterministic).
  double SumOfSquares() const;
  // The first sub-group with gradients whose sum of squares is inf or NaN, or -1.
  int FirstNonFiniteSubgroup() const;
  // Computes the sum of squares of every sub-group with gradients whose last hand-off was not at
  // the accumulation boundary: a unit that ran in earlier micro-batches of the window but not in
  // its last one (a Python model's conditional or skipped module). REQUIRES: after Drain, on the
  // training thread (the step's owner of the accumulators).
  [[nodiscard]] Status RefreshSums();
  // After the optimizer consumed sub-group si (or a checkpoint was loaded). REQUIRES: after Drain,
  // on the thread that owns the accumulators in this phase (engine.h, "Threads").
  void Reset(int si) { accum_[si].micro_batches = 0; }

  // Per parameter of group g (its ParamSlot order): 1 if some micro-batch of the window handed
  // it a gradient, 0 if every hand-off had none (an expert no token was routed to, a parameter
  // outside the graph). The optimizer skips those, as torch.optim skips a parameter without
  // .grad. Written by Submit on the training thread; read and cleared (ClearReceived) there.
  const std::vector<uint8_t>& received(int g) const { return received_[g]; }
  void ClearReceived();

 private:
  struct Accum {
    int micro_batches = 0;
    double sumsq = 0;
    bool sumsq_current = false;  // sumsq covers every micro-batch accumulated so far
  };
  struct Job {
    int group = 0;
    int staging = 0;
    bool boundary = false;
    Event copied;
    std::vector<torch::Tensor> keep_alive;  // sources of the in-flight copies
  };

  GradPipeline(const EngineOptions& options, const EngineLayout& layout, StateStore& store,
               TorchBoundary& boundary)
      : opt_(options), layout_(layout), store_(store), boundary_(boundary) {}
  int AcquireStaging() EXCLUDES(mu_);
  void ReleaseStaging(int slot) EXCLUDES(mu_);
  Status Accumulate(Job& job);

  const EngineOptions& opt_;
  const EngineLayout& layout_;
  StateStore& store_;
  TorchBoundary& boundary_;
  std::vector<Accum> accum_;
  std::vector<std::vector<uint8_t>> received_;  // per group, per parameter (training thread)
  std::vector<PinnedBuffer> staging_;
  // Ranks: the whole group's gradients in fp32 for the reduce-scatter (bf16/fp16; fp32 reduces
  // in its staging slot). Used by the worker only.
  std::vector<float> reduce_;
  Mutex mu_;
  CondVar cv_;
  std::vector<bool> staging_busy_ GUARDED_BY(mu_);
  // Gradient blocks whose NVMe write started since the last Drain: the worker's, then Drain's.
  std::vector<BlockId> written_;
  std::unique_ptr<Worker> worker_;  // last: its jobs use everything above
};

}  // namespace strata::runtime
