// NVMe traffic of one training step, predicted from the memory plan's layout (no libtorch): what
// `strata estimate` reports as NVMe bytes per step, and what `strata bench step` puts next to the
// bytes it measures.
//
// The model counts the layout's bytes: each block is read from NVMe where it is used and written
// where it changes, padded to io_align as its extent is (this rank's slices with ranks):
//   * parameters on NVMe (units that offload_param.max_in_cpu does not keep pinned): a unit's
//     block is read for its forward and again for its backward, in every micro-batch it runs in;
//   * optimizer on NVMe: a unit's fp32 gradient blocks are written by each hand-off (a micro-batch
//     it ran in) and read back by each hand-off after its first in the step (accumulation); at the
//     step every sub-group with a gradient has its state and gradient blocks read and its state
//     block written; the resident group's sub-groups every micro-batch and every step;
//   * the updated parameters of a unit on NVMe are written to it; fp32 runs keep one copy
//     (MasterInParams), so that block is also read by the optimizer as the master;
//   * blocks the host-RAM tier keeps (memory_plan.h SplitHostCache: gradients, state blocks,
//     units in RAM) move nothing.
// Writes are what a run does (tests/integration/hf_moe_cli_test.cc checks them to the byte). Reads
// differ: a block still in pinned memory when it is used again is not read again (the deferred
// optimizer step's updated fp32 block feeds the next forward, a gradient block the hand-off left
// pinned feeds the optimizer), so a run with spare pinned buffers reads less; with routed experts
// as units, the experts the router's history reads ahead of the routing and the step's tokens
// then do not reach are read for nothing (param_coordinator.h: at most one such read per 4
// micro-batches that routed to the expert), so a paged run can read more.
//
// Units that do not run in every micro-batch (routed experts under --page-experts): UnitUse gives
// each unit the expected number of micro-batches of a step it runs in and the probability that it
// has a gradient at the step (an expert without one is neither read nor written by the optimizer).
// LlamaUnitUse computes them for uniform routing (llama_shape.h's ExpertHitProbability).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "runtime/plan/llama_shape.h"
#include "runtime/plan/memory_plan.h"

namespace strata::runtime {

struct UnitUse {
  double micro_batches = 1;  // expected micro-batches of the step the unit runs in
  double stepped = 1;        // probability that the unit has a gradient at the step
};

// Expected bytes per step (fractions: expectations over routing).
struct StepTraffic {
  double params_read = 0;        // forward and backward gathers of units on NVMe
  double grads_written = 0;      // gradient hand-offs
  double grads_read = 0;         // accumulation: hand-offs after a unit's first in the step
  double optimizer_read = 0;     // state and gradient blocks (and fp32 masters in parameter blocks)
  double optimizer_written = 0;  // state blocks and the updated parameter blocks
  double read() const { return params_read + grads_read + optimizer_read; }
  double written() const { return grads_written + optimizer_written; }
};

// `t` as JSON bytes (rounded): read, written and each part; what `strata estimate --json` and
// `strata bench step --model` print.
nlohmann::json StepTrafficJson(const StepTraffic& t);

// The traffic of `in` (a training plan: zero for inference) in a step of `accumulation`
// micro-batches. `use`: one entry per unit of in.layout, or empty for every unit in every
// micro-batch (UnitUse{accumulation, 1}). REQUIRES: accumulation >= 1; use empty or of
// in.layout.unit_numel.size() entries.
StepTraffic NvmeTrafficPerStep(const PlanInput& in, int accumulation,
                               std::span<const UnitUse> use = {});

// The units' use for LlamaPlanInput(shape, ...)'s units (LlamaLayerUnits order): attention,
// dense MLPs, shared experts and whole layers run in every micro-batch; a routed expert (with
// shape.page_experts) runs in a micro-batch with ExpertHitProbability(shape, tokens of the
// micro-batch on this rank) and has a gradient at the step with ExpertHitProbability(shape,
// tokens of every micro-batch on every rank: `tokens_per_micro_batch` x accumulation x world),
// the optimizer's rule (a gradient on any rank, in any micro-batch).
std::vector<UnitUse> LlamaUnitUse(const LlamaShape& shape, int accumulation,
                                  uint64_t tokens_per_micro_batch, int world);

}  // namespace strata::runtime
