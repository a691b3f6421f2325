// ParamCoordinator: gathers offload units' parameters onto the device for their forward and
// backward, and keeps the next units' parameters moving (ARCHITECTURE.md §3).
//
// The first pass records the order of gathers; later passes prefetch along it: device copies of
// the next units within stage3_prefetch_bucket_size, stage3_max_live_parameters and the device
// slots, pinned copies (NVMe homes) twice as far ahead, and the upcoming order feeds the
// FutureUsePolicy that picks eviction victims. A gather that does not match the recorded order
// stops prefetching for the pass and the order is re-recorded at its end (with a warning, at most
// three times) instead of failing, as DeepSpeed would raise.
//
// With data-parallel ranks (engine_layout.h), a gather fetches this rank's slice of the unit
// (prefetched as above) and all-gathers every rank's slice into a device buffer of the whole unit.
// Following the recorded order, the next unit's all-gather starts on a worker as soon as a unit is
// gathered (one ahead, over EngineOptions::gather_communicator, a process group of its own), so it
// runs while the unit computes; a gather off the order all-gathers on the training thread
// (EngineOptions::communicator). Both decisions depend only on the order and on gathers and
// releases, which are the same on every rank, so every rank runs the same collectives.
//
// A deferred optimizer step (OptimizerPipeline::Start) may still be updating units when the next
// pass begins: a gather of such a unit waits for its update first (WaitGroup), and prefetching
// leaves pending units to the optimizer (which reads them itself; a device copy made before the
// update would be invalidated by it).
//
// Threads: the training thread only (Gather/Release run inside the units' forward and backward).
// Failures there are thrown across libtorch through the engine's TorchBoundary.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <utility>
#include <vector>

#include "base/worker.h"
#include "runtime/engine/engine_layout.h"
#include "runtime/engine/offload_unit.h"
#include "runtime/engine/options.h"
#include "runtime/engine/state_store.h"

namespace strata::runtime {

class OptimizerPipeline;

class ParamCoordinator {
 public:
  // REQUIRES: every argument outlives the coordinator.
  ParamCoordinator(const EngineOptions& options, const EngineLayout& layout, StateStore& store,
                   TorchBoundary& boundary);
  ~ParamCoordinator();

  // Makes unit u's parameters usable on the device (nested gathers count); `tracked`: part of a
  // training pass, so the order is recorded and prefetched along. Throws through the boundary.
  void Gather(int u, bool tracked);
  void Release(int u);
  // The pass ended (after backward): re-record the order if it diverged or is new.
  void EndPass();
  // Start fetching the first units of the next pass (after the optimizer changed them).
  void PrefetchNextPass();
  // Follow the recorded order from its start again (benchmarks replaying a pass).
  void RestartPass() {
    pos_ = 0;
    pass_diverged_ = false;
  }
  // Forget the recorded order (after a checkpoint was loaded).
  void Invalidate();
  // The optimizer whose deferred updates gathers wait for (null: none). Set once, before use.
  void set_optimizer(OptimizerPipeline* optimizer) { optimizer_ = optimizer; }

  bool has_trace() const { return trace_valid_; }
  const std::vector<int>& trace() const { return trace_; }
  // Time spent waiting for parameters since the last call.
  double TakeGatherWaitSeconds();
  // Time gathers spent waiting for deferred optimizer updates since the last call.
  double TakeOptimizerWaitSeconds();

 private:
  void Coordinate(int u);
  void ReleaseGatherBuffer(int u);
  // Ranks: a store gather buffer nobody uses, or -1.
  int FreeGatherBuffer();
  // This rank's slice of unit u to the device, then every rank's slice into `whole`.
  Status AllGatherUnit(int u, void* whole, Communicator& comm);
  // Ranks, following the trace: starts the all-gather of the unit at trace_[pos_] on the gather
  // worker (one ahead), if a buffer is free.
  void StartAheadGather();
  // Waits for an all-gather started ahead and not taken (the pass diverged or ended) and frees
  // its buffer.
  void DropAheadGather();
  void Prefetch();

  const EngineOptions& opt_;
  const EngineLayout& layout_;
  StateStore& store_;
  TorchBoundary& boundary_;
  // This client's window of upcoming uses in the store's FutureUsePolicy (the optimizer pipeline
  // has its own, so a deferred step on its worker and this forward never overwrite each other's).
  const FutureUsePolicy::Window policy_window_;
  OptimizerPipeline* optimizer_ = nullptr;
  std::vector<Pin> gathered_;  // per group, while gathered (nvme/cpu homes, one rank)
  // Per group, with ranks: the buffer of a gather beyond the store's two (the slice's own pin is
  // released once gathered).
  std::vector<DeviceMemory> gathered_whole_;
  std::vector<int> gather_buffer_user_;  // per store gather buffer: its unit, or -1
  static constexpr int kAheadUser = -2;  // a buffer the ahead all-gather fills
  struct AheadGather {
    int unit = -1;
    int buffer = -1;
    std::shared_future<Status> done;
  };
  AheadGather ahead_;
  // Runs the ahead all-gathers on EngineOptions::gather_communicator (its own process group).
  // The destructor resets it first, while what its job uses exists.
  std::unique_ptr<Worker> gather_worker_;
  std::vector<int> depth_;  // per group: nested gathers
  std::vector<int> trace_;  // unit gather order of one pass
  bool trace_valid_ = false;
  bool pass_diverged_ = false;
  std::vector<int> pass_;
  size_t pos_ = 0;
  int warned_divergence_ = 0;
  double gather_wait_seconds_ = 0;
  double optimizer_wait_seconds_ = 0;
};

}  // namespace strata::runtime
