// NvmeTrafficPerStep walks the plan's groups and sub-groups once and adds each block's bytes
// (padded as the plan pads them) times how often the step moves it (step_traffic.h).
#include "runtime/plan/step_traffic.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "base/bytes.h"

namespace strata::runtime {

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
    if (group >= units || use.empty()) return UnitUse{micro_batches, 1};  // the resident group too
    return use[group];
  };
  const uint64_t cb = static_cast<uint64_t>(in.compute_bytes);
  const size_t in_cpu = UnitsInCpu(in);
  for (size_t u = 0; u < units; ++u) {
    if (in.params != Home::kNvme || u < in_cpu) continue;
    const UnitUse x = use_of(u);
    const double block = static_cast<double>(AlignUp(layout.unit_numel[u] * cb, in.io_align));
    t.params_read += 2 * x.micro_batches * block;
    t.optimizer_written += x.stepped * block;  // the updated parameters (fp32: the master)
    if (MasterInParams(in, static_cast<int>(u))) t.optimizer_read += x.stepped * block;
  }
  if (in.optimizer != Home::kNvme) return t;
  // Blocks the host-RAM tier keeps move no NVMe bytes.
  const HostCacheSplit split = SplitHostCache(in);
  for (size_t s = 0; s < layout.subgroups.size(); ++s) {
    const SubGroupSpan& sg = layout.subgroups[s];
    const UnitUse x = use_of(static_cast<size_t>(sg.group));
    const double grad =
        split.grads[s] != 0 ? 0.0 : static_cast<double>(AlignUp(sg.numel * 4, in.io_align));
    const double state = split.state[s] != 0
                             ? 0.0
                             : static_cast<double>(AlignUp(StateBlockBytes(in, sg), in.io_align));
    t.grads_written += x.micro_batches * grad;
    t.grads_read += std::max(0.0, x.micro_batches - x.stepped) * grad;
    t.optimizer_read += x.stepped * (state + grad);
    t.optimizer_written += x.stepped * state;
  }
  return t;
}

std::vector<UnitUse> LlamaUnitUse(const LlamaShape& shape, int accumulation,
                                  uint64_t tokens_per_micro_batch, int world) {
  const double micro_batches = accumulation;
  const double tokens = static_cast<double>(tokens_per_micro_batch);
  const UnitUse always{micro_batches, 1};
  const UnitUse expert{micro_batches * ExpertHitProbability(shape, tokens),
                       ExpertHitProbability(shape, tokens * micro_batches * world)};
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
