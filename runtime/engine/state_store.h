// StateStore: where the engine's state lives. It owns the device (or borrows the caller's), the
// I/O backend and swap spaces, the pinned arena and the TierManager, and registers every block
// of the layout with it:
//   - per group, one flat parameter block (compute dtype) at the group's home: a permanent device
//     copy for device homes (the parameter tensors view it), a permanent pinned copy for cpu homes,
//     an NVMe extent for nvme homes (fetched through pinned slots when gathered);
//   - per sub-group (none in inference, EngineOptions::inference), a state block (fp32 master,
//     then the moments) and an fp32 gradient block at
//     the optimizer's home (permanently pinned for cpu, NVMe extents for nvme, except the blocks
//     the host-RAM tier keeps: permanently pinned too, EngineOptions::host_cache_bytes). Groups
//     with master_in_params (fp32, offloaded units: PlaceGroups) keep one copy of their parameters:
//     the flat parameter block is the sub-groups' master and their state blocks hold the moments.
// Initial values come from the model's parameters (after EngineOptions::initialize_unit for
// deferred-init models), are written once to the home tier, and the offloaded parameter tensors
// are emptied. In fp16 the fp32 masters start from the fp16-rounded values (DeepSpeed builds its
// masters from the fp16 parameters); in bf16 from the fp32 initial values.
//
// Tensors over blocks (ViewOf): views of the device copy in the storage dtype, except fp16 on the
// host-emulated device (torch_device CPU), whose CPU backend cannot compute in fp16: there a
// parameter's tensor is an fp32 copy of its fp16 values, which RefreshDeviceHomeTensors renews
// after the device copies change (an optimizer step, a checkpoint load).
//
// Sizing: the arena is exactly the memory plan's pinned_arena_bytes for this layout
// (runtime/plan/memory_plan.h) unless EngineOptions::pinned_bytes overrides it. Pinned copies of
// NVMe-backed blocks come from fixed-slot pools carved from it (param slots, state and gradient
// buffers: the plan's pinned_buffers items); permanent copies (cpu homes) and the pipelines'
// staging take the rest.
//
// Lifecycle: Create (device, streams, I/O, arena, TierManager), then the pipelines take their
// staging buffers from arena(), then InitBlocks. Threads: Create/InitBlocks on the training thread;
// the TierManager, device and arena are thread-safe; group()/subgroup() entries are written only
// during InitBlocks.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"
#include "cpu_optimizer/optimizer.h"
#include "runtime/engine/engine_layout.h"
#include "runtime/engine/options.h"
#include "runtime/engine/torch_stream.h"
#include "runtime/plan/memory_plan.h"
#include "swap/io_backend.h"
#include "swap/swap_space.h"
#include "tiers/device.h"
#include "tiers/device_registry.h"
#include "tiers/pinned_arena.h"
#include "tiers/tier_manager.h"

namespace strata::runtime {

class StateStore {
 public:
  struct GroupBlock {
    BlockId block = 0;
    Pin home_pin;  // device home: the device copy; cpu home: the pinned copy
  };
  struct SubGroupBlocks {
    BlockId state = 0;
    BlockId grad = 0;
    Pin state_home_pin;  // cpu home: keeps the copies resident
    Pin grad_home_pin;
  };

  // REQUIRES: options and layout outlive the store.
  static Result<std::unique_ptr<StateStore>> Create(const EngineOptions& options,
                                                    const EngineLayout& layout,
                                                    const BlockSizes& sizes);
  ~StateStore();

  // Registers every block and writes its initial values; `optimizer` initializes the moments.
  Status InitBlocks(const cpu_optimizer::CpuOptimizer& optimizer,
                    cpu_optimizer::OptimizerType type);

  DeviceBackend& device() { return *device_; }
  Stream& h2d() { return *h2d_; }
  Stream& d2h() { return *d2h_; }
  // The stream libtorch computes on, on a device the CPU cannot address (CUDA): the store makes
  // it libtorch's current stream for options.torch_device on the creating thread (the backward
  // runs each op on its forward op's stream) and restores the previous one when destroyed. Null
  // on the host-emulated device, where libtorch computes on the CPU, synchronously.
  Stream* compute() { return compute_; }
  // Orders what the engine's copies do next after the compute enqueued so far, without a host
  // wait: the TierManager's copies (before a gathered unit's device memory may be reused) and
  // the gradient hand-off's (before it reads gradients libtorch produced). No-op without compute().
  Status OrderCopiesAfterCompute();
  Status OrderHandOffAfterCompute();
  // Blocks until the compute enqueued so far has completed (before the optimizer writes device
  // homes, before checkpoints read them). No-op without compute().
  Status WaitForCompute();
  // A point after the compute enqueued so far, for another thread to wait on (the ahead
  // all-gather, before it overwrites a gather buffer kernels may still read). Complete (empty)
  // without compute().
  Result<Event> RecordCompute();
  PinnedArena& arena() { return *arena_; }
  const PinnedArena& arena() const { return *arena_; }
  // The pools (null when absent): for tests and reports of the plan's exactness.
  const PinnedArena* param_pool() const { return param_pool_.get(); }
  const PinnedArena* state_pool() const { return state_pool_.get(); }
  const PinnedArena* grad_pool() const { return grad_pool_.get(); }
  // Which blocks the host-RAM tier keeps in the arena instead of on NVMe (the plan's split for
  // EngineOptions::host_cache_bytes).
  const HostCacheSplit& host_split() const { return host_split_; }
  TierManager& tm() { return *tm_; }
  const TierManager& tm() const { return *tm_; }
  FutureUsePolicy& policy() { return *future_policy_; }
  GroupBlock& group(int g) { return groups_[g]; }
  SubGroupBlocks& subgroup(int s) { return subgroups_[s]; }
  const BlockSizes& sizes() const { return sizes_; }
  // Unit blocks the device budget holds besides the resident (and device-home) ones.
  uint64_t device_slots() const { return device_slots_; }
  // Ranks with offloaded parameters: device buffers of the largest whole (padded) unit that
  // gathers assemble units in, set aside before the TierManager takes the rest of the budget.
  std::vector<DeviceMemory>& gather_buffers() { return gather_buffers_; }

  // A parameter's tensor over the flat block at `base` (a device address), or an empty one.
  torch::Tensor ViewOf(const ParamSlot& p, void* base) const;
  torch::Tensor Empty() const;
  // The dtype of the blocks (parameter copies, handed-off gradients): fp32, bf16 or fp16.
  torch::ScalarType storage_dtype() const;
  // The dtype of the tensors the model computes with (and of their gradients): the storage dtype,
  // but fp32 for fp16 on the host-emulated device.
  torch::ScalarType tensor_dtype() const;
  // Points device-home groups' parameters at their device copies again, where ViewOf copies
  // (tensor_dtype() != storage_dtype()); a no-op where ViewOf's tensors are views.
  void RefreshDeviceHomeTensors();

 private:
  StateStore(const EngineOptions& options, const EngineLayout& layout, const BlockSizes& sizes)
      : opt_(options), layout_(layout), sizes_(sizes) {}
  Status Init();
  Result<SwapSpace*> SwapFor(const std::string& path, const char* key);
  Status InitGroup(int gi, SwapSpace* param_swap, SwapSpace* opt_swap,
                   const cpu_optimizer::CpuOptimizer& optimizer, cpu_optimizer::OptimizerType type);
  void WriteInitialParams(const ParamGroup& g, void* dst) const;
  void CopyInitialFp32(const ParamGroup& g, uint64_t begin, uint64_t n, float* dst) const;

  const EngineOptions& opt_;
  const EngineLayout& layout_;
  const BlockSizes sizes_;
  std::unique_ptr<DeviceBackend> owned_device_;  // when EngineOptions::device is null
  DeviceBackend* device_ = nullptr;
  std::unique_ptr<Stream> h2d_, d2h_;
  // The compute stream: EngineOptions::compute_stream, or owned_compute_ made libtorch's
  // current stream by torch_stream_ (declared after it: restored before the stream goes).
  Stream* compute_ = nullptr;
  std::unique_ptr<Stream> owned_compute_;
  std::optional<TorchStreamGuard> torch_stream_;
  std::unique_ptr<IoBackend> io_;
  std::vector<std::unique_ptr<SwapSpace>> swaps_;  // one per distinct nvme_path
  std::map<std::string, SwapSpace*> swap_by_path_;
  // The plan's NVMe bytes per nvme_path (Init), checked against the free space of each
  // filesystem once, when its first swap space is created (SwapFor).
  std::map<std::string, uint64_t> nvme_need_;
  std::set<uint64_t> nvme_checked_devices_;
  std::unique_ptr<PinnedArena> arena_;
  // Fixed-slot pools of the arena for the pinned copies of NVMe-backed blocks (null when that
  // state is not on NVMe). Declared after the arena and before the TierManager: destroyed after
  // the manager's copies, before the arena.
  std::unique_ptr<PinnedArena> param_pool_, state_pool_, grad_pool_;
  std::unique_ptr<TierManager> tm_;
  std::vector<DeviceMemory> gather_buffers_;
  std::string rank_dir_;  // nvme_path/rank{r} this store created (removed when empty)
  FutureUsePolicy* future_policy_ = nullptr;
  std::vector<GroupBlock> groups_;
  std::vector<SubGroupBlocks> subgroups_;
  HostCacheSplit host_split_;
  uint64_t device_slots_ = 0;
};

// The memory plan's input for `layout` under `options` (what `strata estimate` computes from a
// preset): the arena the StateStore allocates is PlanMemory(PlanInputFor(...)).pinned_arena_bytes.
PlanInput PlanInputFor(const EngineOptions& options, const EngineLayout& layout,
                       const BlockSizes& sizes);

// The budget of the device the StateStore computes on when `options.device` is null (the host
// emulation it opens itself): options.device_budget, or, when that is 0, the plan's
// EmulatedDeviceDefaultBudget (every group's gathered parameters, two gather buffers with ranks,
// 64 MiB), which `strata estimate` reports too.
uint64_t OwnedHostDeviceBudget(const EngineOptions& options, const EngineLayout& layout,
                               const BlockSizes& sizes);

// Sets each group's placement as the memory plan counts it, before StateStore::Create: the
// leading units offload_param.max_in_cpu keeps pinned get Home::kCpu, and master_in_params is the
// plan's MasterInParams (fp32: an offloaded unit's parameter block is its master, one copy).
void PlaceGroups(const EngineOptions& options, EngineLayout& layout, const BlockSizes& sizes);

}  // namespace strata::runtime
