// CheckFit adds up what a plan needs per tier and compares it with the machine; SuggestChanges
// searches config changes that make a plan fit.
//
// Algorithm (SuggestChanges): the candidates are single edits of the PlanInput, each named by the
// config key it stands for, listed cheapest first (they cost the least step time): smaller
// sub-groups, fewer parameter buffers, no optimizer pipelining, a smaller micro-batch, then state
// moved one tier down (optimizer before parameters, cpu before nvme). The first candidate that
// fits alone is the answer. Otherwise a greedy search applies, step by step, the candidate that
// most reduces the shortfall (bytes missing, summed over tiers), until the plan fits or no
// candidate reduces it any more; the shortfall strictly decreases, so the search ends.
#include "runtime/plan/plan_fit.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "base/bytes.h"
#include "runtime/plan/placement.h"
#include "tiers/tier.h"

namespace strata::runtime {
namespace {

struct Change {
  std::string description;  // "offload_optimizer.device: cpu -> nvme"
  PlanInput input;
  int micro_batch = 1;          // after the change
  uint64_t sub_group_size = 0;  // after the change (what the config key would say)
};

std::vector<Change> CandidateChanges(const PlanInput& in, uint64_t sub_group_size,
                                     const ActivationModel& activations, int micro_batch) {
  std::vector<Change> out;
  auto add = [&](std::string description, const std::function<void(PlanInput&)>& edit) {
    PlanInput changed = in;
    edit(changed);
    // Planned where the engine would run the optimizer (e.g. parameters moved to cpu with the
    // optimizer left on the device: the CPU optimizer); only 16-bit or not matters here.
    changed.optimizer = PlaceOptimizer(changed.params, changed.optimizer,
                                       changed.compute_bytes == 4 ? "fp32" : "bf16")
                            .home;
    out.push_back({std::move(description), std::move(changed), micro_batch, sub_group_size});
  };
  const uint64_t sgs = sub_group_size;
  if (in.optimizer == Home::kNvme || in.optimizer == Home::kCpu) {
    for (uint64_t smaller : {uint64_t{100000000}, uint64_t{10000000}}) {
      // Only where it cuts: a sub_group_size above every group's size changes nothing.
      if (smaller < sgs && smaller < in.layout.largest_sub_group()) {
        add("zero_optimization.sub_group_size: " + std::to_string(sgs) + " -> " +
                std::to_string(smaller),
            [=](PlanInput& p) {
              p.layout = MakeModelLayout(p.layout.unit_numel, p.layout.resident_numel, smaller);
            });
        out.back().sub_group_size = smaller;
      }
    }
  }
  if (in.params == Home::kNvme && in.param_buffer_count > 2) {
    add("offload_param.buffer_count: " + std::to_string(in.param_buffer_count) + " -> 2",
        [](PlanInput& p) { p.param_buffer_count = 2; });
  }
  if (in.optimizer == Home::kNvme && in.pipeline) {
    add("offload_optimizer.pipeline_read/pipeline_write: true -> false",
        [](PlanInput& p) { p.pipeline = false; });
  }
  if (activations) {
    for (int mb = micro_batch / 2; mb >= 1; mb /= 2) {
      add("train_micro_batch_size_per_gpu: " + std::to_string(micro_batch) + " -> " +
              std::to_string(mb),
          [&, mb](PlanInput& p) {
            const ActivationBytes act = activations(mb, p.compute_bytes);
            p.activation_checkpoint_bytes = act.checkpoint;
            p.activation_working_bytes = act.working;
          });
      out.back().micro_batch = mb;
    }
  }
  auto move = [&](const char* key, Home from, Home to, bool params) {
    add(std::string(key) + ": " + std::string(HomeName(from)) + " -> " + std::string(HomeName(to)),
        [=](PlanInput& p) { (params ? p.params : p.optimizer) = to; });
  };
  if (in.optimizer == Home::kDevice) {
    move("offload_optimizer.device", in.optimizer, Home::kCpu, false);
  }
  if (in.params == Home::kDevice) move("offload_param.device", in.params, Home::kCpu, true);
  if (in.optimizer != Home::kNvme) {
    move("offload_optimizer.device", in.optimizer, Home::kNvme, false);
  }
  if (in.params != Home::kNvme) move("offload_param.device", in.params, Home::kNvme, true);
  if (in.params != Home::kNvme && in.optimizer != Home::kNvme) {
    add("offload_param.device: " + std::string(HomeName(in.params)) +
            " -> nvme and offload_optimizer.device: " + std::string(HomeName(in.optimizer)) +
            " -> nvme",
        [](PlanInput& p) { p.params = p.optimizer = Home::kNvme; });
  }
  return out;
}

}  // namespace

MachineCapacity ProbeMachineCapacity() {
  MachineCapacity m;
  Result<HostMemory> mem = ReadHostMemory();
  if (mem.ok()) {
    m.memory = *mem;
  } else {
    m.memory_error = mem.status().ToString();
  }
  GpuSummary gpu = ProbeGpus();
  if (!gpu.devices.empty()) {
    m.has_gpu = true;
    m.gpu_bytes = gpu.devices.front().total_bytes;
    m.gpu_name = gpu.devices.front().name;
  } else {
    m.gpu_reason = gpu.reason;
  }
  return m;
}

Fit CheckFit(const MemoryPlan& plan, const MachineCapacity& m, const NvmePaths& paths) {
  Fit fit;
  fit.device_need = plan.total.device;
  fit.host_need = plan.total.pinned + plan.total.host;
  if (m.has_gpu) {
    fit.device_have = m.gpu_bytes;
    if (fit.device_need > fit.device_have) {
      fit.problems.push_back("GPU needs " + FormatBytes(fit.device_need) + ", " + m.gpu_name +
                             " has " + FormatBytes(fit.device_have));
    }
  } else {
    fit.host_need += fit.device_need;  // the host emulates the device
  }
  if (m.memory) {
    fit.host_have = m.memory->available;
    if (fit.host_need > fit.host_have) {
      fit.problems.push_back("host memory needs " + FormatBytes(fit.host_need) +
                             (m.has_gpu ? "" : " (device emulated in host memory)") + ", " +
                             FormatBytes(fit.host_have) + " available");
    }
  } else {
    fit.problems.push_back("cannot read host memory: " + m.memory_error);
  }
  uint64_t param_nvme = 0;
  for (const auto& [name, bytes] : plan.items) {
    if (name == "params.units") param_nvme += bytes.nvme;
  }
  const uint64_t optimizer_nvme = plan.total.nvme - param_nvme;
  struct Need {
    std::string path;
    uint64_t bytes;
  };
  std::vector<Need> needs;
  if (param_nvme > 0) needs.push_back({paths.params, param_nvme});
  if (optimizer_nvme > 0) needs.push_back({paths.optimizer, optimizer_nvme});
  std::vector<std::pair<uint64_t, size_t>> filesystems;  // st_dev -> index in fit.disks
  for (const Need& need : needs) {
    Result<DiskSpace> space = ReadDiskSpace(need.path);
    if (!space.ok()) {
      fit.disks.push_back({need.path, need.bytes, 0, space.status().ToString()});
      fit.problems.push_back("cannot check " + need.path + ": " + space.status().ToString());
      continue;
    }
    auto same = std::find_if(filesystems.begin(), filesystems.end(),
                             [&](const auto& f) { return f.first == space->filesystem; });
    if (same != filesystems.end()) {
      DiskCheck& d = fit.disks[same->second];
      d.need += need.bytes;
      if (d.path != need.path) d.path += " + " + need.path;
      continue;
    }
    filesystems.emplace_back(space->filesystem, fit.disks.size());
    fit.disks.push_back({need.path, need.bytes, space->free, ""});
  }
  for (const DiskCheck& d : fit.disks) {
    if (d.error.empty() && d.need > d.free) {
      fit.problems.push_back("NVMe at " + d.path + " needs " + FormatBytes(d.need) + ", " +
                             FormatBytes(d.free) + " free");
    }
  }
  fit.fits = fit.problems.empty();
  return fit;
}

uint64_t Shortfall(const Fit& fit, const MachineCapacity& m) {
  auto over = [](uint64_t need, uint64_t have) { return need > have ? need - have : 0; };
  uint64_t total = over(fit.host_need, fit.host_have);
  if (m.has_gpu) total += over(fit.device_need, fit.device_have);
  for (const DiskCheck& d : fit.disks) total += over(d.need, d.free);
  return total;
}

std::optional<FitSuggestion> SuggestChanges(const PlanInput& in, uint64_t sub_group_size,
                                            const std::optional<GptShape>& shape, int micro_batch,
                                            const MachineCapacity& m, const NvmePaths& paths) {
  ActivationModel activations;
  if (shape) {
    activations = [s = *shape](int mb, int compute_bytes) {
      return GptActivationBytes(s, mb, compute_bytes);
    };
  }
  return SuggestChanges(in, sub_group_size, activations, micro_batch, m, paths);
}

std::optional<FitSuggestion> SuggestChanges(const PlanInput& in, uint64_t sub_group_size,
                                            const ActivationModel& activations, int micro_batch,
                                            const MachineCapacity& m, const NvmePaths& paths) {
  for (const Change& change : CandidateChanges(in, sub_group_size, activations, micro_batch)) {
    Fit f = CheckFit(PlanMemory(change.input), m, paths);
    if (f.fits) return FitSuggestion{{change.description}, f};
  }
  PlanInput current = in;
  int current_mb = micro_batch;
  uint64_t current_sgs = sub_group_size;
  uint64_t shortfall = Shortfall(CheckFit(PlanMemory(current), m, paths), m);
  std::vector<std::string> steps;
  for (int round = 0; round < 16; ++round) {
    std::optional<Change> best;
    std::optional<Fit> best_fit;
    uint64_t best_shortfall = shortfall;
    for (Change& change : CandidateChanges(current, current_sgs, activations, current_mb)) {
      Fit f = CheckFit(PlanMemory(change.input), m, paths);
      const uint64_t s = Shortfall(f, m);
      if (s < best_shortfall || (f.fits && !best_fit)) {
        best_shortfall = s;
        best = std::move(change);
        best_fit = f;
      }
    }
    if (!best) return std::nullopt;  // nothing helps any more
    current = best->input;
    current_mb = best->micro_batch;
    current_sgs = best->sub_group_size;
    shortfall = best_shortfall;
    steps.push_back(best->description);
    if (best_fit->fits) return FitSuggestion{std::move(steps), *best_fit};
  }
  return std::nullopt;
}

}  // namespace strata::runtime
