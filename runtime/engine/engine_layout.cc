#include "runtime/engine/engine_layout.h"

#include <algorithm>
#include <unordered_map>
#include <utility>

#include "base/bytes.h"

namespace strata::runtime {

ModelLayout EngineLayout::Plan() const {
  ModelLayout m;
  for (int u = 0; u < resident_group; ++u) m.unit_numel.push_back(groups[u].part);
  m.resident_numel = groups[resident_group].gathered();
  m.subgroups = subgroups;
  m.largest_gathered = max_unit_gathered;
  m.world = world;
  return m;
}

Result<EngineLayout> PartitionModel(torch::nn::Module& model, Home params_home,
                                    uint64_t persistence_threshold, uint64_t sub_group_size,
                                    UnitHooks* hooks, int world, int rank) {
  if (world < 1 || rank < 0 || rank >= world) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " of world size " +
                                std::to_string(world));
  }
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
  EngineLayout l;
  l.groups.resize(units.size() + 1);
  l.resident_group = static_cast<int>(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    l.groups[u].name = units[u].first;
    l.groups[u].unit = true;
    l.groups[u].conditional = units[u].second->conditional();
    l.groups[u].home = params_home;
  }
  l.groups[l.resident_group].name = "resident";
  l.groups[l.resident_group].home = Home::kDevice;
  l.unit_grad_params.resize(units.size());
  l.unit_grad_targets.resize(units.size());

  for (const auto& item : model.named_parameters()) {
    const torch::Tensor& p = item.value();
    if (!p.requires_grad()) continue;  // frozen: left alone
    if (p.scalar_type() != torch::kFloat32 || p.device().type() != torch::kCPU) {
      return InvalidArgumentError(
          "parameter " + item.key() + " must be fp32 on the CPU when the engine starts (got " +
          std::string(c10::toString(p.scalar_type())) + " on " + p.device().str() + ")");
    }
    auto it = owner.find(p.unsafeGetTensorImpl());
    const int unit = it == owner.end() ? -1 : it->second;
    const bool persistent = unit < 0 || static_cast<uint64_t>(p.numel()) <= persistence_threshold;
    ParamGroup& g = l.groups[persistent ? l.resident_group : unit];
    ParamSlot slot;
    slot.name = item.key();
    slot.var = p;
    slot.shape = p.sizes().vec();
    slot.numel = static_cast<uint64_t>(p.numel());
    slot.offset = g.numel;
    g.numel += slot.numel;
    g.params.push_back(std::move(slot));
    if (unit >= 0) {
      l.unit_grad_params[unit].push_back(p);
      l.unit_grad_targets[unit].push_back({persistent, static_cast<int>(g.params.size()) - 1});
    }
  }
  l.world = world;
  l.rank = rank;
  std::vector<uint64_t> group_numel;
  for (ParamGroup& g : l.groups) {
    group_numel.push_back(g.numel);
    const Slice s = SliceOf(g.numel, world, rank);
    g.part = s.part;
    g.own_begin = s.begin;
    g.own_numel = s.numel;
    g.world = world;
  }
  l.subgroups = RankSubGroups(group_numel, sub_group_size, world, rank);
  for (int si = 0; si < static_cast<int>(l.subgroups.size()); ++si) {
    const SubGroupSpan& sg = l.subgroups[si];
    l.groups[sg.group].subgroups.push_back(si);
    l.max_subgroup_numel = std::max(l.max_subgroup_numel, sg.numel);
  }
  for (size_t u = 0; u < units.size(); ++u) {
    l.max_unit_numel = std::max(l.max_unit_numel, l.groups[u].numel);
    l.max_unit_part = std::max(l.max_unit_part, l.groups[u].part);
    l.max_unit_gathered = std::max(l.max_unit_gathered, l.groups[u].gathered());
    units[u].second->Attach(hooks, static_cast<int>(u));
  }
  return l;
}

uint64_t BlockSizes::Param(uint64_t numel) const {
  return AlignUp(numel * compute_bytes, kIoAlign);
}
uint64_t BlockSizes::State(uint64_t numel, bool master_in_params) const {
  return AlignUp(numel * StateElementBytes(master_in_params), kIoAlign);
}
uint64_t BlockSizes::Grad(uint64_t numel) const { return AlignUp(numel * 4, kIoAlign); }

int StateArrays(cpu_optimizer::OptimizerType type) { return 1 + cpu_optimizer::MomentCount(type); }

cpu_optimizer::FlatSpan StateSpan(cpu_optimizer::OptimizerType type, uint64_t numel, float* state,
                                  const void* grads) {
  return StateSpan(type, numel, state, state + numel, grads);
}

cpu_optimizer::FlatSpan StateSpan(cpu_optimizer::OptimizerType type, uint64_t numel, float* master,
                                  void* moments, const void* grads, DType moment_dtype) {
  using cpu_optimizer::OptimizerType;
  cpu_optimizer::FlatSpan s;
  s.numel = numel;
  s.params = master;
  s.moment_dtype = moment_dtype;
  auto* next = static_cast<std::byte*>(moments);
  const uint64_t moment_array = numel * DTypeBytes(moment_dtype);
  if (type == OptimizerType::kAdam || type == OptimizerType::kAdamW) {
    s.exp_avg = next;
    s.exp_avg_sq = next + moment_array;
  } else if (type == OptimizerType::kLion) {
    s.exp_avg = next;
  } else {
    s.exp_avg_sq = next;
  }
  s.grads = grads;
  return s;
}

}  // namespace strata::runtime
