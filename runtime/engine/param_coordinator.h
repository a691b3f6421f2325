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
// Conditional units (ParamGroup::conditional: the experts of a sparse MLP under --page-experts,
// gathered only when the router sends them tokens) are kept out of the recorded order and out of
// its divergence check: the order of the unconditional units (attention, dense and shared MLPs)
// is the same every pass, so prefetching along it never stops at a routing change and never reads
// an expert because an earlier pass used it. Experts are fetched by what is known instead:
//   - Expect (exact): right after its router's top-k the sparse MLP announces the experts it is
//     about to run, in order (and in backward the same units in the order their recomputations
//     run). They go first in the prefetch (device copies within the prefetch bucket, the live
//     limit and the slots, pinned copies for NVMe homes, as above) and first in the eviction
//     window, ahead of the recorded order; each gather of one takes it off and moves the prefetch
//     on, so expert e+1's read overlaps expert e's compute.
//   - Replays (exact): an announcement whose units equalled an earlier announcement's in the last
//     pass (backward's experts are forward's) is made again, from this pass's earlier units, at
//     the place of the recorded order where it came last pass (its anchor: the unconditional
//     gathers before it), so backward's first expert is read while the unit before it computes.
//   - History (speculative, NVMe homes only): before a layer routes (at its anchor, e.g. the
//     layer's attention), the units announced at that place in each of the last
//     EngineOptions::speculation_passes passes (N, default 4) are read into pinned memory, at most
//     max(2, EngineOptions::param_buffer_count) - 1 per place. Why that bounds the waste: a
//     speculative read is wasted only when its unit is then not announced, which resets the unit's
//     streak at that place to 0, and it needs N passes that announced it in a row before the next
//     speculation; so wasted speculative reads of a unit at a place are at most 1/N of the passes
//     that used it there (a routed gather each), and wasted bytes at most 1/N of the routed
//     experts' gathered bytes. A wasted copy is handed back to the eviction order at once
//     (TierManager::NotNeeded), so it never holds a slot a needed unit waits for. speculation()
//     counts the speculative reads and the wasted ones.
// Only tracked passes (training's, an inference engine's) keep places and history; a forward
// with untracked gathers (evaluation inside training) fetches what it announces and nothing of
// the recorded order. Conditional gathers differ between data-parallel ranks (each routes its own
// tokens), so they are for one rank (the trainer refuses --page-experts with ranks). Without
// conditional units and announcements (every model but --page-experts), nothing of this runs and
// the order, the prefetches and the bytes read are what they were.
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
// update would be invalidated by it). Instead, the optimizer tells the coordinator when a unit's
// update is final in its pinned copy (Updated, on its worker), and a unit the last prefetch would
// have copied to the device but for its pending update (the device horizon: the next units within
// the device slots, the prefetch bucket and the live limit) is copied there at once. Without that,
// an optimizer that runs ahead of the forward (its state in pinned memory, or a forward slower
// than the update) fills the parameter pool's few slots with the next units' updates and evicts
// the earlier ones before the forward gathers them: read again from NVMe.
//
// Threads: the training thread (Gather/Release run inside the units' forward and backward), but
// Updated, from the optimizer's deferred worker, which reads only the device horizon (horizon_mu_)
// and the store. Failures are thrown across libtorch through the engine's TorchBoundary.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <utility>
#include <vector>

#include "base/mutex.h"
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
  // The units this pass gathers next, nearest first (UnitHooks::Expect; see the file comment).
  void Expect(const std::vector<int>& units);
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
  // Unit u's deferred update is final in its pinned copy and not gathered yet: copies it on to the
  // device if it is in the device horizon (see the file comment). Any thread.
  void Updated(int u) EXCLUDES(horizon_mu_);

  bool has_trace() const { return trace_valid_; }
  const std::vector<int>& trace() const { return trace_; }
  // Announced units not gathered yet, nearest first.
  const std::vector<int>& expected() const { return expected_; }
  // Time spent waiting for parameters since the last call.
  double TakeGatherWaitSeconds();
  // Time gathers spent waiting for deferred optimizer updates since the last call.
  double TakeOptimizerWaitSeconds();
  // Speculative reads by the history rule since the coordinator was made (see the file comment).
  struct Speculation {
    uint64_t units = 0, bytes = 0;                // reads started ahead of the routing
    uint64_t wasted_units = 0, wasted_bytes = 0;  // of those, the ones the routing did not use
  };
  const Speculation& speculation() const { return speculation_; }

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
  // Prefetches the announced units, then (`with_trace`, following it) the recorded order from
  // pos_, and sets the eviction window to the same list.
  void Prefetch(bool with_trace);
  // A conditional unit is being gathered: it is no longer expected.
  void TakeExpected(int u);
  // Following the recorded order at pos_: replays and speculates for the announcements anchored
  // here last pass.
  void Anticipate();
  bool Following() const { return trace_valid_ && !pass_diverged_; }
  // At the end of a pass: judges what no announcement did, commits anchors, finds replays.
  void EndSites();

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
  std::vector<int> expected_;  // announced and not gathered yet, nearest first
  // One announcement site: the k-th Expect of a pass (its place: the same layer's forward or
  // backward every pass).
  struct Site {
    static constexpr size_t kNoAnchor = static_cast<size_t>(-1);
    size_t anchor = kNoAnchor;                 // unconditional gathers before it, last pass
    std::vector<int> last;                     // its units last pass (announced order)
    std::vector<std::pair<int, int>> streaks;  // unit, passes in a row it was announced here
    int replay_of = -1;     // an earlier site with the same units last pass, or -1
    bool reversed = false;  // ... announced in the reverse order
    // This pass:
    bool anticipated = false;
    size_t next_anchor = kNoAnchor;
    std::vector<int> speculated;  // read ahead by the history rule, judged by its Expect
  };
  std::vector<Site> sites_;
  int site_calls_ = 0;  // announcements recorded so far this pass
  Speculation speculation_;
  double gather_wait_seconds_ = 0;
  double optimizer_wait_seconds_ = 0;
  // The units the last Prefetch would copy to the device, pending updates or not (Updated).
  Mutex horizon_mu_;
  std::vector<int> device_horizon_ GUARDED_BY(horizon_mu_);
  void SetDeviceHorizon(std::vector<int> units) EXCLUDES(horizon_mu_);
};

}  // namespace strata::runtime
