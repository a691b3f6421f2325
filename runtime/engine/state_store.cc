// StateStore states: created (device, streams, I/O backend, arena, TierManager exist; no blocks)
// -> blocks initialized (every group and sub-group block registered, initial values at home).
// Lock rule: none of its own; the TierManager, device and arena synchronize themselves, and the
// group/sub-group tables are written only by InitBlocks on the training thread.
#include "runtime/engine/state_store.h"

#include <malloc.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "base/bytes.h"
#include "base/logging.h"
#include "cpu_optimizer/convert.h"

namespace strata::runtime {

PlanInput PlanInputFor(const EngineOptions& options, const EngineLayout& layout,
                       const BlockSizes& sizes) {
  PlanInput in;
  in.layout = layout.Plan();
  in.compute_bytes = static_cast<int>(sizes.compute_bytes);
  in.state_bytes = static_cast<int>(sizes.StateElementBytes());
  in.params = options.params;
  in.optimizer = options.optimizer;
  in.param_buffer_count = options.param_buffer_count;
  in.param_buffer_size = options.param_buffer_size;
  in.max_in_cpu = options.param_max_in_cpu;
  in.optimizer_buffer_count = options.optimizer_buffer_count;
  in.pipeline = options.pipeline;
  in.inference = options.inference;
  in.io_align = kIoAlign;
  in.host_cache_bytes = options.host_cache_bytes;
  in.device_prefetch_elements =
      std::min<uint64_t>(options.prefetch_bucket_size, options.max_live_parameters);
  return in;
}

uint64_t OwnedHostDeviceBudget(const EngineOptions& options, const EngineLayout& layout,
                               const BlockSizes& sizes) {
  if (options.device_budget != 0) return options.device_budget;
  // The plan's count, so `strata estimate` reports the budget this engine opens.
  return EmulatedDeviceDefaultBudget(PlanInputFor(options, layout, sizes));
}

void PlaceGroups(const EngineOptions& options, EngineLayout& layout, const BlockSizes& sizes) {
  const size_t in_cpu = UnitsInCpu(PlanInputFor(options, layout, sizes));
  for (size_t u = 0; u < in_cpu; ++u) layout.groups[u].home = Home::kCpu;
  const PlanInput plan_in = PlanInputFor(options, layout, sizes);
  for (int gi = 0; gi < static_cast<int>(layout.groups.size()); ++gi) {
    layout.groups[gi].master_in_params = MasterInParams(plan_in, gi);
  }
}

Result<std::unique_ptr<StateStore>> StateStore::Create(const EngineOptions& options,
                                                       const EngineLayout& layout,
                                                       const BlockSizes& sizes) {
  std::unique_ptr<StateStore> s(new StateStore(options, layout, sizes));
  STRATA_RETURN_IF_ERROR(s->Init());
  return s;
}

StateStore::~StateStore() {
  if (compute_ != nullptr) {
    WaitForCompute().IgnoreError();
    torch_stream_.reset();  // libtorch's previous stream, before the stream goes
    owned_compute_.reset();
    compute_ = nullptr;
  }
  // Pins before the TierManager, the TierManager before the arena and the device.
  groups_.clear();
  subgroups_.clear();
  tm_.reset();
  gather_buffers_.clear();
  swaps_.clear();  // removes the run directories (unless kept)
  if (!rank_dir_.empty()) (void)rmdir(rank_dir_.c_str());  // only when empty
}

Status StateStore::OrderCopiesAfterCompute() {
  if (compute_ == nullptr) return Status::Ok();
  STRATA_ASSIGN_OR_RETURN(Event done, RecordCompute());
  return tm_->OrderCopiesAfter(done);
}

Status StateStore::OrderHandOffAfterCompute() {
  if (compute_ == nullptr) return Status::Ok();
  STRATA_ASSIGN_OR_RETURN(Event done, RecordCompute());
  return device_->StreamWaitEvent(*d2h_, done);
}

Status StateStore::WaitForCompute() {
  if (compute_ == nullptr) return Status::Ok();
  return device_->Synchronize(*compute_);
}

Result<Event> StateStore::RecordCompute() {
  if (compute_ == nullptr) return Event();
  return device_->RecordEvent(*compute_);
}

torch::ScalarType StateStore::storage_dtype() const {
  switch (opt_.precision) {
    case DType::kBFloat16:
      return torch::kBFloat16;
    case DType::kFloat16:
      return torch::kHalf;
    case DType::kFloat32:
      break;
  }
  return torch::kFloat32;
}

torch::ScalarType StateStore::tensor_dtype() const {
  // libtorch's CPU backend has no fp16 kernels for most ops (matmul, layer norm): compute in fp32
  // on the fp16 values instead, which is what an fp16 GPU kernel accumulating in fp32 does too.
  if (opt_.precision == DType::kFloat16 && opt_.torch_device.is_cpu()) return torch::kFloat32;
  return storage_dtype();
}

torch::Tensor StateStore::ViewOf(const ParamSlot& p, void* base) const {
  auto* f = static_cast<std::byte*>(base) + p.offset * sizes_.compute_bytes;
  torch::Tensor view = torch::from_blob(
      f, p.shape, torch::TensorOptions().dtype(storage_dtype()).device(opt_.torch_device));
  return tensor_dtype() == storage_dtype() ? view : view.to(tensor_dtype());
}

torch::Tensor StateStore::Empty() const {
  return torch::empty({0}, torch::TensorOptions().dtype(tensor_dtype()).device(opt_.torch_device));
}

void StateStore::RefreshDeviceHomeTensors() {
  if (tensor_dtype() == storage_dtype()) return;
  torch::NoGradGuard no_grad;
  for (size_t gi = 0; gi < layout_.groups.size(); ++gi) {
    const ParamGroup& g = layout_.groups[gi];
    if (g.home != Home::kDevice || g.numel == 0) continue;
    for (const ParamSlot& p : g.params) {
      torch::Tensor var = p.var;
      var.set_data(ViewOf(p, groups_[gi].home_pin.data()));
    }
  }
}

Status StateStore::Init() {
  const int resident = layout_.resident_group;
  // Device homes hold their group's whole padded block; with ranks, a gathered unit's block is
  // assembled in a buffer of its own beside the unit's slice (gather_bytes, two in flight).
  const uint64_t resident_bytes = sizes_.Param(layout_.groups[resident].gathered());
  const uint64_t gather_bytes = layout_.world > 1 && opt_.params != Home::kDevice
                                    ? 2 * sizes_.Param(layout_.max_unit_gathered)
                                    : 0;
  if (opt_.device != nullptr) {
    device_ = opt_.device;
  } else {
    // The host emulation, opened through the device registry like any device.
    DeviceOptions d;
    d.budget_bytes = OwnedHostDeviceBudget(opt_, layout_, sizes_);
    STRATA_ASSIGN_OR_RETURN(owned_device_, OpenDevice("host", d));
    device_ = owned_device_.get();
  }
  const uint64_t device_budget = device_->info().budget_bytes;
  uint64_t device_fixed = resident_bytes + gather_bytes;
  if (opt_.params == Home::kDevice) {
    for (int u = 0; u < resident; ++u) device_fixed += sizes_.Param(layout_.groups[u].gathered());
    if (device_fixed > device_budget) {
      return ResourceExhaustedError("the device budget (" + FormatBytes(device_budget) +
                                    ") cannot hold the parameters (" + FormatBytes(device_fixed) +
                                    "): set zero_optimization.offload_param.device to cpu or nvme");
    }
  } else if (resident > 0) {
    const uint64_t unit_bytes = sizes_.Param(layout_.max_unit_part);
    if (device_fixed + unit_bytes > device_budget) {
      return ResourceExhaustedError(
          "the device budget (" + FormatBytes(device_budget) +
          ") cannot hold the resident parameters (" + FormatBytes(resident_bytes) +
          ") plus the largest offload unit's (" + FormatBytes(unit_bytes) +
          (gather_bytes > 0 ? " and two gathered units, " + FormatBytes(gather_bytes)
                            : std::string()) +
          ")");
    }
    // The plan's count (estimate's too). Every unit parameter persistent (at most
    // stage3_param_persistence_threshold elements, all of them in the resident group): the units'
    // blocks are empty and need no device slot.
    device_slots_ = DeviceUnitSlots(PlanInputFor(opt_, layout_, sizes_), device_budget);
  }
  if (gather_bytes > 0) {
    for (int i = 0; i < 2; ++i) {
      STRATA_ASSIGN_OR_RETURN(DeviceMemory buffer,
                              device_->Allocate(sizes_.Param(layout_.max_unit_gathered)));
      gather_buffers_.push_back(std::move(buffer));
    }
  }
  STRATA_ASSIGN_OR_RETURN(h2d_, device_->CreateStream("engine-h2d"));
  STRATA_ASSIGN_OR_RETURN(d2h_, device_->CreateStream("engine-d2h"));
  if (!device_->info().host_addressable) {
    if (opt_.torch_device.is_cpu()) {
      return InvalidArgumentError("the engine's device is " + device_->info().name +
                                  ", but libtorch would compute on the CPU (torch_device)");
    }
    if (opt_.compute_stream != nullptr) {
      compute_ = opt_.compute_stream;  // the caller made it libtorch's (TorchStreamGuard)
    } else {
      STRATA_ASSIGN_OR_RETURN(owned_compute_, device_->CreateStream("engine-compute"));
      compute_ = owned_compute_.get();
      STRATA_ASSIGN_OR_RETURN(
          TorchStreamGuard guard,
          TorchStreamGuard::Install(opt_.torch_device, compute_->native_handle()));
      torch_stream_.emplace(std::move(guard));
    }
  }

  if (opt_.params == Home::kNvme || opt_.optimizer == Home::kNvme) {
    const std::string& probe =
        opt_.optimizer == Home::kNvme ? opt_.optimizer_nvme_path : opt_.param_nvme_path;
    STRATA_ASSIGN_OR_RETURN(io_, OpenIoBackend(opt_.io_backend, opt_.io, probe));
  }
  const PlanInput plan_in = PlanInputFor(opt_, layout_, sizes_);
  for (int gi = 0; gi < static_cast<int>(layout_.groups.size()); ++gi) {
    if (layout_.groups[gi].master_in_params != MasterInParams(plan_in, gi)) {
      return FailedPreconditionError("group " + layout_.groups[gi].name +
                                     " is not placed as the memory plan counts it (PlaceGroups)");
    }
  }
  STRATA_RETURN_IF_ERROR(CheckOffloadBuffers(plan_in));
  const MemoryPlan plan = PlanMemory(plan_in);
  for (const auto& [name, bytes] : plan.items) {
    STRATA_LOG(kDebug) << "plan item " << name << ": device " << bytes.device << ", pinned "
                       << bytes.pinned << ", host " << bytes.host << ", nvme " << bytes.nvme;
  }
  PinnedArenaOptions ao;
  // Exactly the plan of this layout: NVMe-backed blocks use the fixed-slot pools below (the
  // plan's pinned_buffers items), so there is nothing to fragment and no slack to add.
  ao.bytes = opt_.pinned_bytes != 0 ? opt_.pinned_bytes : plan.pinned_arena_bytes;
  if (opt_.host_memory_budget != 0 &&
      ao.bytes + opt_.host_beside.total() > opt_.host_memory_budget) {
    return HostBudgetError(plan, ao.bytes, opt_.host_beside, opt_.host_memory_budget,
                           opt_.host_memory_source);
  }
  // NVMe space: checked per path when its swap space is created (SwapFor), after the orphans of
  // killed runs there are reclaimed.
  const NvmeNeed nvme_need = NvmeBytesByPath(plan);
  if (opt_.param_nvme_path == opt_.optimizer_nvme_path) {
    nvme_need_[opt_.param_nvme_path] = nvme_need.params + nvme_need.optimizer;
  } else {
    nvme_need_[opt_.param_nvme_path] = nvme_need.params;
    nvme_need_[opt_.optimizer_nvme_path] = nvme_need.optimizer;
  }
  ao.budget_key = "pinned host arena (sized from the model and zero_optimization)";
  ao.lock = opt_.pin_memory;
  ao.device = device_;
  STRATA_ASSIGN_OR_RETURN(arena_, PinnedArena::Create(ao));
  if (const uint64_t unit = LargestNvmeUnit(plan_in); unit > 0) {
    STRATA_ASSIGN_OR_RETURN(
        param_pool_,
        PinnedArena::CarvePool(*arena_, sizes_.Param(unit), std::max(2, opt_.param_buffer_count),
                               "params.pinned_buffers"));
  }
  host_split_ = SplitHostCache(plan_in);
  if (opt_.optimizer == Home::kNvme && layout_.max_subgroup_numel > 0) {
    // A pool per class with blocks on NVMe, as the plan counts them.
    const uint64_t buffers = OptimizerSubGroupBuffers(plan_in);
    if (AnyOnNvme(host_split_.state)) {
      STRATA_ASSIGN_OR_RETURN(
          state_pool_,
          PinnedArena::CarvePool(*arena_, AlignUp(LargestStateBlockBytes(plan_in), kIoAlign),
                                 buffers, "optimizer.pinned_buffers (state)"));
    }
    if (AnyOnNvme(host_split_.grads)) {
      STRATA_ASSIGN_OR_RETURN(
          grad_pool_, PinnedArena::CarvePool(*arena_, sizes_.Grad(layout_.max_subgroup_numel),
                                             buffers, "optimizer.pinned_buffers (gradients)"));
    }
  }
  TierManagerOptions to;
  to.device = device_;
  to.arena = arena_.get();
  to.io = io_.get();
  to.verify_checksums = opt_.swap_checksums;
  auto policy = std::make_unique<FutureUsePolicy>();
  future_policy_ = policy.get();
  to.policy = std::move(policy);
  STRATA_ASSIGN_OR_RETURN(tm_, TierManager::Create(std::move(to)));
  groups_.resize(layout_.groups.size());
  subgroups_.resize(layout_.subgroups.size());
  return Status::Ok();
}

Result<SwapSpace*> StateStore::SwapFor(const std::string& path, const char* key) {
  if (path.empty()) return InvalidArgumentError(std::string(key) + " is required for nvme");
  auto it = swap_by_path_.find(path);
  if (it != swap_by_path_.end()) return it->second;
  SwapSpaceOptions so;
  // Ranks share nvme_path (one machine, one disk): each keeps its files in its own directory.
  so.nvme_path = path;
  if (layout_.world > 1) {
    so.nvme_path = path + "/rank" + std::to_string(layout_.rank);
    if (mkdir(so.nvme_path.c_str(), 0700) == 0) {
      rank_dir_ = so.nvme_path;
    } else if (errno != EEXIST) {
      return IoErrorFromErrno(errno, std::string(key) + " = " + path + ": mkdir " + so.nvme_path);
    }
  }
  so.keep_files = opt_.keep_swap_files;
  so.handle_signals = opt_.swap_signal_handlers;
  so.use_direct = opt_.io.use_direct;
  so.require_direct = opt_.io.require_direct;
  auto swap = SwapSpace::Create(so);
  if (!swap.ok()) return swap.status().WithContext(std::string(key) + " = " + path);
  // Before anything is written: a disk that cannot hold the state would fill up mid-run.
  // (Both paths on one filesystem: the need of the other counts too.)
  uint64_t need = 0;
  struct stat here {};
  if (::stat(so.nvme_path.c_str(), &here) == 0 &&
      nvme_checked_devices_.insert(here.st_dev).second) {
    for (const auto& [p, bytes] : nvme_need_) {
      struct stat st {};
      if (p == path || (!p.empty() && ::stat(p.c_str(), &st) == 0 && st.st_dev == here.st_dev)) {
        need += bytes;
      }
    }
  }
  struct statvfs vfs {};
  if (need > 0 && ::statvfs(so.nvme_path.c_str(), &vfs) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (need > free_bytes) {
      return DiskSpaceError(std::string(key) + " = " + path, need, free_bytes);
    }
  }
  swaps_.push_back(std::move(*swap));
  swap_by_path_[path] = swaps_.back().get();
  return swaps_.back().get();
}

void StateStore::WriteInitialParams(const ParamGroup& g, void* dst) const {
  for (const ParamSlot& p : g.params) {
    torch::Tensor src = p.var.detach().contiguous();
    const float* f = src.data_ptr<float>();
    if (opt_.precision == DType::kBFloat16) {
      auto* d = static_cast<uint16_t*>(dst) + p.offset;
      for (uint64_t i = 0; i < p.numel; ++i) d[i] = cpu_optimizer::FloatToBf16(f[i]);
    } else if (opt_.precision == DType::kFloat16) {
      auto* d = static_cast<uint16_t*>(dst) + p.offset;
      for (uint64_t i = 0; i < p.numel; ++i) d[i] = cpu_optimizer::FloatToHalf(f[i]);
    } else {
      std::memcpy(static_cast<float*>(dst) + p.offset, f, p.numel * 4);
    }
  }
}

void StateStore::CopyInitialFp32(const ParamGroup& g, uint64_t begin, uint64_t n,
                                 float* dst) const {
  for (const ParamSlot& p : g.params) {
    const uint64_t lo = std::max(begin, p.offset), hi = std::min(begin + n, p.offset + p.numel);
    if (lo >= hi) continue;
    torch::Tensor src = p.var.detach().contiguous();
    const float* from = src.data_ptr<float>() + (lo - p.offset);
    if (opt_.precision == DType::kFloat16) {  // masters from the fp16 parameters, as DeepSpeed's
      for (uint64_t i = 0; i < hi - lo; ++i) {
        dst[lo - begin + i] = cpu_optimizer::HalfToFloat(cpu_optimizer::FloatToHalf(from[i]));
      }
    } else {
      std::memcpy(dst + (lo - begin), from, (hi - lo) * sizeof(float));
    }
  }
}

Status StateStore::InitBlocks(const cpu_optimizer::CpuOptimizer& optimizer,
                              cpu_optimizer::OptimizerType type) {
  SwapSpace* param_swap = nullptr;
  SwapSpace* opt_swap = nullptr;
  if (opt_.params == Home::kNvme) {
    STRATA_ASSIGN_OR_RETURN(
        param_swap, SwapFor(opt_.param_nvme_path, "zero_optimization.offload_param.nvme_path"));
  }
  if (opt_.optimizer == Home::kNvme) {
    STRATA_ASSIGN_OR_RETURN(opt_swap, SwapFor(opt_.optimizer_nvme_path,
                                              "zero_optimization.offload_optimizer.nvme_path"));
  }
  for (int gi = 0; gi < static_cast<int>(layout_.groups.size()); ++gi) {
    STRATA_RETURN_IF_ERROR(InitGroup(gi, param_swap, opt_swap, optimizer, type));
  }
  return Status::Ok();
}

Status StateStore::InitGroup(int gi, SwapSpace* param_swap, SwapSpace* opt_swap,
                             const cpu_optimizer::CpuOptimizer& optimizer,
                             cpu_optimizer::OptimizerType type) {
  const ParamGroup& g = layout_.groups[gi];
  GroupBlock& gb = groups_[gi];
  if (g.unit && opt_.initialize_unit) {
    torch::NoGradGuard no_grad;
    STRATA_RETURN_IF_ERROR(opt_.initialize_unit(gi));
  }
  if (g.numel == 0) return Status::Ok();
  // Device homes: the whole padded block; offloaded: this rank's slice (all of it at world 1).
  const uint64_t block_numel = g.home == Home::kDevice ? g.gathered() : g.part;
  const uint64_t bytes = block_numel * sizes_.compute_bytes;
  const std::string pname = "param/" + g.name;
  if (g.home == Home::kNvme) {
    STRATA_ASSIGN_OR_RETURN(SwapExtent e, param_swap->Allocate(pname, "params", bytes));
    NvmeLocation loc{e.fd, e.offset, e.padded_length};
    STRATA_ASSIGN_OR_RETURN(gb.block, tm_->AddBlock(pname, bytes, &loc, false, param_pool_.get()));
  } else {
    STRATA_ASSIGN_OR_RETURN(gb.block, tm_->AddBlock(pname, bytes));
  }
  // Initial values at the home tier.
  if (g.home == Home::kDevice) {
    STRATA_ASSIGN_OR_RETURN(Pin pin,
                            tm_->Acquire(gb.block, Tier::kDevice, TierManager::Access::kOverwrite));
    STRATA_RETURN_IF_ERROR(pin.Wait());
    std::vector<std::byte> host(bytes);  // zeros: the padding
    WriteInitialParams(g, host.data());
    STRATA_RETURN_IF_ERROR(
        device_->CopyAsync(pin.data(), host.data(), host.size(), CopyKind::kHostToDevice, *h2d_));
    STRATA_RETURN_IF_ERROR(device_->Synchronize(*h2d_));
    pin.MarkDirty();
    gb.home_pin = std::move(pin);
  } else {
    STRATA_ASSIGN_OR_RETURN(Pin pin,
                            tm_->Acquire(gb.block, Tier::kPinned, TierManager::Access::kOverwrite));
    STRATA_RETURN_IF_ERROR(pin.Wait());
    if (g.world == 1) {
      WriteInitialParams(g, pin.data());
    } else {  // the whole group, then this rank's slice of it (padding zeros)
      std::vector<std::byte> whole(g.gathered() * sizes_.compute_bytes);
      WriteInitialParams(g, whole.data());
      std::memcpy(pin.data(), whole.data() + g.own_begin * sizes_.compute_bytes, bytes);
    }
    pin.MarkDirty();
    if (g.home == Home::kNvme) {
      STRATA_RETURN_IF_ERROR(tm_->Flush(gb.block));
    } else {
      gb.home_pin = std::move(pin);
    }
  }
  // Inference: no optimizer state and no gradient accumulators (options.h).
  for (const int si : opt_.inference ? std::vector<int>{} : g.subgroups) {
    const SubGroupSpan& sg = layout_.subgroups[si];
    SubGroupBlocks& sb = subgroups_[si];
    const std::string base = g.name + "/" + std::to_string(sg.begin);
    // master_in_params: the master is the parameter block just written; the state holds the
    // moments only.
    const uint64_t sbytes = sg.numel * sizes_.StateElementBytes(g.master_in_params);
    const uint64_t gbytes = sg.numel * 4;
    // On NVMe unless the host-RAM tier keeps the block: then it is registered without an NVMe
    // home (its flushes are no-ops) and its pinned copy is held for the run, as a cpu home's.
    const bool state_on_nvme = opt_.optimizer == Home::kNvme && host_split_.state[si] == 0;
    const bool grad_on_nvme = opt_.optimizer == Home::kNvme && host_split_.grads[si] == 0;
    if (state_on_nvme) {
      STRATA_ASSIGN_OR_RETURN(SwapExtent se,
                              opt_swap->Allocate("state/" + base, "optimizer", sbytes));
      NvmeLocation sl{se.fd, se.offset, se.padded_length};
      STRATA_ASSIGN_OR_RETURN(
          sb.state, tm_->AddBlock("state/" + base, sbytes, &sl, false, state_pool_.get()));
    } else {
      STRATA_ASSIGN_OR_RETURN(sb.state, tm_->AddBlock("state/" + base, sbytes));
    }
    if (grad_on_nvme) {
      STRATA_ASSIGN_OR_RETURN(SwapExtent ge,
                              opt_swap->Allocate("grad/" + base, "gradients", gbytes));
      NvmeLocation gl{ge.fd, ge.offset, ge.padded_length};
      STRATA_ASSIGN_OR_RETURN(sb.grad,
                              tm_->AddBlock("grad/" + base, gbytes, &gl, false, grad_pool_.get()));
    } else {
      STRATA_ASSIGN_OR_RETURN(sb.grad, tm_->AddBlock("grad/" + base, gbytes));
    }
    STRATA_ASSIGN_OR_RETURN(Pin pin,
                            tm_->Acquire(sb.state, Tier::kPinned, TierManager::Access::kOverwrite));
    STRATA_RETURN_IF_ERROR(pin.Wait());
    auto* state = static_cast<float*>(pin.data());
    // InitState writes the moments only; master and gradients must be valid pointers.
    if (g.master_in_params) {
      STRATA_RETURN_IF_ERROR(
          optimizer.InitState(StateSpan(type, sg.numel, state, state, state, opt_.moment_dtype)));
    } else {
      CopyInitialFp32(g, sg.begin, sg.numel, state);
      STRATA_RETURN_IF_ERROR(optimizer.InitState(
          StateSpan(type, sg.numel, state, state + sg.numel, state, opt_.moment_dtype)));
    }
    pin.MarkDirty();
    if (state_on_nvme) {
      STRATA_RETURN_IF_ERROR(tm_->Flush(sb.state));
    } else {
      sb.state_home_pin = std::move(pin);
    }
    if (!grad_on_nvme) {
      STRATA_ASSIGN_OR_RETURN(
          sb.grad_home_pin, tm_->Acquire(sb.grad, Tier::kPinned, TierManager::Access::kOverwrite));
      std::memset(sb.grad_home_pin.data(), 0, gbytes);
      sb.grad_home_pin.MarkDirty();
    }
  }
  // Point the parameters at their storage (device homes) or drop their values (offloaded).
  torch::NoGradGuard no_grad;
  for (const ParamSlot& p : g.params) {
    torch::Tensor var = p.var;
    var.set_data(g.home == Home::kDevice ? ViewOf(p, gb.home_pin.data()) : Empty());
  }
  // Host memory must not grow with the model (ARCHITECTURE.md §1): the unit's initial values just
  // freed may sit in glibc's heap (its mmap threshold rises as large blocks are freed), where
  // longer-lived small blocks would keep their pages resident; give the free pages back. Loading
  // 32 layers peaked at 1.9x 4 layers without it (tests/integration/hf_rss_test.cc).
  if (g.unit && g.home != Home::kDevice) malloc_trim(0);
  return Status::Ok();
}

}  // namespace strata::runtime
