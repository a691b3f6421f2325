// PlanMemory walks the layout described in memory_plan.h and adds one item per kind of buffer.
//
// Algorithm: the partition comes cut (PlanInput::layout, from plan/layout.h: the split the engine
// uses); its largest unit and largest sub-group size the buffers. Then, for each kind of buffer,
// the tier it lives on under the chosen placements and its size: a buffer of n bytes occupies
// AlignUp(n, io_align) bytes, and the difference is also added to `padding`, so a caller can show
// what alignment costs. Totals are the sums of the items, so `total` and the itemized rows can
// never disagree.
#include "runtime/plan/memory_plan.h"

#include <algorithm>
#include <cassert>
#include <limits>

#include "base/bytes.h"
#include "tiers/tier.h"

namespace strata::runtime {
namespace {

uint64_t& At(TierBytes& bytes, Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return bytes.device;
    case Tier::kPinned:
      return bytes.pinned;
    case Tier::kHost:
      return bytes.host;
    case Tier::kNvme:
      break;
  }
  return bytes.nvme;
}

// Builds the itemized plan; every Add pads its buffers and records the padding.
class Builder {
 public:
  explicit Builder(uint64_t align) : align_(align) {}

  // `count` buffers of `raw` bytes each on `tier`, under item `name` (created on first use).
  void Add(const std::string& name, Tier tier, uint64_t raw, uint64_t count = 1) {
    TierBytes& item = Item(name);
    const uint64_t padded = AlignUp(raw, align_);
    At(item, tier) += padded * count;
    At(plan_.padding, tier) += (padded - raw) * count;
  }
  // An item with no bytes (kept so the row shows).
  void AddEmpty(const std::string& name) { Item(name); }

  MemoryPlan Finish() && {
    for (const auto& [name, bytes] : plan_.items) plan_.total += bytes;
    plan_.pinned_arena_bytes = plan_.total.pinned;
    plan_.device_min_bytes = plan_.total.device;
    return std::move(plan_);
  }

  MemoryPlan& plan() { return plan_; }

 private:
  TierBytes& Item(const std::string& name) {
    for (auto& [n, bytes] : plan_.items) {
      if (n == name) return bytes;
    }
    plan_.items.emplace_back(name, TierBytes{});
    return plan_.items.back().second;
  }

  uint64_t align_;
  MemoryPlan plan_;
};

}  // namespace

TierBytes& TierBytes::operator+=(const TierBytes& other) {
  device += other.device;
  pinned += other.pinned;
  host += other.host;
  nvme += other.nvme;
  return *this;
}

MemoryPlan PlanMemory(const PlanInput& in) {
  assert(in.io_align > 0 && in.compute_bytes > 0 && in.state_bytes > 0);
  const uint64_t cb = static_cast<uint64_t>(in.compute_bytes);
  const ModelLayout& layout = in.layout;
  const uint64_t max_unit = layout.largest_unit();
  const uint64_t max_gather = layout.largest_gather();  // == max_unit with one rank
  const uint64_t max_group = layout.largest_sub_group();

  Builder b(in.io_align);
  b.plan().largest_unit = max_unit;
  b.plan().largest_sub_group = max_group;
  b.plan().sub_groups = layout.subgroups.size();

  // Parameters (compute precision). Units max_in_cpu keeps are pinned like kCpu homes.
  const size_t in_cpu = UnitsInCpu(in);
  b.Add("params.resident", Tier::kDevice, layout.resident_numel * cb);
  for (size_t u = 0; u < layout.unit_numel.size(); ++u) {
    // Ranks: offloaded units keep their slice; units on the device are whole on every rank.
    const uint64_t kept = in.params == Home::kDevice
                              ? layout.unit_numel[u] * static_cast<uint64_t>(layout.world)
                              : layout.unit_numel[u];
    b.Add("params.units", u < in_cpu ? Tier::kPinned : HomeTier(in.params), kept * cb);
  }
  if (in.params == Home::kNvme && in_cpu < layout.unit_numel.size()) {
    b.Add("params.pinned_buffers", Tier::kPinned, LargestNvmeUnit(in) * cb,
          static_cast<uint64_t>(std::max(2, in.param_buffer_count)));
  }
  if (in.params != Home::kDevice) {
    b.Add("params.device_window", Tier::kDevice, max_unit * cb, 2);
    if (max_gather != max_unit) b.Add("params.gathered", Tier::kDevice, max_gather * cb, 2);
  }

  if (in.inference) {  // the parameters and one unit's forward: nothing else exists
    b.Add("activations.working", Tier::kDevice, in.activation_working_bytes);
    if (in.kv_cache_bytes > 0) b.Add("kv_cache", Tier::kDevice, in.kv_cache_bytes);
    b.AddEmpty("host.model_structure");
    return std::move(b).Finish();
  }

  // Optimizer state and fp32 gradients, per sub-group.
  // The host-RAM tier's blocks are pinned where their home would be NVMe (SplitHostCache).
  const Tier opt_home = HomeTier(in.optimizer);
  const HostCacheSplit split = SplitHostCache(in);
  for (size_t s = 0; s < layout.subgroups.size(); ++s) {
    const SubGroupSpan& g = layout.subgroups[s];
    const bool state_in_ram = !split.state.empty() && split.state[s] != 0;
    const bool grad_in_ram = !split.grads.empty() && split.grads[s] != 0;
    b.Add("optimizer.state", state_in_ram ? Tier::kPinned : opt_home, StateBlockBytes(in, g));
    b.Add("optimizer.grads_fp32", grad_in_ram ? Tier::kPinned : opt_home, g.numel * 4);
  }
  if (in.optimizer == Home::kNvme) {
    // A pool only for a class with blocks left on NVMe (RAM blocks are pinned for good).
    const uint64_t buffers = OptimizerSubGroupBuffers(in);
    if (AnyOnNvme(split.state)) {
      b.Add("optimizer.pinned_buffers", Tier::kPinned, LargestStateBlockBytes(in), buffers);
    }
    if (AnyOnNvme(split.grads)) {
      b.Add("optimizer.pinned_buffers", Tier::kPinned, max_group * 4, buffers);
    }
  }

  // Staging between the device and the pinned arena.
  if (in.optimizer != Home::kDevice) {
    b.Add("staging.grads_d2h", Tier::kPinned, std::max(max_gather, layout.resident_numel) * cb, 2);
  }
  if (in.optimizer != Home::kDevice || in.params != Home::kDevice) {
    b.Add("staging.param_copyout", Tier::kPinned, max_group * cb, 2);
  }

  // Device working memory.
  b.Add("device.grads", Tier::kDevice, max_gather * cb);
  b.Add("device.grads", Tier::kDevice, layout.resident_numel * cb);
  b.Add("activations.checkpoints", Tier::kDevice, in.activation_checkpoint_bytes);
  b.Add("activations.working", Tier::kDevice, in.activation_working_bytes);

  b.AddEmpty("host.model_structure");
  return std::move(b).Finish();
}

namespace {

// offload_param.max_in_cpu's units alone (UnitsInCpu less the host-RAM tier's).
size_t MaxInCpuUnits(const PlanInput& in) {
  if (in.params != Home::kNvme) return 0;
  size_t n = 0;
  uint64_t kept = 0;
  for (uint64_t numel : in.layout.unit_numel) {
    if (numel > in.max_in_cpu - kept) break;  // kept <= max_in_cpu: no overflow
    kept += numel;
    ++n;
  }
  return n;
}

bool MasterInParamsAt(const PlanInput& in, int group, size_t in_cpu) {
  const int units = static_cast<int>(in.layout.unit_numel.size());
  if (in.inference || in.compute_bytes != 4 || group < 0 || group >= units) return false;
  const Home unit_home = static_cast<size_t>(group) < in_cpu ? Home::kCpu : in.params;
  if (unit_home == Home::kCpu) return in.optimizer == Home::kCpu || in.optimizer == Home::kNvme;
  return unit_home == Home::kNvme && in.optimizer == Home::kNvme;
}

}  // namespace

HostCacheSplit SplitHostCache(const PlanInput& in) {
  HostCacheSplit split;
  const ModelLayout& layout = in.layout;
  const bool optimizer_nvme = !in.inference && in.optimizer == Home::kNvme;
  if (optimizer_nvme) {
    split.grads.assign(layout.subgroups.size(), 0);
    split.state.assign(layout.subgroups.size(), 0);
  }
  uint64_t left = in.host_cache_bytes;
  if (left == 0) return split;
  auto take = [&](uint64_t raw, uint64_t* counted) {
    const uint64_t padded = AlignUp(raw, in.io_align);
    if (padded > left) return false;
    left -= padded;
    *counted += padded;
    return true;
  };
  // With the optimizer on NVMe MasterInParams does not depend on which units are in RAM (a unit
  // on cpu or nvme keeps its master in its parameter block alike), so the state blocks' sizes
  // are final before the units are chosen.
  const size_t base_in_cpu = MaxInCpuUnits(in);
  if (optimizer_nvme) {
    for (size_t s = 0; s < layout.subgroups.size(); ++s) {
      split.grads[s] = take(layout.subgroups[s].numel * 4, &split.grad_bytes) ? 1 : 0;
    }
  }
  if (in.params == Home::kNvme) {
    const uint64_t cb = static_cast<uint64_t>(in.compute_bytes);
    for (size_t u = base_in_cpu; u < layout.unit_numel.size(); ++u) {
      if (!take(layout.unit_numel[u] * cb, &split.unit_bytes)) break;  // a prefix
      ++split.units;
    }
  }
  if (optimizer_nvme) {
    for (size_t s = 0; s < layout.subgroups.size(); ++s) {
      const SubGroupSpan& sg = layout.subgroups[s];
      const uint64_t per_element = static_cast<uint64_t>(in.state_bytes) -
                                   (MasterInParamsAt(in, sg.group, base_in_cpu) ? 4 : 0);
      split.state[s] = take(sg.numel * per_element, &split.state_bytes) ? 1 : 0;
    }
  }
  return split;
}

size_t UnitsInCpu(const PlanInput& in) {
  const size_t base = MaxInCpuUnits(in);
  if (in.host_cache_bytes == 0 || in.params != Home::kNvme) return base;
  return base + SplitHostCache(in).units;
}

uint64_t EmulatedDeviceDefaultBudget(const PlanInput& in) {
  const uint64_t cb = static_cast<uint64_t>(in.compute_bytes);
  const uint64_t world = static_cast<uint64_t>(std::max(1, in.layout.world));
  // resident_numel is the whole (gathered) resident group already; units are this rank's slices.
  uint64_t total = AlignUp(in.layout.resident_numel * cb, in.io_align);
  for (const uint64_t numel : in.layout.unit_numel)
    total += AlignUp(numel * world * cb, in.io_align);
  if (world > 1 && in.params != Home::kDevice) {
    total += 2 * AlignUp(in.layout.largest_gather() * cb, in.io_align);
  }
  return total + (64ull << 20);
}

uint64_t DeviceUnitSlots(const PlanInput& in, uint64_t device_budget) {
  const uint64_t cb = static_cast<uint64_t>(in.compute_bytes);
  const uint64_t unit = AlignUp(in.layout.largest_unit() * cb, in.io_align);
  if (in.params == Home::kDevice || unit == 0) return 0;
  uint64_t fixed = AlignUp(in.layout.resident_numel * cb, in.io_align);
  if (in.layout.world > 1) fixed += 2 * AlignUp(in.layout.largest_gather() * cb, in.io_align);
  return fixed + unit > device_budget ? 0 : (device_budget - fixed) / unit;
}

uint64_t DefaultHostBudget(uint64_t available) {
  const uint64_t reserve = std::max<uint64_t>(available / 4, 2ull << 30);
  return available > reserve ? available - reserve : 0;
}

uint64_t HostCacheBytesFor(const PlanInput& in, uint64_t budget, const HostBeside& beside) {
  PlanInput base = in;
  base.host_cache_bytes = 0;
  const uint64_t need = PlanMemory(base).pinned_arena_bytes + beside.total();
  return budget > need ? budget - need : 0;
}

uint64_t LargestNvmeUnit(const PlanInput& in) {
  if (in.params != Home::kNvme) return 0;
  const std::vector<uint64_t>& units = in.layout.unit_numel;
  uint64_t largest = 0;
  for (size_t u = UnitsInCpu(in); u < units.size(); ++u) largest = std::max(largest, units[u]);
  return largest;
}

bool MasterInParams(const PlanInput& in, int group) {
  return MasterInParamsAt(in, group, UnitsInCpu(in));
}

bool AnyOnNvme(const std::vector<uint8_t>& in_ram) {
  return std::any_of(in_ram.begin(), in_ram.end(), [](uint8_t r) { return r == 0; });
}

uint64_t StateBlockBytes(const PlanInput& in, const SubGroupSpan& sg) {
  const uint64_t per_element =
      static_cast<uint64_t>(in.state_bytes) - (MasterInParams(in, sg.group) ? 4 : 0);
  return sg.numel * per_element;
}

uint64_t LargestStateBlockBytes(const PlanInput& in) {
  uint64_t largest = 0;
  for (const SubGroupSpan& sg : in.layout.subgroups) {
    largest = std::max(largest, StateBlockBytes(in, sg));
  }
  return largest;
}

int SwapTensorsPerSubGroup(const PlanInput& in) { return in.state_bytes / 4 + 1; }

uint64_t OptimizerSubGroupBuffers(const PlanInput& in) {
  const uint64_t needed = in.pipeline ? 3 : 1;
  const uint64_t asked =
      static_cast<uint64_t>(std::max(0, in.optimizer_buffer_count / SwapTensorsPerSubGroup(in)));
  return std::max(needed, asked);
}

Status CheckOffloadBuffers(const PlanInput& in) {
  const uint64_t unit = LargestNvmeUnit(in);
  if (in.param_buffer_size != 0 && unit > in.param_buffer_size) {
    return InvalidArgumentError(
        "zero_optimization.offload_param.buffer_size: " + std::to_string(in.param_buffer_size) +
        " elements cannot hold the largest offload unit on NVMe (" + std::to_string(unit) +
        " elements; a pinned parameter buffer holds one whole unit, as DeepSpeed's holds one "
        "whole partition): set it to at least " +
        std::to_string(unit) + " or leave it out");
  }
  const int tensors = SwapTensorsPerSubGroup(in);
  if (!in.inference && in.optimizer == Home::kNvme && in.optimizer_buffer_count < tensors) {
    return InvalidArgumentError(
        "zero_optimization.offload_optimizer.buffer_count: " +
        std::to_string(in.optimizer_buffer_count) + " cannot hold one sub-group's " +
        std::to_string(tensors) + " swapped tensors (fp32 master, " + std::to_string(tensors - 2) +
        " optimizer moment" + (tensors - 2 == 1 ? "" : "s") +
        " and the fp32 gradient): set it to at least " + std::to_string(tensors));
  }
  return Status::Ok();
}

Status HostBudgetError(const MemoryPlan& plan, uint64_t arena, const HostBeside& beside,
                       uint64_t budget, const std::string& source) {
  std::string items;
  for (const auto& [name, bytes] : plan.items) {
    if (bytes.pinned == 0) continue;
    items += (items.empty() ? "" : ", ") + name + " " + FormatBytes(bytes.pinned);
  }
  const uint64_t need = arena + beside.total();
  std::string parts = "the pinned host arena " + FormatBytes(arena) +
                      (items.empty() ? std::string() : " (" + items + ")");
  if (beside.emulated_device != 0) {
    parts += ", the host-emulated device's memory " + FormatBytes(beside.emulated_device) +
             " (--device-memory sets it)";
  }
  if (beside.process != 0) {
    parts += " and the process's own " + FormatBytes(beside.process) +
             " (libtorch, the model's structure, data)";
  }
  return InvalidArgumentError(
      source + " " + FormatBytes(budget) + ": the run needs " + FormatBytes(need) +
      " of host memory: " + parts + "; raise " + source + " to at least " + FormatBytes(need) +
      " (or 0: no host-RAM tier and no limit), or shrink the arena: "
      "zero_optimization.offload_param.buffer_count (2 at least) or max_in_cpu, "
      "offload_optimizer.buffer_count, sub_group_size");
}

NvmeNeed NvmeBytesByPath(const MemoryPlan& plan) {
  NvmeNeed need;
  for (const auto& [name, bytes] : plan.items) {
    (name.rfind("params.", 0) == 0 ? need.params : need.optimizer) += bytes.nvme;
  }
  return need;
}

Status DiskSpaceError(const std::string& what, uint64_t need, uint64_t free_bytes) {
  return InvalidArgumentError(
      what + " has " + FormatBytes(free_bytes) + " free, but this run's swap files need " +
      FormatBytes(need) +
      " there (`strata estimate --config` itemizes it): free space, point "
      "nvme_path at a larger drive, or shrink the need: zero_optimization.offload_param.device "
      "cpu (parameters in host memory), offload_optimizer.device cpu, bf16 with "
      "bf16.bf16_optimizer_states (moments in bf16), or more ranks on other machines (each keeps "
      "1/N of the state)");
}

namespace {

// Activation counts are products of up to five sizes a user sets (micro-batch, sequence length,
// heads...): computed in floating point and saturated, so absurd flags give "too large", not a
// wrapped small number.
uint64_t SaturatedBytes(double bytes) {
  constexpr double kMax = 1.8e19;  // just below 2^64
  return bytes >= kMax ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(bytes);
}

}  // namespace

ActivationBytes GptActivationBytes(const GptShape& shape, int micro_batch, int compute_bytes) {
  const double mb = micro_batch;
  const double seq = shape.seq_len;
  const double d = shape.d_model;
  const double heads = shape.n_heads;
  const double bytes = compute_bytes;
  ActivationBytes out;
  out.checkpoint = SaturatedBytes(shape.n_layers * mb * seq * d * bytes);
  out.working = SaturatedBytes(mb * seq * (16 * d + 2 * heads * seq) * bytes);
  return out;
}

ActivationBytes LlamaActivationBytes(const LlamaShape& shape, int micro_batch, int seq_len,
                                     int compute_bytes) {
  const double mb = micro_batch;
  const double t = seq_len;
  const double h = static_cast<double>(shape.hidden_size);
  const double heads = static_cast<double>(shape.num_attention_heads);
  const double q = heads * static_cast<double>(shape.head_dim);
  const double kv = static_cast<double>(shape.num_key_value_heads) * shape.head_dim;
  double i = static_cast<double>(shape.intermediate_size);
  if (shape.num_experts > 0) {
    // A token's MLP activations in a sparse layer: its top-k experts' and the shared expert's.
    const double sparse = static_cast<double>(shape.num_experts_per_tok) *
                              static_cast<double>(shape.moe_intermediate_size) +
                          static_cast<double>(shape.shared_expert_intermediate_size);
    i = SparseLayerCount(shape) < shape.num_hidden_layers ? std::max(i, sparse) : sparse;
  }
  const double vocab = static_cast<double>(shape.vocab_size);
  const double bytes = compute_bytes;
  ActivationBytes out;
  out.checkpoint = SaturatedBytes(shape.num_hidden_layers * mb * t * h * bytes);
  double working = mb * t * (4 * h + 2 * q + 2 * kv + 4 * i) * bytes +
                   mb * heads * t * t * (4 + bytes) + mb * t * vocab * 4;
  if (IsGemma2(shape)) {
    // The two feed-forward norms' outputs and the post-norms' inputs; the tanh of each soft-cap
    // (attention scores, logits) kept for its backward.
    working += mb * t * 4 * h * bytes;
    if (shape.attn_logit_softcapping) working += mb * heads * t * t * bytes;
    if (shape.final_logit_softcapping) working += mb * t * vocab * bytes;
  }
  out.working = SaturatedBytes(working);
  return out;
}

DeepSpeedEstimate DeepSpeedZero3Estimate(uint64_t total_params, uint64_t largest_layer_params,
                                         bool offload_optimizer, bool offload_params,
                                         int num_gpus) {
  // Same arithmetic as DeepSpeed (floating point, truncated), num_gpus_per_node = num_gpus,
  // num_nodes = 1.
  const double gpus = static_cast<double>(std::max(1, num_gpus));
  constexpr double kBufferFactor = 1.5;
  const double p = static_cast<double>(total_params);
  const uint64_t largest_layer_memory = 4 * largest_layer_params;
  DeepSpeedEstimate out;
  if (offload_optimizer && offload_params) {
    out.gpu = largest_layer_memory;
    out.cpu = static_cast<uint64_t>(p * 18 * kBufferFactor);
  } else if (offload_optimizer) {
    out.gpu = largest_layer_memory + static_cast<uint64_t>(2 * p / gpus);
    out.cpu = static_cast<uint64_t>(p * 16 * kBufferFactor);
  } else {
    out.gpu = largest_layer_memory + static_cast<uint64_t>(18 * p / gpus);
    out.cpu =
        static_cast<uint64_t>(static_cast<double>(largest_layer_params) * 4 * gpus * kBufferFactor);
  }
  return out;
}

namespace {

// A unit's tensors split by the persistence threshold: (the unit's elements, the elements it
// leaves resident).
std::pair<uint64_t, uint64_t> SplitByPersistence(const std::vector<uint64_t>& tensors,
                                                 uint64_t threshold) {
  uint64_t unit = 0, resident = 0;
  for (uint64_t n : tensors) (n <= threshold ? resident : unit) += n;
  return {unit, resident};
}

}  // namespace

PlanInput GptPlanInput(const GptShape& shape, int micro_batch, int compute_bytes,
                       uint64_t sub_group_size, uint64_t persistence_threshold) {
  PlanInput in;
  const auto [unit, kept] = SplitByPersistence(BlockTensorNumels(shape), persistence_threshold);
  in.layout = MakeModelLayout(std::vector<uint64_t>(static_cast<size_t>(shape.n_layers), unit),
                              ResidentParams(shape) + shape.n_layers * kept, sub_group_size);
  in.compute_bytes = compute_bytes;
  const ActivationBytes act = GptActivationBytes(shape, micro_batch, compute_bytes);
  in.activation_checkpoint_bytes = act.checkpoint;
  in.activation_working_bytes = act.working;
  return in;
}

PlanInput LlamaPlanInput(const LlamaShape& shape, int micro_batch, int seq_len, int compute_bytes,
                         uint64_t sub_group_size, uint64_t persistence_threshold) {
  PlanInput in;
  // Layer by layer (Qwen2-MoE's dense layers differ from its sparse ones), unit by unit (with
  // page_experts a layer is several units, and its norms and router are resident).
  std::vector<uint64_t> units;
  uint64_t resident = LlamaResidentParams(shape);
  for (int64_t l = 0; l < shape.num_hidden_layers; ++l) {
    std::vector<uint64_t> outside;
    for (const LlamaUnitTensors& u : LlamaLayerUnits(shape, l, &outside)) {
      const auto [unit, kept] = SplitByPersistence(u.tensors, persistence_threshold);
      units.push_back(unit);
      resident += kept;
    }
    for (uint64_t n : outside) resident += n;
  }
  in.layout = MakeModelLayout(units, resident, sub_group_size);
  in.compute_bytes = compute_bytes;
  const ActivationBytes act = LlamaActivationBytes(shape, micro_batch, seq_len, compute_bytes);
  in.activation_checkpoint_bytes = act.checkpoint;
  in.activation_working_bytes = act.working;
  return in;
}

}  // namespace strata::runtime
