// Does a memory plan fit this machine, and if not, which DeepSpeed config keys to change.
//
// Used by `strata estimate --config` (and meant for the engine's start-up check). The machine's
// capacity is read once (MemAvailable, the first GPU's memory through gpu/ if built and present);
// disks are read per check (free space at each nvme_path, summed where paths share a filesystem).
// Without a GPU the host emulates the device, so device bytes count as host memory.
//
// Thread-safety: pure functions, except ProbeMachineCapacity and CheckFit, which read /proc,
// statvfs and the GPU; all may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "runtime/plan/machine_info.h"
#include "runtime/plan/memory_plan.h"
#include "runtime/plan/model_presets.h"

namespace strata::runtime {

struct MachineCapacity {
  std::optional<HostMemory> memory;  // unset if /proc/meminfo could not be read
  std::string memory_error;
  bool has_gpu = false;
  uint64_t gpu_bytes = 0;  // total memory of GPU 0
  std::string gpu_name;
  std::string gpu_reason;  // why has_gpu is false
};
MachineCapacity ProbeMachineCapacity();

// Where each kind of state is swapped.
struct NvmePaths {
  std::string params, optimizer;
};

struct DiskCheck {
  std::string path;  // one nvme_path, or "a + b" for two paths on one filesystem
  uint64_t need = 0;
  uint64_t free = 0;
  std::string error;  // the disk could not be read
};

struct Fit {
  bool fits = true;
  uint64_t device_need = 0, device_have = 0;  // device_have is 0 without a GPU
  uint64_t host_need = 0, host_have = 0;      // pinned + pageable (+ device without a GPU)
  std::vector<DiskCheck> disks;
  std::vector<std::string> problems;  // one line per tier that is short, for people
};

// Checks `plan` against `machine` and the free space at `paths` (NVMe bytes of "params.units" go
// to paths.params, all other NVMe bytes to paths.optimizer).
Fit CheckFit(const MemoryPlan& plan, const MachineCapacity& machine, const NvmePaths& paths);

// Bytes missing, summed over the tiers that are short (0 when the plan fits).
uint64_t Shortfall(const Fit& fit, const MachineCapacity& machine);

struct FitSuggestion {
  std::vector<std::string> changes;  // "offload_optimizer.device: cpu -> nvme", in order
  Fit fit;                           // after the changes
};

// The config change(s) that make `in` fit: the first single change that fits, tried in order of
// least cost to speed (smaller sub_group_size, fewer param buffers, no optimizer pipelining, a
// smaller micro-batch (only with `shape`), then moving state one tier down); else a greedy
// sequence, each step taking the change that most reduces the shortfall. nullopt if nothing fits.
// `sub_group_size`: the configured zero_optimization.sub_group_size that cut in.layout.
std::optional<FitSuggestion> SuggestChanges(const PlanInput& in, uint64_t sub_group_size,
                                            const std::optional<GptShape>& shape, int micro_batch,
                                            const MachineCapacity& machine, const NvmePaths& paths);

// The activations of the model at `micro_batch` and `compute_bytes` (e.g. LlamaActivationBytes at
// a fixed sequence length), for the smaller micro-batches SuggestChanges tries.
using ActivationModel = std::function<ActivationBytes(int micro_batch, int compute_bytes)>;
// The same with the model's activations as a function: an empty `activations` (activations not
// modelled) tries no smaller micro-batch, as a nullopt shape does above.
std::optional<FitSuggestion> SuggestChanges(const PlanInput& in, uint64_t sub_group_size,
                                            const ActivationModel& activations, int micro_batch,
                                            const MachineCapacity& machine, const NvmePaths& paths);

}  // namespace strata::runtime
