// NVMe traffic of one training step, predicted from the memory plan's layout (no libtorch): what
// `strata estimate` reports as NVMe bytes per step, and what `strata bench step` puts next to the
// bytes it measures.
//
// The model counts the layout's bytes: each block is read from NVMe where it is used and not still
// in memory, and written where it changes, padded to io_align as its extent is (this rank's
// slices with ranks):
//   * parameters on NVMe (units that offload_param.max_in_cpu and the host-RAM tier do not keep
//     pinned): the last W units gathered are still held when used again, W = the device window's
//     units (PlanInput::device_unit_slots) or the parameter pool's max(2, buffer_count) slots
//     where that is more. A backward reads the units but the forward's last W; the next
//     micro-batch's forward and the fp32 optimizer's master read (MasterInParams: one copy) the
//     units but the backward's last W (the first units). The step's first forward reads none
//     when the optimizer is on NVMe and pipelined (each unit's deferred update leaves its block
//     pinned just before the forward gathers it) or when the device horizon holds every unit
//     after the first (device_unit_slots beyond them, device_prefetch_elements: each update is
//     copied to the device as it finishes, param_coordinator.h); otherwise (optimizer in pinned
//     memory, or no pipeline) it is counted as reading every unit;
//   * optimizer on NVMe: a unit's fp32 gradient blocks are written by each hand-off. The gradient
//     pool (OptimizerSubGroupBuffers slots) keeps the last blocks a hand-off wrote: when every
//     block on NVMe fits, none is ever read; otherwise each hand-off after the first in the step
//     reads all back (accumulation) and the optimizer reads those its replay of the pool does not
//     find (step_traffic.cc OptimizerGradReads: the resident group's sub-groups first, then the
//     units', read_ahead ahead, FutureUsePolicy's evictions). Every state block on NVMe is read
//     and written at the step (plus the first ones read ahead during the backward that the
//     resident group's state evicts before use: read again);
//   * the updated parameters of a unit on NVMe are written to it;
//   * blocks the host-RAM tier keeps (memory_plan.h SplitHostCache: gradients, state blocks,
//     units in RAM) move nothing.
// Writes are what a run does (tests/integration/hf_moe_cli_test.cc checks them to the byte), from
// its second step (the first finishes its optimizer writes in the second: the deferred step).
// Reads are a run's from the second step for dense models (tests/integration/
// host_cache_cli_test.cc), except where timing decides: an optimizer whose state is in pinned
// memory (offload_optimizer cpu, or the host-RAM tier) runs ahead of the forward, and those of its
// updated blocks beyond the device horizon may be evicted before the forward gathers them (fewer
// reads than counted with the optimizer on cpu; more when it is on NVMe with its state in RAM and
// the horizon does not hold every unit); the first state blocks read ahead during the backward
// and counted as evicted by the resident group's state and read again may not have been read yet
// on a busy disk (fewer); a state pool with slots for every state block
// left on NVMe keeps some from step to step (fewer than counted); and rarely a prefetch races
// an eviction (one unit more). With routed experts as units (a UnitUse per unit) nothing is
// counted as held: a block is read at every use, and the experts the router's history reads
// ahead of the routing and the step's tokens then do not reach are read for nothing
// (param_coordinator.h: at most one such read per 4 micro-batches that routed to the expert).
//
// Units that do not run in every micro-batch (routed experts under --page-experts): UnitUse gives
// each unit the expected number of micro-batches of a step it runs in, the probability that it
// has a gradient at the step, and the probability that the optimizer steps it (its state and
// parameters read and written; an expert without a gradient steps on zeros, its gradient block
// neither read nor written). LlamaUnitUse computes them for uniform routing (llama_shape.h's
// ExpertHitProbability).
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
  double has_gradient = 1;   // probability that the unit has a gradient at the step
  // Probability that the optimizer steps it: 1 for strata's own models (a unit without a gradient
  // steps on zeros, EngineOptions::step_without_gradient), has_gradient where units without one
  // are skipped.
  double stepped = 1;
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
// the rule of a gradient (on any rank, in any micro-batch); every unit is stepped (strata's models
// step an expert without tokens on a zero gradient, as transformers 5's fused experts get one).
std::vector<UnitUse> LlamaUnitUse(const LlamaShape& shape, int accumulation,
                                  uint64_t tokens_per_micro_batch, int world);

}  // namespace strata::runtime
