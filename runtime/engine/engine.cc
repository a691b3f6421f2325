// The training engine.
//
// Layout. Every trainable parameter belongs to one group: the offload unit that contains it, or
// the resident group (parameters outside units, and unit parameters with at most
// persistence_threshold elements). A group's parameters are laid out back to back in one flat
// block (fp32 here) in the TierManager: resident and device-home groups keep a permanent device
// copy that the parameter tensors view; cpu-home unit blocks keep a permanent pinned copy; NVMe-home
// unit blocks live on NVMe and are fetched through a pinned slot. Each group's flat range is cut
// into optimizer sub-groups of at most sub_group_size elements; a sub-group has a state block
// (fp32 master, then the optimizer moments) and an fp32 gradient block, both at the optimizer's
// home (pinned, or NVMe through pinned).
//
// Forward/backward. A unit's Gather pins its block on the device and points its parameters at it;
// the coordinator records the order of gathers in the first pass and afterwards prefetches along
// it (device copies for the next units within the prefetch and live budgets, pinned copies
// further ahead), and feeds the upcoming order to the FutureUsePolicy that picks eviction victims.
// A gather that does not match the recorded order stops prefetching for the pass and the order is
// re-recorded at its end (with a warning) instead of failing.
//
// Gradients. When a unit's backward ends its gradients are copied device -> pinned staging (two
// staging slots, so the backward of the next unit overlaps), and the hand-off thread adds them
// into the fp32 gradient blocks (overwrite on the first micro-batch), computes each sub-group's sum
// of squares at the last micro-batch, and writes them to NVMe when the optimizer lives there.
//
// Step. Global norm = sqrt(sum of the sub-group sums, in sub-group order); the clip coefficient
// and 1/loss_scale fold into the optimizer's gradient multiplier. Sub-groups then flow through
// read(g+1) (TierManager prefetch) ∥ CPU optimizer(g) (this thread) ∥ write(g-1) (write-behind
// thread flushing state and parameter blocks to NVMe). The updated parameters go straight into the
// pinned copy of the unit's block (cpu/NVMe homes) or through a pinned staging slot and an
// asynchronous host-to-device copy (device homes).
#include "runtime/engine/engine.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/logging.h"
#include "base/trace.h"
#include "runtime/plan/memory_plan.h"
#include "runtime/engine/offload_unit.h"
#include "runtime/persist/safetensors.h"
#include "swap/swap_space.h"
#include "tiers/host_device.h"
#include "tiers/pinned_arena.h"

namespace strata::runtime {

namespace {

constexpr uint64_t kAlign = 4096;

int StateArrays(cpu_optimizer::OptimizerType type) {
  using cpu_optimizer::OptimizerType;
  // fp32 master plus the moments: Adam/AdamW m and v; Adagrad the sum; Lion m.
  return (type == OptimizerType::kAdam || type == OptimizerType::kAdamW) ? 3 : 2;
}

}  // namespace

// ---- Engine::Impl: the offload machinery -----------------------------------------------------

struct Engine::Impl {
  struct ParamSlot {
    std::string name;
    torch::Tensor var;  // the model's parameter
    std::vector<int64_t> shape;
    uint64_t numel = 0;
    uint64_t offset = 0;  // elements into the group's flat block
  };
  struct SubGroup {
    int group = 0;
    uint64_t begin = 0;  // elements into the group's flat block
    uint64_t numel = 0;
    BlockId state = 0;
    BlockId grad = 0;
    Pin state_home_pin;  // cpu home: keeps the copy resident
    Pin grad_home_pin;
    int micro_batches = 0;  // gradients accumulated since the last step (hand-off thread)
    double sumsq = 0;       // of the accumulated gradient, at the boundary
  };
  struct Group {
    std::string name;
    bool unit = false;
    Home home = Home::kDevice;  // where the flat parameter block lives
    std::vector<ParamSlot> params;
    uint64_t numel = 0;
    BlockId block = 0;
    Pin home_pin;      // device home: the device copy; cpu home: the pinned copy
    Pin gathered;      // while a unit is gathered (nvme/cpu homes)
    int gather_depth = 0;
    std::vector<int> subgroups;
  };
  struct GradTarget {  // for each entry of a unit's GradParameters
    bool resident = false;
    int slot = -1;  // index into the owning group's params
  };
  struct GradJob {
    int group = 0;
    int staging = 0;
    bool boundary = false;
    Event copied;
    std::vector<torch::Tensor> keep_alive;
  };
  struct WriteJob {
    std::vector<Pin> pins;  // flushed (if the block has an NVMe home) then released
  };

  Engine* engine = nullptr;
  const EngineOptions* opt = nullptr;
  cpu_optimizer::OptimizerType opt_type{};
  std::optional<cpu_optimizer::CpuOptimizer> cpu_opt;
  int state_arrays = 3;

  std::unique_ptr<HostDevice> owned_device;
  DeviceBackend* device = nullptr;
  std::unique_ptr<Stream> h2d, d2h;
  std::unique_ptr<IoBackend> io;
  std::vector<std::unique_ptr<SwapSpace>> swaps;  // one per distinct nvme_path
  std::map<std::string, SwapSpace*> swap_by_path;
  std::unique_ptr<PinnedArena> arena;
  std::unique_ptr<TierManager> tm;
  FutureUsePolicy* future_policy = nullptr;

  std::vector<Group> groups;  // units first (index = unit index), the resident group last
  int resident_group = -1;
  std::vector<SubGroup> subgroups;
  std::vector<std::vector<torch::Tensor>> unit_grad_params;
  std::vector<std::vector<GradTarget>> unit_grad_targets;
  uint64_t max_unit_numel = 0;
  uint64_t max_subgroup_numel = 0;
  uint64_t device_slots = 0;  // unit blocks the device budget holds besides the resident ones

  // Staging for device -> host gradient copies and host -> device parameter updates.
  std::vector<PinnedBuffer> grad_staging;
  std::vector<bool> grad_staging_busy;  // guarded by mu
  std::vector<PinnedBuffer> update_staging;
  std::vector<Event> update_staging_done;

  // Hand-off thread.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<GradJob> grad_jobs;  // guarded by mu
  int grad_jobs_running = 0;      // guarded by mu
  Status grad_error;              // guarded by mu
  std::deque<WriteJob> write_jobs;
  int write_jobs_running = 0;
  Status write_error;
  bool stopping = false;
  std::thread grad_thread, write_thread;

  // Coordinator (training thread only).
  std::vector<int> trace;  // unit gather order of one pass
  bool trace_valid = false;
  bool pass_diverged = false;
  std::vector<int> pass;
  size_t pos = 0;
  int warned_divergence = 0;
  double gather_wait_seconds = 0;

  // The Status behind the last c10::Error thrown out of a hook (training thread), so that it can
  // leave the engine with its code intact (ErrorFromException).
  Status boundary_error;

  ~Impl() { Stop(); }

  // Throws `s` across the libtorch boundary (hooks run inside torch's forward/backward).
  [[noreturn]] void Throw(Status s) {
    boundary_error = s;
    TORCH_CHECK(false, s.ToString());
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    if (grad_thread.joinable()) grad_thread.join();
    if (write_thread.joinable()) write_thread.join();
  }

  // Parameter blocks (and the device copies torch computes with) are fp32, or bf16 with
  // options.bf16 (the fp32 master then lives only in the optimizer state).
  uint64_t c_bytes() const { return opt->bf16 ? 2 : 4; }
  torch::ScalarType cdtype() const { return opt->bf16 ? torch::kBFloat16 : torch::kFloat32; }

  // Group g's initial parameter values in the compute dtype, laid out flat at `dst`.
  void WriteInitialParams(const Group& g, void* dst) const {
    for (const ParamSlot& p : g.params) {
      torch::Tensor src = p.var.detach().contiguous();
      const float* f = src.data_ptr<float>();
      if (opt->bf16) {
        auto* d = static_cast<uint16_t*>(dst) + p.offset;
        for (uint64_t i = 0; i < p.numel; ++i) d[i] = cpu_optimizer::FloatToBf16(f[i]);
      } else {
        std::memcpy(static_cast<float*>(dst) + p.offset, f, p.numel * 4);
      }
    }
  }

  // -- construction ------------------------------------------------------------------------

  Status Partition(torch::nn::Module& model) {
    std::vector<std::pair<std::string, OffloadUnitImpl*>> units;
    for (const auto& item : model.named_modules()) {
      if (auto* u = dynamic_cast<OffloadUnitImpl*>(item.value().get())) {
        units.emplace_back(item.key(), u);
      }
    }
    std::unordered_map<const void*, int> owner;  // parameter impl -> unit
    for (int u = 0; u < static_cast<int>(units.size()); ++u) {
      for (const auto& p : units[u].second->parameters()) {
        auto [it, inserted] = owner.emplace(p.unsafeGetTensorImpl(), u);
        if (!inserted) {
          return InvalidArgumentError("offload units " + units[it->second].first + " and " +
                                      units[u].first +
                                      " share a parameter (units must not nest or share)");
        }
      }
    }
    groups.resize(units.size() + 1);
    resident_group = static_cast<int>(units.size());
    for (size_t u = 0; u < units.size(); ++u) {
      groups[u].name = units[u].first;
      groups[u].unit = true;
      groups[u].home = opt->params;
    }
    groups[resident_group].name = "resident";
    groups[resident_group].home = Home::kDevice;
    unit_grad_params.resize(units.size());
    unit_grad_targets.resize(units.size());

    for (const auto& item : model.named_parameters()) {
      const torch::Tensor& p = item.value();
      if (!p.requires_grad()) continue;  // frozen: left alone
      if (p.scalar_type() != torch::kFloat32 || p.device().type() != torch::kCPU) {
        return InvalidArgumentError("parameter " + item.key() +
                                    " must be fp32 on the CPU when the engine starts (got " +
                                    std::string(c10::toString(p.scalar_type())) + " on " +
                                    p.device().str() + ")");
      }
      auto it = owner.find(p.unsafeGetTensorImpl());
      const int unit = it == owner.end() ? -1 : it->second;
      const bool persistent =
          unit < 0 || static_cast<uint64_t>(p.numel()) <= opt->persistence_threshold;
      Group& g = groups[persistent ? resident_group : unit];
      ParamSlot slot;
      slot.name = item.key();
      slot.var = p;
      slot.shape = p.sizes().vec();
      slot.numel = static_cast<uint64_t>(p.numel());
      slot.offset = g.numel;
      g.numel += slot.numel;
      g.params.push_back(std::move(slot));
      if (unit >= 0) {
        unit_grad_params[unit].push_back(p);
        unit_grad_targets[unit].push_back(
            {persistent, static_cast<int>(g.params.size()) - 1});
      }
    }
    for (size_t u = 0; u < units.size(); ++u) {
      max_unit_numel = std::max(max_unit_numel, groups[u].numel);
      units[u].second->Attach(engine, static_cast<int>(u));
    }
    // Sub-groups.
    for (int gi = 0; gi < static_cast<int>(groups.size()); ++gi) {
      Group& g = groups[gi];
      for (uint64_t b = 0; b < g.numel; b += opt->sub_group_size) {
        SubGroup sg;
        sg.group = gi;
        sg.begin = b;
        sg.numel = std::min<uint64_t>(opt->sub_group_size, g.numel - b);
        max_subgroup_numel = std::max(max_subgroup_numel, sg.numel);
        g.subgroups.push_back(static_cast<int>(subgroups.size()));
        subgroups.push_back(std::move(sg));
      }
    }
    return Status::Ok();
  }

  uint64_t StateBytes(uint64_t n) const { return AlignUp(n * 4 * state_arrays, kAlign); }
  uint64_t GradBytes(uint64_t n) const { return AlignUp(n * 4, kAlign); }
  uint64_t ParamBytes(uint64_t n) const { return AlignUp(n * c_bytes(), kAlign); }

  static Placement PlacementOf(Home h) {
    return h == Home::kCpu ? Placement::kCpu : h == Home::kNvme ? Placement::kNvme : Placement::kDevice;
  }

  // The host arena: runtime/memory_plan.h's plan of this partition (what `strata estimate`
  // prints), plus slack against fragmentation (first-fit extents of mixed sizes): two more
  // parameter slots and one more of each optimizer block. (A 2.5B-parameter run failed once with
  // one slot of slack: 1.2 GiB free, largest extent 255 MiB, 300 MiB needed.)
  uint64_t ArenaBytes() const {
    PlanInput in;
    for (int u = 0; u < resident_group; ++u) in.unit_numel.push_back(groups[u].numel);
    in.resident_numel = groups[resident_group].numel;
    in.compute_bytes = static_cast<int>(c_bytes());
    in.state_bytes = 4 * state_arrays;
    in.params = PlacementOf(opt->params);
    in.optimizer = PlacementOf(opt->optimizer);
    in.sub_group_size = opt->sub_group_size;
    in.param_buffer_count = opt->param_buffer_count;
    in.pipeline = opt->pipeline;
    in.io_align = kAlign;
    return PlanMemory(in).pinned_arena_bytes + 2 * ParamBytes(max_unit_numel) +
           StateBytes(max_subgroup_numel) + GradBytes(max_subgroup_numel);
  }

  Result<SwapSpace*> SwapFor(const std::string& path, const char* key) {
    if (path.empty()) return InvalidArgumentError(std::string(key) + " is required for nvme");
    auto it = swap_by_path.find(path);
    if (it != swap_by_path.end()) return it->second;
    SwapSpaceOptions so;
    so.nvme_path = path;
    so.keep_files = opt->keep_swap_files;
    so.use_direct = opt->io.use_direct;
    so.require_direct = opt->io.require_direct;
    auto swap = SwapSpace::Create(so);
    if (!swap.ok()) return swap.status().WithContext(std::string(key) + " = " + path);
    swaps.push_back(std::move(*swap));
    swap_by_path[path] = swaps.back().get();
    return swaps.back().get();
  }

  Result<NvmeLocation> NvmeFor(SwapSpace* swap, const std::string& name, const char* kind,
                               uint64_t bytes) {
    STRATA_ASSIGN_OR_RETURN(SwapExtent e, swap->Allocate(name, kind, bytes));
    return NvmeLocation{e.fd, e.offset, e.padded_length};
  }

  // Copies the flat range [begin, begin+n) of group g's initial parameter values to `dst`.
  void CopyInitial(const Group& g, uint64_t begin, uint64_t n, float* dst) const {
    for (const ParamSlot& p : g.params) {
      const uint64_t lo = std::max(begin, p.offset), hi = std::min(begin + n, p.offset + p.numel);
      if (lo >= hi) continue;
      torch::Tensor src = p.var.detach().contiguous();
      std::memcpy(dst + (lo - begin), src.data_ptr<float>() + (lo - p.offset),
                  (hi - lo) * sizeof(float));
    }
  }

  torch::Tensor ViewOf(const ParamSlot& p, void* base) const {
    auto* f = static_cast<std::byte*>(base) + p.offset * c_bytes();
    return torch::from_blob(f, p.shape,
                            torch::TensorOptions().dtype(cdtype()).device(opt->torch_device));
  }
  torch::Tensor Empty() const {
    return torch::empty({0}, torch::TensorOptions().dtype(cdtype()).device(opt->torch_device));
  }

  Status Setup(torch::nn::Module& model) {
    auto type = opt->optimizer_options.type;
    opt_type = type;
    state_arrays = StateArrays(type);
    STRATA_ASSIGN_OR_RETURN(auto created, cpu_optimizer::CpuOptimizer::Create(opt->optimizer_options));
    cpu_opt.emplace(created);
    STRATA_RETURN_IF_ERROR(Partition(model));

    uint64_t total_param_bytes = ParamBytes(groups[resident_group].numel);
    for (int u = 0; u < resident_group; ++u) total_param_bytes += ParamBytes(groups[u].numel);
    if (opt->device != nullptr) {
      device = opt->device;
    } else {
      HostDeviceOptions ho;
      ho.budget_bytes = opt->device_budget != 0 ? opt->device_budget
                                                : total_param_bytes + (64ull << 20);
      owned_device = std::make_unique<HostDevice>(ho);
      device = owned_device.get();
    }
    const uint64_t device_budget = device->info().budget_bytes;
    uint64_t device_fixed = ParamBytes(groups[resident_group].numel);
    if (opt->params == Home::kDevice) {
      for (int u = 0; u < resident_group; ++u) device_fixed += ParamBytes(groups[u].numel);
      if (device_fixed > device_budget) {
        return ResourceExhaustedError(
            "the device budget (" + FormatBytes(device_budget) + ") cannot hold the parameters (" +
            FormatBytes(device_fixed) + "): set zero_optimization.offload_param.device to cpu or nvme");
      }
    } else if (resident_group > 0) {
      const uint64_t unit_bytes = ParamBytes(max_unit_numel);
      if (device_fixed + unit_bytes > device_budget) {
        return ResourceExhaustedError(
            "the device budget (" + FormatBytes(device_budget) +
            ") cannot hold the resident parameters (" + FormatBytes(device_fixed) +
            ") plus the largest offload unit (" + FormatBytes(unit_bytes) + ")");
      }
      device_slots = (device_budget - device_fixed) / unit_bytes;
    }
    STRATA_ASSIGN_OR_RETURN(h2d, device->CreateStream("engine-h2d"));
    STRATA_ASSIGN_OR_RETURN(d2h, device->CreateStream("engine-d2h"));

    const bool any_nvme = opt->params == Home::kNvme || opt->optimizer == Home::kNvme;
    if (any_nvme) {
      const std::string& probe =
          opt->optimizer == Home::kNvme ? opt->optimizer_nvme_path : opt->param_nvme_path;
      STRATA_ASSIGN_OR_RETURN(io, OpenIoBackend(opt->io_backend, opt->io, probe));
    }
    PinnedArenaOptions ao;
    ao.bytes = opt->pinned_bytes != 0 ? opt->pinned_bytes : ArenaBytes();
    ao.budget_key = "pinned host arena (sized from the model and zero_optimization)";
    ao.lock = opt->pin_memory;
    ao.device = device;
    STRATA_ASSIGN_OR_RETURN(arena, PinnedArena::Create(ao));
    TierManagerOptions to;
    to.device = device;
    to.arena = arena.get();
    to.io = io.get();
    auto policy = std::make_unique<FutureUsePolicy>();
    future_policy = policy.get();
    to.policy = std::move(policy);
    STRATA_ASSIGN_OR_RETURN(tm, TierManager::Create(std::move(to)));

    // Staging buffers.
    const uint64_t max_group = std::max(max_unit_numel, groups[resident_group].numel);
    for (int i = 0; i < 2; ++i) {
      if (max_group > 0) {
        STRATA_ASSIGN_OR_RETURN(PinnedBuffer b, arena->Allocate(ParamBytes(max_group)));
        grad_staging.push_back(std::move(b));
        grad_staging_busy.push_back(false);
      }
      if (max_subgroup_numel > 0) {
        STRATA_ASSIGN_OR_RETURN(PinnedBuffer b, arena->Allocate(ParamBytes(max_subgroup_numel)));
        update_staging.push_back(std::move(b));
        update_staging_done.emplace_back();
      }
    }

    // Parameter blocks.
    SwapSpace* param_swap = nullptr;
    SwapSpace* opt_swap = nullptr;
    if (opt->params == Home::kNvme) {
      STRATA_ASSIGN_OR_RETURN(param_swap,
                              SwapFor(opt->param_nvme_path, "zero_optimization.offload_param.nvme_path"));
    }
    if (opt->optimizer == Home::kNvme) {
      STRATA_ASSIGN_OR_RETURN(
          opt_swap, SwapFor(opt->optimizer_nvme_path, "zero_optimization.offload_optimizer.nvme_path"));
    }
    for (int gi = 0; gi < static_cast<int>(groups.size()); ++gi) {
      Group& g = groups[gi];
      if (g.unit && opt->initialize_unit) {
        torch::NoGradGuard no_grad;
        opt->initialize_unit(gi);
      }
      if (g.numel == 0) continue;
      const uint64_t bytes = g.numel * c_bytes();
      if (g.home == Home::kNvme) {
        STRATA_ASSIGN_OR_RETURN(NvmeLocation loc,
                                NvmeFor(param_swap, "param/" + g.name, "params", bytes));
        STRATA_ASSIGN_OR_RETURN(g.block, tm->AddBlock("param/" + g.name, bytes, &loc));
      } else {
        STRATA_ASSIGN_OR_RETURN(g.block, tm->AddBlock("param/" + g.name, bytes));
      }
      // Initial values.
      const Tier tier = g.home == Home::kDevice ? Tier::kDevice : Tier::kPinned;
      if (tier == Tier::kDevice) {
        STRATA_ASSIGN_OR_RETURN(Pin pin, tm->Acquire(g.block, Tier::kDevice,
                                                     TierManager::Access::kOverwrite));
        STRATA_RETURN_IF_ERROR(pin.Wait());
        std::vector<std::byte> host(g.numel * c_bytes());
        WriteInitialParams(g, host.data());
        STRATA_RETURN_IF_ERROR(device->CopyAsync(pin.data(), host.data(), host.size(),
                                                 CopyKind::kHostToDevice, *h2d));
        STRATA_RETURN_IF_ERROR(device->Synchronize(*h2d));
        pin.MarkDirty();
        g.home_pin = std::move(pin);
      } else {
        STRATA_ASSIGN_OR_RETURN(Pin pin, tm->Acquire(g.block, Tier::kPinned,
                                                     TierManager::Access::kOverwrite));
        STRATA_RETURN_IF_ERROR(pin.Wait());
        WriteInitialParams(g, pin.data());
        pin.MarkDirty();
        if (g.home == Home::kNvme) {
          STRATA_RETURN_IF_ERROR(tm->Flush(g.block));
        } else {
          g.home_pin = std::move(pin);
        }
      }
      for (const int si : g.subgroups) {
        SubGroup& sg = subgroups[si];
        const std::string base = g.name + "/" + std::to_string(sg.begin);
        const uint64_t sbytes = sg.numel * 4 * state_arrays, gbytes = sg.numel * 4;
        if (opt->optimizer == Home::kNvme) {
          STRATA_ASSIGN_OR_RETURN(NvmeLocation sl,
                                  NvmeFor(opt_swap, "state/" + base, "optimizer", sbytes));
          STRATA_ASSIGN_OR_RETURN(NvmeLocation gl,
                                  NvmeFor(opt_swap, "grad/" + base, "gradients", gbytes));
          STRATA_ASSIGN_OR_RETURN(sg.state, tm->AddBlock("state/" + base, sbytes, &sl));
          STRATA_ASSIGN_OR_RETURN(sg.grad, tm->AddBlock("grad/" + base, gbytes, &gl));
        } else {
          STRATA_ASSIGN_OR_RETURN(sg.state, tm->AddBlock("state/" + base, sbytes));
          STRATA_ASSIGN_OR_RETURN(sg.grad, tm->AddBlock("grad/" + base, gbytes));
        }
        STRATA_ASSIGN_OR_RETURN(Pin pin, tm->Acquire(sg.state, Tier::kPinned,
                                                     TierManager::Access::kOverwrite));
        STRATA_RETURN_IF_ERROR(pin.Wait());
        auto* master = static_cast<float*>(pin.data());
        CopyInitial(g, sg.begin, sg.numel, master);
        // InitState reads no gradients but wants a valid span: point them at the master.
        STRATA_RETURN_IF_ERROR(cpu_opt->InitState(Span(sg, master, master)));
        pin.MarkDirty();
        if (opt->optimizer == Home::kNvme) {
          STRATA_RETURN_IF_ERROR(tm->Flush(sg.state));
        } else {
          sg.state_home_pin = std::move(pin);
          STRATA_ASSIGN_OR_RETURN(sg.grad_home_pin, tm->Acquire(sg.grad, Tier::kPinned,
                                                                TierManager::Access::kOverwrite));
          std::memset(sg.grad_home_pin.data(), 0, gbytes);
          sg.grad_home_pin.MarkDirty();
        }
      }
      // Point the parameters at their storage (device homes) or drop their values (offloaded).
      for (ParamSlot& p : g.params) {
        torch::NoGradGuard no_grad;
        p.var.set_data(g.home == Home::kDevice ? ViewOf(p, g.home_pin.data()) : Empty());
      }
    }
    grad_thread = std::thread([this] { GradLoop(); });
    write_thread = std::thread([this] { WriteLoop(); });
    return Status::Ok();
  }

  cpu_optimizer::FlatSpan Span(const SubGroup& sg, float* state, const void* grads) const {
    cpu_optimizer::FlatSpan s;
    s.numel = sg.numel;
    s.params = state;
    float* next = state + sg.numel;
    using cpu_optimizer::OptimizerType;
    if (opt_type == OptimizerType::kAdam || opt_type == OptimizerType::kAdamW) {
      s.exp_avg = next;
      s.exp_avg_sq = next + sg.numel;
    } else if (opt_type == OptimizerType::kLion) {
      s.exp_avg = next;
    } else {
      s.exp_avg_sq = next;
    }
    s.grads = grads;
    return s;
  }

  // -- gather / release (training thread) ---------------------------------------------------

  void Gather(int u, bool tracked) {
    Group& g = groups[u];
    if (tracked) Coordinate(u);
    if (g.home == Home::kDevice || g.numel == 0) return;
    if (g.gather_depth++ > 0) return;
    Stopwatch watch;
    TraceSpan span("params", "gather " + g.name);
    auto pin = tm->Acquire(g.block, Tier::kDevice, TierManager::Access::kRead);
    if (!pin.ok()) Throw(pin.status().WithContext("gathering " + g.name));
    Status s = pin->Wait();
    if (!s.ok()) Throw(s.WithContext("gathering " + g.name));
    gather_wait_seconds += watch.Seconds();
    torch::NoGradGuard no_grad;
    for (ParamSlot& p : g.params) p.var.set_data(ViewOf(p, pin->data()));
    g.gathered = std::move(*pin);
  }

  void Release(int u) {
    Group& g = groups[u];
    if (g.home == Home::kDevice || g.numel == 0) return;
    if (--g.gather_depth > 0) return;
    torch::NoGradGuard no_grad;
    for (ParamSlot& p : g.params) p.var.set_data(Empty());
    g.gathered.Release();
  }

  // Records the gather order and prefetches along the recorded one.
  void Coordinate(int u) {
    pass.push_back(u);
    if (!trace_valid || pass_diverged) return;
    if (pos < trace.size() && trace[pos] == u) {
      ++pos;
      Prefetch();
      return;
    }
    pass_diverged = true;
    if (warned_divergence++ < 3) {
      STRATA_LOG(kWarning) << "offload units ran in a new order (position " << pass.size() - 1
                           << ": expected "
                           << (pos < trace.size() ? groups[trace[pos]].name : "the end")
                           << ", got " << groups[u].name
                           << "); prefetching stops for this pass and the order is re-recorded";
    }
  }

  void Prefetch() {
    if (opt->params == Home::kDevice) return;
    std::vector<BlockId> upcoming;
    for (size_t i = pos; i < trace.size() && upcoming.size() < 4 * (device_slots + 2); ++i) {
      upcoming.push_back(groups[trace[i]].block);
    }
    future_policy->SetUpcoming(upcoming);
    // Device copies: the next units, within the prefetch bucket, the live limit and the slots
    // left besides the one in use. Pinned copies (NVMe homes): twice as far ahead.
    const uint64_t device_limit = std::min<uint64_t>(opt->prefetch_bucket_size,
                                                     opt->max_live_parameters);
    const uint64_t pinned_slots =
        opt->params == Home::kNvme
            ? std::max<uint64_t>(2, opt->param_buffer_count) - 1
            : std::numeric_limits<uint64_t>::max();
    uint64_t dev_elems = 0, dev_units = 0, pin_units = 0;
    std::vector<int> seen;
    for (size_t i = pos; i < trace.size(); ++i) {
      const int u = trace[i];
      if (std::find(seen.begin(), seen.end(), u) != seen.end()) continue;
      seen.push_back(u);
      const Group& g = groups[u];
      if (g.numel == 0) continue;
      const bool to_device = dev_units + 1 < device_slots && dev_elems + g.numel <= device_limit;
      if (to_device) {
        dev_elems += g.numel;
        ++dev_units;
        ++pin_units;
        (void)tm->Prefetch(g.block, Tier::kDevice);  // best effort
      } else if (opt->params == Home::kNvme && pin_units < pinned_slots &&
                 dev_elems + g.numel <= 2 * std::max<uint64_t>(device_limit, g.numel)) {
        dev_elems += g.numel;
        ++pin_units;
        (void)tm->Prefetch(g.block, Tier::kPinned);
      } else {
        break;
      }
    }
  }

  void EndPass() {
    if (!trace_valid || pass_diverged || pos != trace.size()) {
      if (trace_valid && !pass_diverged && pos != trace.size() && warned_divergence++ < 3) {
        STRATA_LOG(kWarning) << "the pass gathered " << pass.size() << " units, the recorded one "
                             << trace.size() << "; re-recording";
      }
      trace = pass;
      trace_valid = !trace.empty();
    }
    pass.clear();
    pass_diverged = false;
    pos = 0;
  }

  // -- gradient hand-off ----------------------------------------------------------------------

  int AcquireStaging() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      for (size_t i = 0; i < grad_staging_busy.size(); ++i) {
        if (!grad_staging_busy[i]) {
          grad_staging_busy[i] = true;
          return static_cast<int>(i);
        }
      }
      cv.wait(lock);
    }
  }

  // Queues the device -> host copies of group `gi`'s gradients (aligned with its params; an
  // undefined gradient counts as zeros) and hands them to the hand-off thread.
  void SubmitGradients(int gi, std::vector<torch::Tensor> grads, bool boundary) {
    Group& g = groups[gi];
    if (g.numel == 0) return;
    const int slot = AcquireStaging();
    std::byte* staging = grad_staging[slot].data();
    const uint64_t c = c_bytes();
    GradJob job;
    job.group = gi;
    job.staging = slot;
    job.boundary = boundary;
    for (size_t i = 0; i < g.params.size(); ++i) {
      const ParamSlot& p = g.params[i];
      if (!grads[i].defined()) {
        std::memset(staging + p.offset * c, 0, p.numel * c);
        continue;
      }
      torch::Tensor t = grads[i].contiguous();
      TORCH_CHECK(t.scalar_type() == cdtype(), "gradient of ", p.name, " is ", t.scalar_type(),
                  ", expected ", cdtype());
      Status s = device->CopyAsync(staging + p.offset * c, t.data_ptr(), p.numel * c,
                                   CopyKind::kDeviceToHost, *d2h);
      if (!s.ok()) Throw(s.WithContext("copying the gradient of " + p.name));
      job.keep_alive.push_back(std::move(t));
    }
    auto ev = device->RecordEvent(*d2h);
    if (!ev.ok()) Throw(ev.status());
    job.copied = *ev;
    {
      std::lock_guard<std::mutex> lock(mu);
      grad_jobs.push_back(std::move(job));
    }
    cv.notify_all();
  }

  void GradLoop() {
    for (;;) {
      GradJob job;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopping || !grad_jobs.empty(); });
        if (grad_jobs.empty()) return;
        job = std::move(grad_jobs.front());
        grad_jobs.pop_front();
        ++grad_jobs_running;
      }
      Status s = AccumulateJob(job);
      {
        std::lock_guard<std::mutex> lock(mu);
        grad_staging_busy[job.staging] = false;
        --grad_jobs_running;
        if (!s.ok() && grad_error.ok()) grad_error = s;
      }
      cv.notify_all();
    }
  }

  Status AccumulateJob(GradJob& job) {
    STRATA_RETURN_IF_ERROR(job.copied.Wait());
    job.keep_alive.clear();
    const Group& g = groups[job.group];
    TraceSpan span("gradients", "hand-off " + g.name);
    const std::byte* staging = grad_staging[job.staging].data();
    for (const int si : g.subgroups) {
      SubGroup& sg = subgroups[si];
      const bool first = sg.micro_batches == 0;
      STRATA_ASSIGN_OR_RETURN(
          Pin pin, tm->Acquire(sg.grad, Tier::kPinned,
                               first ? TierManager::Access::kOverwrite
                                     : TierManager::Access::kWrite));
      STRATA_RETURN_IF_ERROR(pin.Wait());
      auto* acc = static_cast<float*>(pin.data());
      if (opt->bf16) {  // widen to fp32 (exact), accumulate in fp32
        const auto* src = reinterpret_cast<const uint16_t*>(staging) + sg.begin;
        if (first) {
          for (uint64_t i = 0; i < sg.numel; ++i) acc[i] = cpu_optimizer::Bf16ToFloat(src[i]);
        } else {
          for (uint64_t i = 0; i < sg.numel; ++i) acc[i] += cpu_optimizer::Bf16ToFloat(src[i]);
        }
      } else {
        const auto* src = reinterpret_cast<const float*>(staging) + sg.begin;
        if (first) {
          std::memcpy(acc, src, sg.numel * 4);
        } else {
          for (uint64_t i = 0; i < sg.numel; ++i) acc[i] += src[i];
        }
      }
      ++sg.micro_batches;
      if (job.boundary) {
        STRATA_ASSIGN_OR_RETURN(sg.sumsq,
                                cpu_optimizer::SumOfSquares(acc, DType::kFloat32, sg.numel, 1));
      }
      pin.MarkDirty();
      if (opt->optimizer == Home::kNvme) {
        pin.Release();
        STRATA_RETURN_IF_ERROR(tm->Flush(sg.grad));
      }
    }
    return Status::Ok();
  }

  Status DrainGradients() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return grad_jobs.empty() && grad_jobs_running == 0; });
    Status s = grad_error;
    grad_error = Status::Ok();
    return s;
  }

  // -- write-behind -----------------------------------------------------------------------------

  void SubmitWrite(WriteJob job) {
    {
      std::lock_guard<std::mutex> lock(mu);
      write_jobs.push_back(std::move(job));
    }
    cv.notify_all();
  }

  void WriteLoop() {
    for (;;) {
      WriteJob job;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopping || !write_jobs.empty(); });
        if (write_jobs.empty()) return;
        job = std::move(write_jobs.front());
        write_jobs.pop_front();
        ++write_jobs_running;
      }
      Status s;
      for (Pin& p : job.pins) {
        const BlockId id = p.id();
        p.Release();
        if (s.ok()) s = tm->Flush(id);
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        --write_jobs_running;
        if (!s.ok() && write_error.ok()) write_error = s;
      }
      cv.notify_all();
    }
  }

  Status DrainWrites() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return write_jobs.empty() && write_jobs_running == 0; });
    Status s = write_error;
    write_error = Status::Ok();
    return s;
  }

  // -- optimizer step -------------------------------------------------------------------------

  Result<double> GlobalSumOfSquares() const {
    double total = 0;
    for (const SubGroup& sg : subgroups) {
      if (sg.micro_batches > 0) total += sg.sumsq;
    }
    return total;
  }

  // compute=false (benchmarks): the same reads and writes, without the update arithmetic.
  Status RunOptimizer(int64_t step, double grad_scale, double lr, bool compute = true) {
    TraceSpan span("optimizer", "optimizer step");
    cpu_optimizer::StepArgs args;
    args.step = step;
    args.grad_scale = grad_scale;
    args.lr = lr;
    std::vector<int> order;
    for (int i = 0; i < static_cast<int>(subgroups.size()); ++i) {
      if (subgroups[i].micro_batches > 0) order.push_back(i);
    }
    const bool nvme = opt->optimizer == Home::kNvme;
    Pin group_pin;  // the pinned parameter copy being updated (cpu/nvme homes)
    int group_pin_group = -1;
    int staging_turn = 0;
    for (size_t k = 0; k < order.size(); ++k) {
      SubGroup& sg = subgroups[order[k]];
      Group& g = groups[sg.group];
      if (nvme && opt->pipeline && k + 1 < order.size()) {  // read(g+1)
        const SubGroup& next = subgroups[order[k + 1]];
        (void)tm->Prefetch(next.state, Tier::kPinned);
        (void)tm->Prefetch(next.grad, Tier::kPinned);
      }
      STRATA_ASSIGN_OR_RETURN(Pin state,
                              tm->Acquire(sg.state, Tier::kPinned, TierManager::Access::kWrite));
      STRATA_ASSIGN_OR_RETURN(Pin grad, tm->Acquire(sg.grad, Tier::kPinned));
      STRATA_RETURN_IF_ERROR(state.Wait());
      STRATA_RETURN_IF_ERROR(grad.Wait());

      std::byte* out = nullptr;  // where the updated parameters go (compute dtype)
      const uint64_t c = c_bytes();
      const bool device_home = g.home == Home::kDevice;
      int staging = -1;
      if (device_home) {
        staging = staging_turn;
        staging_turn = (staging_turn + 1) % static_cast<int>(update_staging.size());
        STRATA_RETURN_IF_ERROR(update_staging_done[staging].Wait());
        out = update_staging[staging].data();
      } else {
        if (group_pin_group != sg.group) {
          if (group_pin.valid()) FinishGroupUpdate(group_pin);
          // Every sub-group of the group is updated when all had gradients: overwrite.
          bool all = true;
          for (int si : g.subgroups) all = all && subgroups[si].micro_batches > 0;
          STRATA_ASSIGN_OR_RETURN(group_pin, tm->Acquire(g.block, Tier::kPinned,
                                                         all ? TierManager::Access::kOverwrite
                                                             : TierManager::Access::kWrite));
          STRATA_RETURN_IF_ERROR(group_pin.Wait());
          group_pin_group = sg.group;
        }
        out = static_cast<std::byte*>(group_pin.data()) + sg.begin * c;
      }
      auto* master = static_cast<float*>(state.data());
      if (compute) {
        TraceSpan step_span("cpu optimizer", "step " + g.name + "/" + std::to_string(sg.begin));
        cpu_optimizer::FlatSpan span = Span(sg, master, grad.data());
        if (opt->bf16) {  // the fused kernel writes the rounded bf16 copy in the same pass
          span.copy_out = out;
          span.copy_out_dtype = DType::kBFloat16;
        }
        STRATA_RETURN_IF_ERROR(cpu_opt->Step(span, args));
        if (!opt->bf16) std::memcpy(out, master, sg.numel * 4);
      }
      state.MarkDirty();
      grad.Release();
      sg.micro_batches = 0;
      if (device_home) {
        auto* dst = static_cast<std::byte*>(g.home_pin.data()) + sg.begin * c;
        STRATA_RETURN_IF_ERROR(
            device->CopyAsync(dst, out, sg.numel * c, CopyKind::kHostToDevice, *h2d));
        STRATA_ASSIGN_OR_RETURN(update_staging_done[staging], device->RecordEvent(*h2d));
      }
      if (nvme) {  // write(g-1): the write-behind thread flushes while the next sub-group steps
        WriteJob job;
        job.pins.push_back(std::move(state));
        if (opt->pipeline) {
          SubmitWrite(std::move(job));
        } else {
          const BlockId id = job.pins[0].id();
          job.pins.clear();
          STRATA_RETURN_IF_ERROR(tm->Flush(id));
        }
      }
    }
    if (group_pin.valid()) FinishGroupUpdate(group_pin);
    STRATA_RETURN_IF_ERROR(DrainWrites());
    STRATA_RETURN_IF_ERROR(device->Synchronize(*h2d));
    // Keep cpu-home copies pinned (they were re-acquired above, the home pins still hold).
    return Status::Ok();
  }

  void FinishGroupUpdate(Pin& pin) {
    pin.MarkDirty();
    if (opt->params == Home::kNvme) {
      WriteJob job;
      job.pins.push_back(std::move(pin));
      SubmitWrite(std::move(job));
    } else {
      pin.Release();
    }
  }

  // Group g's fp32 master parameters (from its sub-groups' state blocks) into dst[0, g.numel).
  Status ReadMasters(const Group& g, float* dst) {
    for (int si : g.subgroups) {
      const SubGroup& sg = subgroups[si];
      STRATA_ASSIGN_OR_RETURN(Pin pin, tm->Acquire(sg.state, Tier::kPinned));
      STRATA_RETURN_IF_ERROR(pin.Wait());
      std::memcpy(dst + sg.begin, pin.data(), sg.numel * 4);
    }
    return Status::Ok();
  }

  // The I/O of one recorded pass without compute: gathers in the recorded order (with the same
  // prefetching) and zero gradients handed off where the backward would hand them off.
  Status ReplayPassIo() {
    if (!trace_valid) return FailedPreconditionError("no recorded pass to replay yet");
    const std::vector<int> order = trace;
    std::vector<int> seen(groups.size(), 0);
    try {
      pos = 0;
      pass_diverged = false;
      for (int u : order) {
        Gather(u, /*tracked=*/true);
        Release(u);
        if (++seen[u] == 2) SubmitGradients(u, std::vector<torch::Tensor>(groups[u].params.size()), true);
      }
      SubmitGradients(resident_group,
                      std::vector<torch::Tensor>(groups[resident_group].params.size()), true);
    } catch (const std::exception& e) {
      (void)DrainGradients();
      return InternalError(std::string("replaying the pass I/O: ") + e.what());
    }
    Status s = DrainGradients();
    EndPass();
    return s;
  }

  // Starts fetching the first units of the next pass (after the step changed them).
  void PrefetchNextPass() {
    pos = 0;
    if (trace_valid) Prefetch();
  }
};

// ---- Engine -----------------------------------------------------------------------------------

Engine::Engine(std::shared_ptr<torch::nn::Module> model, EngineOptions options)
    : model_(std::move(model)), options_(std::move(options)) {}

Engine::~Engine() {
  if (impl_) {
    for (const auto& item : model_->modules()) {
      if (auto* u = dynamic_cast<OffloadUnitImpl*>(item.get())) u->Detach();
    }
    impl_->Stop();
    // Parameters viewing engine memory must not outlive it.
    torch::NoGradGuard no_grad;
    for (auto& g : impl_->groups) {
      for (auto& p : g.params) p.var.set_data(impl_->Empty());
    }
  }
}

Result<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<torch::nn::Module> model,
                                               EngineOptions options) {
  if (model == nullptr) return InvalidArgumentError("Engine::Create: no model");
  if (options.gradient_accumulation_steps < 1) {
    return InvalidArgumentError("gradient_accumulation_steps must be >= 1");
  }
  if (options.params != Home::kDevice && options.optimizer == Home::kDevice) {
    return InvalidArgumentError(
        "zero_optimization.offload_param.device = " + std::string(HomeName(options.params)) +
        " needs zero_optimization.offload_optimizer.device cpu or nvme (strata has no device "
        "optimizer for offloaded parameters)");
  }
  if (options.bf16 && options.optimizer == Home::kDevice) {
    return InvalidArgumentError(
        "bf16 needs zero_optimization.offload_optimizer.device cpu or nvme: the fp32 master "
        "weights live with the CPU optimizer (no offload trains in fp32 with torch::optim)");
  }
  STRATA_RETURN_IF_ERROR(options.optimizer_options.Validate());
  if (options.communicator == nullptr) options.communicator = MakeSingleRankCommunicator();
  if (options.communicator->world_size() != 1) {
    return InvalidArgumentError("world size " + std::to_string(options.communicator->world_size()) +
                                ": only single-rank training is implemented");
  }
  std::unique_ptr<Engine> e(new Engine(std::move(model), std::move(options)));
  STRATA_RETURN_IF_ERROR(e->Init());
  return e;
}

Status Engine::Init() {
  offload_ = options_.optimizer != Home::kDevice;
  if (!offload_) {
    using cpu_optimizer::OptimizerType;
    if (options_.optimizer_options.type == OptimizerType::kLion) {
      return InvalidArgumentError(
          "optimizer Lion needs zero_optimization.offload_optimizer.device cpu or nvme (no "
          "offload uses torch::optim, which has no Lion)");
    }
    return Status::Ok();
  }
  impl_ = std::make_unique<Impl>();
  impl_->engine = this;
  impl_->opt = &options_;
  return impl_->Setup(*model_);
}

bool Engine::NextMicroStepIsBoundary() const {
  return (micro_steps_ + 1) % options_.gradient_accumulation_steps == 0;
}

bool Engine::IsAccumulationBoundary() const {
  return micro_steps_ % options_.gradient_accumulation_steps == 0;
}

double Engine::learning_rate() const {
  return options_.lr_at ? options_.lr_at(global_steps_) : options_.optimizer_options.lr;
}

TierTelemetry Engine::telemetry() const {
  return impl_ && impl_->tm ? impl_->tm->telemetry() : TierTelemetry{};
}

uint64_t Engine::pinned_arena_bytes() const {
  return impl_ && impl_->arena ? impl_->arena->capacity() : 0;
}

Engine::Occupancy Engine::occupancy() const {
  Occupancy o;
  if (impl_ && impl_->device) {
    o.device_used = impl_->device->used_bytes();
    o.device_budget = impl_->device->info().budget_bytes;
  }
  if (impl_ && impl_->arena) {
    o.pinned_used = impl_->arena->used_bytes();
    o.pinned_capacity = impl_->arena->capacity();
  }
  return o;
}

Status Engine::Backward(const torch::Tensor& loss) {
  if (!loss.defined() || loss.numel() != 1) {
    return InvalidArgumentError("Backward needs a scalar loss");
  }
  const bool boundary = NextMicroStepIsBoundary();
  try {
    torch::Tensor scaled = options_.gradient_accumulation_steps > 1
                               ? loss / static_cast<double>(options_.gradient_accumulation_steps)
                               : loss;
    scaled.backward();
  } catch (const std::exception& e) {
    if (impl_) {
      (void)impl_->DrainGradients();
      impl_->EndPass();
    }
    return ErrorFromException(e);
  }
  ++micro_steps_;
  if (!impl_) return Status::Ok();
  // The resident group's gradients (parameters outside units and small unit parameters).
  Impl::Group& r = impl_->groups[impl_->resident_group];
  std::vector<torch::Tensor> grads;
  grads.reserve(r.params.size());
  for (auto& p : r.params) grads.push_back(p.var.grad());
  try {
    impl_->SubmitGradients(impl_->resident_group, std::move(grads), boundary);
  } catch (const std::exception& e) {
    return ErrorFromException(e);
  }
  Stopwatch watch;
  Status s = impl_->DrainGradients();
  times_.grad_wait_seconds = watch.Seconds();
  for (auto& p : r.params) p.var.mutable_grad() = torch::Tensor();
  impl_->EndPass();
  times_.gather_wait_seconds = impl_->gather_wait_seconds;
  impl_->gather_wait_seconds = 0;
  return s;
}

Status Engine::Step() {
  if (micro_steps_ == 0 || !IsAccumulationBoundary()) return Status::Ok();
  const double lr = learning_rate();
  Stopwatch watch;
  Status s = offload_ ? StepOffload(lr) : StepNoOffload(lr);
  times_.optimizer_seconds = watch.Seconds();
  if (s.ok()) ++global_steps_;
  return s;
}

Status Engine::MakeTorchOptimizer(double lr) {
  if (torch_optim_) return Status::Ok();
  auto& optim = torch_optim_;
  const auto& o = options_.optimizer_options;
  using cpu_optimizer::OptimizerType;
  std::vector<torch::Tensor> all;
  for (const auto& p : model_->parameters()) {
    if (p.requires_grad()) all.push_back(p);
  }
  switch (o.type) {
    case OptimizerType::kAdam:
      optim = std::make_unique<torch::optim::Adam>(
          all, torch::optim::AdamOptions(lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(
                   o.weight_decay));
      break;
    case OptimizerType::kAdamW:
      optim = std::make_unique<torch::optim::AdamW>(
          all, torch::optim::AdamWOptions(lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(
                   o.weight_decay));
      break;
    case OptimizerType::kAdagrad:
      optim = std::make_unique<torch::optim::Adagrad>(
          all, torch::optim::AdagradOptions(lr)
                   .lr_decay(o.lr_decay)
                   .weight_decay(o.weight_decay)
                   .initial_accumulator_value(o.initial_accumulator_value)
                   .eps(o.eps));
      break;
    case OptimizerType::kLion:
      return InvalidArgumentError("Lion needs offload_optimizer cpu or nvme");
  }
  return Status::Ok();
}

Status Engine::StepNoOffload(double lr) {
  std::vector<torch::Tensor> params;
  for (const auto& p : model_->parameters()) {
    if (p.requires_grad() && p.grad().defined()) params.push_back(p);
  }
  torch::NoGradGuard no_grad;
  double total = 0;
  for (const auto& p : params) total += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  STRATA_RETURN_IF_ERROR(options_.communicator->AllReduceSum(&total, 1));
  last_grad_norm_ = std::sqrt(total);
  if (options_.gradient_clipping > 0) {
    const double clip = (last_grad_norm_ + 1e-6) / options_.gradient_clipping;
    if (clip > 1) {
      for (auto& p : params) p.mutable_grad().mul_(1.0 / clip);
    }
  }
  STRATA_RETURN_IF_ERROR(MakeTorchOptimizer(lr));
  auto& optim = torch_optim_;
  for (auto& group : optim->param_groups()) group.options().set_lr(lr);
  try {
    optim->step();
  } catch (const std::exception& e) {
    return InternalError(std::string("torch optimizer step failed: ") + e.what());
  }
  for (auto& p : model_->parameters()) p.mutable_grad() = torch::Tensor();
  return Status::Ok();
}

Status Engine::StepOffload(double lr) {
  STRATA_RETURN_IF_ERROR(impl_->DrainGradients());
  STRATA_ASSIGN_OR_RETURN(double total, impl_->GlobalSumOfSquares());
  STRATA_RETURN_IF_ERROR(options_.communicator->AllReduceSum(&total, 1));
  last_grad_norm_ = std::sqrt(total);
  double grad_scale = 1.0;
  if (options_.gradient_clipping > 0) {
    const double clip = (last_grad_norm_ + 1e-6) / options_.gradient_clipping;
    if (clip > 1) grad_scale = 1.0 / clip;
  }
  STRATA_RETURN_IF_ERROR(impl_->RunOptimizer(global_steps_ + 1, grad_scale, lr));
  impl_->PrefetchNextPass();
  return Status::Ok();
}

// ---- checkpoints ------------------------------------------------------------------------------

namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

nlohmann::json Engine::LayoutJson() const {
  nlohmann::json j;
  j["format"] = "strata-engine";
  j["version"] = 1;
  j["mode"] = offload_ ? "offload" : "none";
  j["optimizer"] = std::string(cpu_optimizer::OptimizerTypeName(options_.optimizer_options.type));
  j["global_steps"] = global_steps_;
  j["compute_dtype"] = options_.bf16 ? "bf16" : "fp32";
  j["micro_steps"] = micro_steps_;
  nlohmann::json params = nlohmann::json::array();
  if (impl_) {
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& g : impl_->groups) {
      nlohmann::json gj;
      gj["name"] = g.name;
      gj["numel"] = g.numel;
      nlohmann::json ps = nlohmann::json::array();
      for (const auto& p : g.params) ps.push_back({{"name", p.name}, {"shape", p.shape}});
      gj["params"] = ps;
      nlohmann::json sgs = nlohmann::json::array();
      for (int si : g.subgroups) sgs.push_back({impl_->subgroups[si].begin, impl_->subgroups[si].numel});
      gj["subgroups"] = sgs;
      groups.push_back(gj);
    }
    j["groups"] = groups;
    j["state_arrays"] = impl_->state_arrays;
  } else {
    for (const auto& item : model_->named_parameters()) {
      if (item.value().requires_grad())
        params.push_back({{"name", item.key()}, {"shape", item.value().sizes().vec()}});
    }
    j["params"] = params;
  }
  return j;
}

Status Engine::SaveState(CheckpointWriter& writer) {
  if (micro_steps_ % options_.gradient_accumulation_steps != 0) {
    return FailedPreconditionError("SaveState in the middle of gradient accumulation");
  }
  STRATA_RETURN_IF_ERROR(writer.WriteJson("engine.json", LayoutJson()));
  if (!impl_) {
    for (const auto& item : model_->named_parameters()) {
      if (!item.value().requires_grad()) continue;
      torch::Tensor t = item.value().detach().to(torch::kCPU).contiguous();
      STRATA_ASSIGN_OR_RETURN(EntryWriter * e, writer.AddEntry("params/" + item.key() + ".bin"));
      STRATA_RETURN_IF_ERROR(e->Append(t.data_ptr(), t.numel() * 4));
      STRATA_RETURN_IF_ERROR(e->Close());
    }
    std::ostringstream os;
    if (torch_optim_) {
      try {
        torch::serialize::OutputArchive archive;
        torch_optim_->save(archive);
        archive.save_to(os);
      } catch (const std::exception& ex) {
        return InternalError(std::string("serializing the torch optimizer: ") + ex.what());
      }
    }
    const std::string bytes = os.str();
    STRATA_ASSIGN_OR_RETURN(EntryWriter * e, writer.AddEntry("torch_optimizer.bin"));
    STRATA_RETURN_IF_ERROR(e->Append(bytes.data(), bytes.size()));
    return e->Close();
  }
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.DrainGradients());
  std::vector<std::byte> host;
  for (auto& g : m.groups) {
    if (g.numel == 0) continue;
    STRATA_ASSIGN_OR_RETURN(EntryWriter * e, writer.AddEntry("params/" + g.name + ".bin"));
    const uint64_t bytes = g.numel * m.c_bytes();
    if (g.home == Home::kDevice) {
      host.resize(bytes);
      STRATA_RETURN_IF_ERROR(m.device->CopyAsync(host.data(), g.home_pin.data(), bytes,
                                                 CopyKind::kDeviceToHost, *m.d2h));
      STRATA_RETURN_IF_ERROR(m.device->Synchronize(*m.d2h));
      STRATA_RETURN_IF_ERROR(e->Append(host.data(), bytes));
    } else {
      STRATA_ASSIGN_OR_RETURN(Pin pin, m.tm->Acquire(g.block, Tier::kPinned));
      STRATA_RETURN_IF_ERROR(pin.Wait());
      STRATA_RETURN_IF_ERROR(e->Append(pin.data(), bytes));
    }
    STRATA_RETURN_IF_ERROR(e->Close());
    for (int si : g.subgroups) {
      const auto& sg = m.subgroups[si];
      STRATA_ASSIGN_OR_RETURN(
          EntryWriter * se,
          writer.AddEntry("state/" + g.name + "/" + std::to_string(sg.begin) + ".bin"));
      STRATA_ASSIGN_OR_RETURN(Pin pin, m.tm->Acquire(sg.state, Tier::kPinned));
      STRATA_RETURN_IF_ERROR(pin.Wait());
      STRATA_RETURN_IF_ERROR(se->Append(pin.data(), sg.numel * 4 * m.state_arrays));
      STRATA_RETURN_IF_ERROR(se->Close());
    }
  }
  return Status::Ok();
}

Status Engine::LoadState(const CheckpointReader& reader) {
  STRATA_RETURN_IF_ERROR(reader.Verify());
  STRATA_ASSIGN_OR_RETURN(nlohmann::json saved, reader.ReadJson("engine.json"));
  const nlohmann::json mine = LayoutJson();
  auto mismatch = [&](const std::string& what) {
    return InvalidArgumentError("checkpoint " + reader.tag() + " does not match this model: " +
                                what);
  };
  try {
    if (saved.value("format", "") != "strata-engine" || saved.value("version", 0) != 1)
      return mismatch("engine.json is not a strata engine state (format/version)");
    if (saved.at("mode") != mine.at("mode"))
      return mismatch("saved with offload mode " + saved.at("mode").dump() + ", running " +
                      mine.at("mode").dump());
    if (saved.at("optimizer") != mine.at("optimizer"))
      return mismatch("optimizer " + saved.at("optimizer").dump() + " saved, " +
                      mine.at("optimizer").dump() + " configured");
    const char* key = impl_ ? "groups" : "params";
    const auto& a = saved.at(key);
    const auto& b = mine.at(key);
    if (a.size() != b.size())
      return mismatch(std::to_string(a.size()) + " " + key + " saved, the model has " +
                      std::to_string(b.size()));
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] != b[i]) {
        return mismatch(std::string(key) + "[" + std::to_string(i) + "] (" +
                        b[i].value("name", "?") + ") differs: saved " + a[i].dump().substr(0, 300) +
                        ", model " + b[i].dump().substr(0, 300));
      }
    }
    if (impl_ && saved.at("state_arrays") != mine.at("state_arrays"))
      return mismatch("optimizer state layout differs");
    global_steps_ = saved.at("global_steps").get<int64_t>();
    micro_steps_ = saved.at("micro_steps").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return mismatch(std::string("engine.json: ") + e.what());
  }
  auto expect_size = [&](const std::string& name, uint64_t bytes) -> Status {
    STRATA_ASSIGN_OR_RETURN(uint64_t size, reader.EntrySize(name));
    if (size != bytes) {
      return mismatch(name + " has " + std::to_string(size) + " bytes, the model needs " +
                      std::to_string(bytes));
    }
    return Status::Ok();
  };
  torch::NoGradGuard no_grad;
  if (!impl_) {
    for (const auto& item : model_->named_parameters()) {
      if (!item.value().requires_grad()) continue;
      const std::string name = "params/" + item.key() + ".bin";
      const uint64_t bytes = item.value().numel() * 4;
      STRATA_RETURN_IF_ERROR(expect_size(name, bytes));
      torch::Tensor t = torch::empty(item.value().sizes(), torch::kFloat32);
      STRATA_RETURN_IF_ERROR(reader.ReadEntry(name, 0, t.data_ptr(), bytes));
      item.value().copy_(t);
    }
    STRATA_ASSIGN_OR_RETURN(uint64_t osize, reader.EntrySize("torch_optimizer.bin"));
    if (osize > 0) {
      std::string bytes(osize, '\0');
      STRATA_RETURN_IF_ERROR(reader.ReadEntry("torch_optimizer.bin", 0, bytes.data(), osize));
      STRATA_RETURN_IF_ERROR(MakeTorchOptimizer(learning_rate()));
      try {
        std::istringstream is(bytes);
        torch::serialize::InputArchive archive;
        archive.load_from(is);
        torch_optim_->load(archive);
      } catch (const std::exception& ex) {
        return mismatch(std::string("torch optimizer state: ") + ex.what());
      }
    }
    return Status::Ok();
  }
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.DrainGradients());
  for (auto& g : m.groups) {
    if (g.numel == 0) continue;
    const std::string pname = "params/" + g.name + ".bin";
    const uint64_t pbytes = g.numel * m.c_bytes();
    STRATA_RETURN_IF_ERROR(expect_size(pname, pbytes));
    if (g.home == Home::kDevice) {
      std::vector<std::byte> host(pbytes);
      STRATA_RETURN_IF_ERROR(reader.ReadEntry(pname, 0, host.data(), pbytes));
      STRATA_RETURN_IF_ERROR(m.device->CopyAsync(g.home_pin.data(), host.data(), pbytes,
                                                 CopyKind::kHostToDevice, *m.h2d));
      STRATA_RETURN_IF_ERROR(m.device->Synchronize(*m.h2d));
    } else {
      STRATA_ASSIGN_OR_RETURN(Pin pin, m.tm->Acquire(g.block, Tier::kPinned,
                                                     TierManager::Access::kOverwrite));
      STRATA_RETURN_IF_ERROR(pin.Wait());
      STRATA_RETURN_IF_ERROR(reader.ReadEntry(pname, 0, pin.data(), pbytes));
      pin.MarkDirty();
      if (g.home == Home::kNvme) {
        pin.Release();
        STRATA_RETURN_IF_ERROR(m.tm->Flush(g.block));
      }
    }
    for (int si : g.subgroups) {
      auto& sg = m.subgroups[si];
      const std::string sname = "state/" + g.name + "/" + std::to_string(sg.begin) + ".bin";
      const uint64_t bytes = sg.numel * 4 * m.state_arrays;
      STRATA_RETURN_IF_ERROR(expect_size(sname, bytes));
      STRATA_ASSIGN_OR_RETURN(Pin pin, m.tm->Acquire(sg.state, Tier::kPinned,
                                                     TierManager::Access::kOverwrite));
      STRATA_RETURN_IF_ERROR(pin.Wait());
      STRATA_RETURN_IF_ERROR(reader.ReadEntry(sname, 0, pin.data(), bytes));
      pin.MarkDirty();
      if (m.opt->optimizer == Home::kNvme) {
        pin.Release();
        STRATA_RETURN_IF_ERROR(m.tm->Flush(sg.state));
      }
      sg.micro_batches = 0;
    }
  }
  m.trace_valid = false;  // re-record after a restore
  return Status::Ok();
}

Status Engine::ExportSafetensors(const std::string& path,
                                 const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  if (!impl_) {
    for (const auto& item : model_->named_parameters()) {
      if (item.value().requires_grad())
        specs.push_back({item.key(), "F32", item.value().sizes().vec()});
    }
    STRATA_ASSIGN_OR_RETURN(auto w, SafetensorsWriter::Create(path, specs, metadata));
    for (const auto& item : model_->named_parameters()) {
      if (!item.value().requires_grad()) continue;
      torch::Tensor t = item.value().detach().to(torch::kCPU).contiguous();
      STRATA_RETURN_IF_ERROR(w->Append(t.data_ptr(), t.numel() * 4));
    }
    return w->Finish();
  }
  Impl& m = *impl_;
  for (const auto& g : m.groups) {
    for (const auto& p : g.params) specs.push_back({p.name, "F32", p.shape});
  }
  STRATA_ASSIGN_OR_RETURN(auto w, SafetensorsWriter::Create(path, specs, metadata));
  // The fp32 master weights (equal to the parameters in fp32 training), sub-group by sub-group.
  for (auto& g : m.groups) {
    for (int si : g.subgroups) {
      const auto& sg = m.subgroups[si];
      STRATA_ASSIGN_OR_RETURN(Pin pin, m.tm->Acquire(sg.state, Tier::kPinned));
      STRATA_RETURN_IF_ERROR(pin.Wait());
      STRATA_RETURN_IF_ERROR(w->Append(pin.data(), sg.numel * 4));
    }
  }
  return w->Finish();
}

Result<std::vector<std::pair<std::string, torch::Tensor>>> Engine::ParameterValues() {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  if (!impl_) {
    for (const auto& item : model_->named_parameters()) {
      if (item.value().requires_grad())
        out.emplace_back(item.key(), item.value().detach().to(torch::kCPU).clone());
    }
    return out;
  }
  std::map<std::string, torch::Tensor> values;
  for (auto& g : impl_->groups) {  // the fp32 masters (the parameters themselves in fp32)
    if (g.numel == 0) continue;
    std::vector<float> flat(g.numel);
    STRATA_RETURN_IF_ERROR(impl_->ReadMasters(g, flat.data()));
    for (auto& p : g.params) {
      values[p.name] = torch::from_blob(flat.data() + p.offset, p.shape, torch::kFloat32).clone();
    }
  }
  for (const auto& item : model_->named_parameters()) {
    auto it = values.find(item.key());
    if (it != values.end()) out.emplace_back(item.key(), it->second);
  }
  return out;
}

Status Engine::ReplayPassIo() {
  if (!impl_) return FailedPreconditionError("no offload: nothing to replay");
  return impl_->ReplayPassIo();
}

Status Engine::ReplayOptimizerIo() {
  if (!impl_) return FailedPreconditionError("no offload: nothing to replay");
  STRATA_RETURN_IF_ERROR(impl_->DrainGradients());
  return impl_->RunOptimizer(global_steps_ + 1, 1.0, learning_rate(), /*compute=*/false);
}

uint64_t Engine::optimizer_elements() const {
  uint64_t n = 0;
  if (impl_) {
    for (const auto& sg : impl_->subgroups) n += sg.numel;
  }
  return n;
}

uint64_t Engine::largest_subgroup_elements() const {
  return impl_ ? impl_->max_subgroup_numel : 0;
}

Status Engine::ErrorFromException(const std::exception& e) {
  if (impl_ && !impl_->boundary_error.ok()) {
    Status s = std::move(impl_->boundary_error);
    impl_->boundary_error = Status::Ok();
    return s;
  }
  return InternalError(std::string("libtorch: ") + e.what());
}

void Engine::Gather(int unit, bool tracked) { impl_->Gather(unit, tracked); }
void Engine::Release(int unit) { impl_->Release(unit); }
const std::vector<torch::Tensor>& Engine::GradParameters(int unit) {
  return impl_->unit_grad_params[unit];
}

void Engine::GradientsReady(int unit, std::vector<torch::Tensor> grads) {
  const bool boundary = NextMicroStepIsBoundary();
  auto& targets = impl_->unit_grad_targets[unit];
  Impl::Group& g = impl_->groups[unit];
  std::vector<torch::Tensor> unit_grads(g.params.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    const auto& t = targets[i];
    if (t.resident) {
      if (!grads[i].defined()) continue;
      torch::Tensor& acc = impl_->groups[impl_->resident_group].params[t.slot].var.mutable_grad();
      torch::NoGradGuard no_grad;
      if (acc.defined()) {
        acc.add_(grads[i]);
      } else {
        acc = grads[i].detach().clone();
      }
    } else {
      unit_grads[t.slot] = std::move(grads[i]);
    }
  }
  impl_->SubmitGradients(unit, std::move(unit_grads), boundary);
}

}  // namespace strata::runtime
