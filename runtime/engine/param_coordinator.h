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
// With data-parallel ranks (layout.h), a gather fetches this rank's slice of the unit (prefetched
// as above) and all-gathers every rank's slice into a device buffer of the whole unit through
// EngineOptions::communicator; the all-gather itself is not prefetched.
//
// Threads: the training thread only (Gather/Release run inside the units' forward and backward).
// Failures there are thrown across libtorch through the engine's TorchBoundary.
#pragma once

#include <cstdint>
#include <vector>
#include <utility>

#include "runtime/engine/layout.h"
#include "runtime/engine/offload_unit.h"
#include "runtime/engine/options.h"
#include "runtime/engine/state_store.h"

namespace strata::runtime {

class ParamCoordinator {
 public:
  // REQUIRES: every argument outlives the coordinator.
  ParamCoordinator(const EngineOptions& options, const EngineLayout& layout, StateStore& store,
                   TorchBoundary& boundary);

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
  void Invalidate() { trace_valid_ = false; }

  bool has_trace() const { return trace_valid_; }
  const std::vector<int>& trace() const { return trace_; }
  // Time spent waiting for parameters since the last call.
  double TakeGatherWaitSeconds();

 private:
  void Coordinate(int u);
  void ReleaseGatherBuffer(int u);
  void Prefetch();

  const EngineOptions& opt_;
  const EngineLayout& layout_;
  StateStore& store_;
  TorchBoundary& boundary_;
  std::vector<Pin> gathered_;  // per group, while gathered (nvme/cpu homes, one rank)
  // Per group, while gathered with ranks: the device buffer the slices were gathered into (the
  // slice's own pin is released once gathered).
  std::vector<DeviceMemory> gathered_whole_;  // a gather beyond the store's buffers
  std::vector<int> gather_buffer_user_;        // per store gather buffer: its unit, or -1
  std::vector<int> depth_;     // per group: nested gathers
  std::vector<int> trace_;     // unit gather order of one pass
  bool trace_valid_ = false;
  bool pass_diverged_ = false;
  std::vector<int> pass_;
  size_t pos_ = 0;
  int warned_divergence_ = 0;
  double gather_wait_seconds_ = 0;
};

}  // namespace strata::runtime
