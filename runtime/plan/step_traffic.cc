// NvmeTrafficPerStep walks the plan's groups and sub-groups once and adds each block's bytes
// (padded as the plan pads them) times how often the step moves it (step_traffic.h).
#include "runtime/plan/step_traffic.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "base/bytes.h"

namespace strata::runtime {

namespace {

// The optimizer's reads of gradient blocks on NVMe at the step (sub-group indices in `nvme`,
// layout order), given that the last hand-off leaves the last `slots` of them it wrote in the
// gradient pool. Replays the optimizer pipeline's use of that pool: the resident group's
// sub-groups first (stepped at the step), then the units' in order (deferred); before sub-group
// k is acquired, k+1 .. k+read_ahead are prefetched; room is made by evicting a block not used
// again (first), else the one used furthest ahead (FutureUsePolicy), never a prefetched block not
// used yet for a prefetch. Returns the bytes read (blocks padded to io_align).
double OptimizerGradReads(const ModelLayout& layout, const std::vector<size_t>& nvme, size_t slots,
                          bool pipeline, uint64_t io_align) {
  const size_t units = layout.unit_numel.size();
  auto group_of = [&](size_t s) { return static_cast<size_t>(layout.subgroups[s].group); };
  // Hand-off order: units last to first (their sub-groups in order), then the resident group.
  std::vector<size_t> handoff;
  for (size_t u = units; u-- > 0;) {
    for (size_t s : nvme) {
      if (group_of(s) == u) handoff.push_back(s);
    }
  }
  for (size_t s : nvme) {
    if (group_of(s) >= units) handoff.push_back(s);
  }
  std::vector<size_t> order;  // the optimizer's
  for (size_t s : nvme) {
    if (group_of(s) >= units) order.push_back(s);
  }
  const size_t resident = order.size();
  for (size_t s : nvme) {
    if (group_of(s) < units) order.push_back(s);
  }
  struct Slot {
    size_t sub_group;
    bool awaiting;  // prefetched, not acquired yet
  };
  std::vector<Slot> pool;
  for (size_t i = handoff.size() > slots ? handoff.size() - slots : 0; i < handoff.size(); ++i) {
    pool.push_back({handoff[i], false});
  }
  const size_t read_ahead = pipeline ? std::max<size_t>(1, slots > 2 ? slots - 2 : 1) : 0;
  double reads = 0;
  auto bytes = [&](size_t s) {
    return static_cast<double>(AlignUp(layout.subgroups[s].numel * 4, io_align));
  };
  auto find = [&](size_t s) {
    return std::find_if(pool.begin(), pool.end(), [&](const Slot& x) { return x.sub_group == s; });
  };
  // Makes room for one more block while order[k] is next; false: nothing may go.
  auto make_room = [&](size_t k, size_t end, bool spare_awaiting) {
    if (pool.size() < slots) return true;
    size_t victim = pool.size();
    size_t victim_distance = 0;
    for (size_t i = 0; i < pool.size(); ++i) {
      if (spare_awaiting && pool[i].awaiting) continue;
      const auto last = order.begin() + static_cast<std::ptrdiff_t>(end);
      const auto next =
          std::find(order.begin() + static_cast<std::ptrdiff_t>(k), last, pool[i].sub_group);
      const size_t distance =
          next == last ? order.size() : static_cast<size_t>(next - order.begin());
      if (victim == pool.size() || distance > victim_distance) {
        victim = i;
        victim_distance = distance;
      }
    }
    if (victim == pool.size()) return false;
    pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(victim));
    return true;
  };
  for (size_t k = 0; k < order.size(); ++k) {
    // The resident group's sub-groups are a pass of their own (at the step): none of them
    // prefetches a unit's.
    const size_t end = k < resident ? resident : order.size();
    for (size_t a = k + 1; a < end && a <= k + read_ahead; ++a) {
      if (find(order[a]) != pool.end() || !make_room(k, end, /*spare_awaiting=*/true)) continue;
      pool.push_back({order[a], true});
      reads += bytes(order[a]);
    }
    if (auto it = find(order[k]); it != pool.end()) {
      it->awaiting = false;
      continue;
    }
    if (!make_room(k, end, /*spare_awaiting=*/false)) continue;
    pool.push_back({order[k], false});
    reads += bytes(order[k]);
  }
  return reads;
}

// Whether the device horizon the coordinator sets as the forward gathers the first unit
// (param_coordinator.cc Prefetch: the next units while one more fits in the device slots and
// their elements in device_prefetch_elements) holds all the other units.
bool DeviceHorizonHoldsEveryUnit(const PlanInput& in) {
  const std::vector<uint64_t>& numel = in.layout.unit_numel;
  uint64_t units = 0, elements = 0;
  for (size_t u = 1; u < numel.size(); ++u) {
    if (numel[u] == 0) continue;
    if (units + 1 >= in.device_unit_slots || elements + numel[u] > in.device_prefetch_elements) {
      return false;
    }
    ++units;
    elements += numel[u];
  }
  return true;
}

}  // namespace

StepTraffic NvmeTrafficPerStep(const PlanInput& in, int accumulation,
                               std::span<const UnitUse> use) {
  assert(accumulation >= 1);
  const ModelLayout& layout = in.layout;
  const size_t units = layout.unit_numel.size();
  assert(use.empty() || use.size() == units);
  StepTraffic t;
  if (in.inference) return t;
  const double micro_batches = accumulation;
  auto use_of = [&](size_t group) {
    // The resident group too.
    if (group >= units || use.empty()) return UnitUse{micro_batches, 1, 1};
    return use[group];
  };
  // Every unit in every micro-batch (dense models): what stays in memory between two uses is
  // counted (step_traffic.h); routed experts keep the expectation of one read per use.
  const bool dense = use.empty();
  const uint64_t cb = static_cast<uint64_t>(in.compute_bytes);
  const size_t in_cpu = UnitsInCpu(in);
  // Units still held between two uses: the device window's last units, or the parameter pool's
  // pinned copies where it holds more (max(2, buffer_count) slots).
  const uint64_t pinned_slots = static_cast<uint64_t>(std::max(2, in.param_buffer_count));
  const size_t window = dense ? static_cast<size_t>(std::min<uint64_t>(
                                    std::max(in.device_unit_slots, pinned_slots), units))
                              : 0;
  // The deferred update of a unit leaves its parameter block pinned just before the next forward
  // gathers it (optimizer on NVMe, pipelined: the update is no faster than the forward), or
  // copies it on to the device at once when the coordinator's device horizon holds every unit
  // after the first (param_coordinator.h: an update running ahead of the forward loses none).
  const bool forward_from_update =
      dense && ((in.optimizer == Home::kNvme && in.pipeline) || DeviceHorizonHoldsEveryUnit(in));
  for (size_t u = 0; u < units; ++u) {
    if (in.params != Home::kNvme || u < in_cpu) continue;
    const UnitUse x = use_of(u);
    const double block = static_cast<double>(AlignUp(layout.unit_numel[u] * cb, in.io_align));
    const bool master = MasterInParams(in, static_cast<int>(u));
    if (!dense) {
      t.params_read += 2 * x.micro_batches * block;
      t.optimizer_written += x.stepped * block;  // the updated parameters (fp32: the master)
      if (master) t.optimizer_read += x.stepped * block;
      continue;
    }
    // Memory holds the last `window` units gathered: after a forward, the last units
    // (a backward starts with them); after a backward, the first ones (the optimizer's master and
    // the next micro-batch's forward find them there).
    const bool after_forward = u + window >= units;
    const bool after_backward = u < window;
    double reads = 0;
    for (int m = 0; m < accumulation; ++m) {
      if (m > 0 || !forward_from_update) reads += after_backward && m > 0 ? 0 : 1;  // forward
      reads += after_forward ? 0 : 1;                                               // backward
    }
    t.params_read += reads * block;
    t.optimizer_written += block;
    if (master && !after_backward) t.optimizer_read += block;
  }
  if (in.optimizer != Home::kNvme) return t;
  // Blocks the host-RAM tier keeps move no NVMe bytes.
  const HostCacheSplit split = SplitHostCache(in);
  std::vector<size_t> nvme_grads;
  for (size_t s = 0; s < layout.subgroups.size(); ++s) {
    const SubGroupSpan& sg = layout.subgroups[s];
    const UnitUse x = use_of(static_cast<size_t>(sg.group));
    const double grad =
        split.grads[s] != 0 ? 0.0 : static_cast<double>(AlignUp(sg.numel * 4, in.io_align));
    const double state = split.state[s] != 0
                             ? 0.0
                             : static_cast<double>(AlignUp(StateBlockBytes(in, sg), in.io_align));
    t.grads_written += x.micro_batches * grad;
    t.optimizer_read += x.stepped * state;
    t.optimizer_written += x.stepped * state;
    if (!dense) {
      t.grads_read += std::max(0.0, x.micro_batches - x.has_gradient) * grad;
      t.optimizer_read += x.has_gradient * grad;  // a zero gradient is not read
    } else if (split.grads[s] == 0) {
      nvme_grads.push_back(s);
    }
  }
  if (dense && in.pipeline && AnyOnNvme(split.state)) {
    // The first state blocks are read ahead while the last backward computes (the pool's slots
    // less one), then the resident group's are stepped first: where they do not fit beside the
    // ones read ahead, the oldest of those is evicted and read again.
    const size_t slots = static_cast<size_t>(OptimizerSubGroupBuffers(in));
    const size_t ahead = slots > 1 ? slots - 1 : 0;
    std::vector<size_t> read_ahead;  // on NVMe, read ahead
    for (size_t s = 0; s < layout.subgroups.size() && s < ahead; ++s) {
      if (split.state[s] == 0 && static_cast<size_t>(layout.subgroups[s].group) < units) {
        read_ahead.push_back(s);
      }
    }
    size_t resident_states = 0;
    for (size_t s = 0; s < layout.subgroups.size(); ++s) {
      if (split.state[s] == 0 && static_cast<size_t>(layout.subgroups[s].group) >= units) {
        ++resident_states;
      }
    }
    const size_t overflow =
        std::min(read_ahead.size(), read_ahead.size() + resident_states > slots
                                        ? read_ahead.size() + resident_states - slots
                                        : size_t{0});
    for (size_t i = 0; i < overflow; ++i) {
      t.optimizer_read += static_cast<double>(
          AlignUp(StateBlockBytes(in, layout.subgroups[read_ahead[i]]), in.io_align));
    }
  }
  if (dense && !nvme_grads.empty()) {
    // The gradient pool keeps the blocks a hand-off wrote last: all of them when they fit (no
    // read at all), else the next hand-off (accumulation) starts with blocks long evicted and
    // reads every one, and the optimizer finds the last few (OptimizerGradReads).
    const size_t slots = static_cast<size_t>(OptimizerSubGroupBuffers(in));
    const double grad_bytes = [&] {
      double b = 0;
      for (size_t s : nvme_grads) {
        b += static_cast<double>(AlignUp(layout.subgroups[s].numel * 4, in.io_align));
      }
      return b;
    }();
    if (nvme_grads.size() > slots) {
      t.grads_read += (micro_batches - 1) * grad_bytes;
      t.optimizer_read += OptimizerGradReads(layout, nvme_grads, slots, in.pipeline, in.io_align);
    }
  }
  return t;
}

std::vector<UnitUse> LlamaUnitUse(const LlamaShape& shape, int accumulation,
                                  uint64_t tokens_per_micro_batch, int world) {
  const double micro_batches = accumulation;
  const double tokens = static_cast<double>(tokens_per_micro_batch);
  const UnitUse always{micro_batches, 1, 1};
  const UnitUse expert{micro_batches * ExpertHitProbability(shape, tokens),
                       ExpertHitProbability(shape, tokens * micro_batches * world), 1};
  std::vector<UnitUse> out;
  for (int64_t l = 0; l < shape.num_hidden_layers; ++l) {
    for (const LlamaUnitTensors& u : LlamaLayerUnits(shape, l)) {
      out.push_back(u.kind == LlamaUnitTensors::Kind::kExpert ? expert : always);
    }
  }
  return out;
}

nlohmann::json StepTrafficJson(const StepTraffic& t) {
  auto bytes = [](double b) { return static_cast<uint64_t>(std::llround(b)); };
  return {{"read", bytes(t.read())},
          {"written", bytes(t.written())},
          {"params_read", bytes(t.params_read)},
          {"grads_read", bytes(t.grads_read)},
          {"grads_written", bytes(t.grads_written)},
          {"optimizer_read", bytes(t.optimizer_read)},
          {"optimizer_written", bytes(t.optimizer_written)}};
}

}  // namespace strata::runtime
