// Layout: how the engine cuts a model's trainable parameters into groups and sub-groups, computed
// once per engine (PartitionModel) and read by every other part.
//
//   group:     one offload unit's parameters, or the "resident" group (parameters outside units,
//              and unit parameters of at most `persistence_threshold` elements). A group's
//              parameters sit back to back in one flat block (ParamSlot::offset in elements).
//   sub-group: a run of at most `sub_group_size` elements of one group's flat range: the
//              optimizer's unit of work and of NVMe swapping (state block = fp32 master, then the
//              moments; gradient block = fp32 accumulated gradient).
//
// Groups are units first (group index = unit index), the resident group last. The sub-group split
// is plan/layout.h's SplitSubGroups, the same function the memory plan uses, so the engine's
// buffers and the plan's figures come from one computation.
//
// Data-parallel ranks (ZeRO-3 partitioning, ARCHITECTURE.md §8): with world W > 1 every group's
// flat range is padded to W slices of `part` elements (a multiple of kPartitionAlign) and rank r
// owns slice r: [r*part, (r+1)*part) ∩ [0, numel), its `own_begin`/`own_numel`. A rank keeps its
// slice of the flat parameter block (NVMe/cpu homes; device homes keep the whole padded block,
// `gathered()` elements), and sub-groups are cut over its own slice only, so its optimizer state
// and fp32 gradients are 1/W of the model's. Sub-group `begin`s stay offsets into the group's
// whole flat range, whatever the world size (checkpoints name sub-groups by them). With W == 1,
// part == numel and nothing is padded: the single-rank layout is unchanged.
//
// Threads: built once on the training thread, then read-only (ParamSlot::var is the model's
// parameter; only the training thread calls set_data on it).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "cpu_optimizer/optimizer.h"
#include "runtime/engine/offload_unit.h"
#include "runtime/plan/layout.h"
#include "tiers/tier.h"

namespace strata::runtime {

struct ParamSlot {
  std::string name;
  torch::Tensor var;  // the model's parameter
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  uint64_t offset = 0;  // elements into the group's flat block
};

struct ParamGroup {
  std::string name;  // the unit's module path, or "resident"
  bool unit = false;
  // The unit's use depends on the data (OffloadUnitImpl::conditional: an expert under
  // --page-experts): kept out of the recorded gather order (param_coordinator.h).
  bool conditional = false;
  Home home = Home::kDevice;  // where the flat parameter block lives
  std::vector<ParamSlot> params;
  uint64_t numel = 0;
  std::vector<int> subgroups;  // indices into EngineLayout::subgroups (this rank's)
  // This rank's slice of [0, numel) (see the file comment); part == numel when world == 1.
  uint64_t part = 0;
  uint64_t own_begin = 0;
  uint64_t own_numel = 0;
  int world = 1;
  // fp32 runs of an offloaded unit (plan's MasterInParams): the flat parameter block is the
  // optimizer's fp32 master of the group's sub-groups, whose state blocks hold the moments only.
  bool master_in_params = false;
  // Elements of the whole padded flat block: what a gather assembles on the device.
  uint64_t gathered() const { return part * static_cast<uint64_t>(world); }
};

// Where an entry of a unit's GradParameters goes: a slot of the unit's own group, or (resident)
// a slot of the resident group (a small unit parameter kept on the device).
struct GradTarget {
  bool resident = false;
  int slot = -1;
};

struct EngineLayout {
  std::vector<ParamGroup> groups;
  int resident_group = -1;  // == number of units
  std::vector<SubGroupSpan> subgroups;
  std::vector<std::vector<torch::Tensor>> unit_grad_params;  // per unit, in GradTarget order
  std::vector<std::vector<GradTarget>> unit_grad_targets;
  uint64_t max_unit_numel = 0;     // the largest unit's numel
  uint64_t max_unit_part = 0;      // the largest unit's slice (== max_unit_numel at world 1)
  uint64_t max_unit_gathered = 0;  // the largest unit's padded block (== max_unit_numel at 1)
  uint64_t max_subgroup_numel = 0;
  int world = 1;
  int rank = 0;

  int units() const { return resident_group; }
  // The plan's view of this layout (plan/layout.h): units' slices (what this rank stores), its
  // sub-groups, the resident group's padded block (device homes hold it whole).
  ModelLayout Plan() const;
};

// Finds the offload units of `model`, groups its trainable parameters (frozen ones are left
// alone), partitions every group over `world` ranks (this is rank `rank`), cuts this rank's
// sub-groups and attaches every unit to `hooks`. InvalidArgument when units share a parameter or
// a trainable parameter is not fp32 on the CPU.
Result<EngineLayout> PartitionModel(torch::nn::Module& model, Home params_home,
                                    uint64_t persistence_threshold, uint64_t sub_group_size,
                                    UnitHooks* hooks, int world = 1, int rank = 0);

// Slices and their sub-groups: SliceOf, RankSubGroups (plan/layout.h).

// Bytes of the blocks the engine keeps, each padded to kIoAlign (a valid O_DIRECT extent).
inline constexpr uint64_t kIoAlign = 4096;
struct BlockSizes {
  uint64_t compute_bytes = 4;  // per parameter element: 4 fp32, 2 bf16
  int state_arrays = 3;        // arrays per state element: the fp32 master + moments
  uint64_t moment_bytes = 4;   // per moment element: 4 fp32, 2 bf16 (bf16.bf16_optimizer_states)
  // Bytes per element of a state block: the master's 4 (unless master_in_params) + the moments'.
  uint64_t StateElementBytes(bool master_in_params = false) const {
    return cpu_optimizer::StateBytesPerElement(state_arrays - 1, moment_bytes, master_in_params);
  }

  uint64_t Param(uint64_t numel) const;  // a flat parameter block (compute dtype)
  // A sub-group's state block: master and moments, or the moments only (master_in_params).
  uint64_t State(uint64_t numel, bool master_in_params = false) const;
  uint64_t Grad(uint64_t numel) const;  // a sub-group's fp32 gradient block
};

// fp32 master plus the optimizer's moments (cpu_optimizer::MomentCount): Adam/AdamW 3; Adagrad,
// Lion 2.
int StateArrays(cpu_optimizer::OptimizerType type);

// The optimizer's view of a sub-group's state block (`state`: master, then the moments in the
// order the optimizer keeps them) with its gradients at `grads`.
cpu_optimizer::FlatSpan StateSpan(cpu_optimizer::OptimizerType type, uint64_t numel, float* state,
                                  const void* grads);
// The same with the master elsewhere (master_in_params: in the parameter block), `moments` the
// moments of the state block, in `moment_dtype` (fp32 or bf16).
cpu_optimizer::FlatSpan StateSpan(cpu_optimizer::OptimizerType type, uint64_t numel, float* master,
                                  void* moments, const void* grads,
                                  DType moment_dtype = DType::kFloat32);

}  // namespace strata::runtime
