// `strata bench step`: does a training step under full NVMe offload overlap its parts?
//
// In one run, on one GPT (the runtime's model) and one NVMe directory:
//   1. full: steps with parameters and optimizer state on NVMe (device budget: the resident
//      parameters plus --device-units units, so every unit is fetched again each pass); times
//      forward+backward and the optimizer step; a Chrome trace of the last step is written;
//   2. forward+backward I/O alone: the recorded pass replayed without compute (the same gathers
//      with the same prefetching, and the gradient hand-off writes);
//   3. optimizer state I/O alone: the step's reads and writes without the arithmetic;
//   4. forward+backward compute alone: the same model with its parameters resident in host memory
//      (offload_param cpu: no NVMe; still recomputing each unit in backward, as the offloaded run
//      does);
//   5. CPU optimizer alone: the fused optimizer over the same number of elements, in RAM, in
//      sub-groups of the same size, plus the parameter copy-out.
// Each phase is reported next to the larger of its two parts; overlap is perfect at 1.0. The
// configurations exist side by side and take turns step by step (1, 2+3, 4, 5, then again), so
// their ratios hold on a machine or disk whose speed drifts. NVMe bytes per step are reported per
// phase and against the least the layout must move.
//
// With --model (a Llama-family preset or Hugging Face directory; mixtures of experts are what it
// is for) the question is the NVMe bytes of per-expert paging: the model is trained with
// parameters and optimizer state on NVMe on the host-emulated device, as whole layers and with
// --page-experts side by side (one of them with --page-experts alone), taking turns step by step;
// each reports its step time, the NVMe bytes read and written per step (measured by the tiers,
// the optimizer step finished inside the step), the experts its tokens reached (the optimizer
// steps every expert), and what `strata estimate` predicts for it (runtime/plan/step_traffic.h):
// by uniform routing, and by the experts the run's tokens actually reached. The estimate's layout
// is checked against the engine's.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/logging.h"
#include "base/trace.h"
#include "bench/commands.h"
#include "cpu_optimizer/optimizer.h"
#include "runtime/commands/flag_checks.h"
#include "runtime/commands/training_flags.h"
#include "runtime/engine/compute_device.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_layout.h"
#include "runtime/engine/io_replay.h"
#include "runtime/engine/torch_stream.h"
#include "runtime/models/causal_lm.h"
#include "runtime/models/gpt.h"
#include "runtime/plan/llama_shape.h"
#include "runtime/plan/model_presets.h"
#include "runtime/plan/model_spec.h"
#include "runtime/plan/step_traffic.h"

namespace strata::bench {
namespace {

// The run's swap files under `root`, removed with everything in them when the run ends.
struct ScratchDir {
  std::string path;
  static Result<ScratchDir> Create(const std::string& root) {
    ScratchDir d;
    d.path = root + "/strata-bench-step-" + std::to_string(getpid());
    std::error_code ec;
    std::filesystem::create_directories(d.path, ec);
    if (ec) return IoErrorFromErrno(ec.value(), "creating " + d.path);
    return d;
  }
  ScratchDir() = default;
  ScratchDir(ScratchDir&& o) noexcept : path(std::exchange(o.path, {})) {}
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ScratchDir& operator=(ScratchDir&&) = delete;
  ~ScratchDir() {
    if (path.empty()) return;
    std::error_code e;
    std::filesystem::remove_all(path, e);
  }
};

struct StepFlags {
  std::string path = "/tmp";
  int layers = 8;
  int width = 512;
  int heads = 8;
  int seq = 128;
  int batch = 2;
  int steps = 3;
  int device_units = 3;
  std::string sub_group = "1e9";
  int threads = 0;
  std::string backend = "auto";
  std::string trace = "strata-step-trace.json";
  bool no_swap_checksums = false;  // EngineOptions::swap_checksums off
  std::string device = "auto";     // --device: auto, host, cuda, cuda:N
  std::string model;               // --model: a Llama-family model (RunBenchStepModel)
  bool page_experts = false;       // --page-experts: only the paged layout
  int buffer_count = 2;            // --buffer-count: offload_param.buffer_count (--model)
  std::string host_memory = "0";   // --host-memory: the offloaded run's host budget (or auto)
};

// The engine options of both benchmarks (the GPT's and --model's): every parameter in a unit
// (persistence threshold 0), pageable host memory, --sub-group, --backend, the swap checksums and
// `threads` for the CPU optimizer.
runtime::EngineOptions BaseEngineOptions(const StepFlags& f, int threads, uint64_t sub_group) {
  runtime::EngineOptions o;
  o.optimizer_options.threads = threads;
  o.persistence_threshold = 0;
  o.pin_memory = false;
  o.sub_group_size = sub_group;
  o.io_backend = f.backend;
  o.swap_checksums = !f.no_swap_checksums;
  return o;
}

// `o` with parameters and optimizer state on NVMe, their swap files in `dir`.
runtime::EngineOptions AllOnNvme(runtime::EngineOptions o, const std::string& dir) {
  o.params = strata::Home::kNvme;
  o.optimizer = strata::Home::kNvme;
  o.param_nvme_path = dir;
  o.optimizer_nvme_path = dir;
  return o;
}

// --host-memory into `o`'s host budget, as `strata train` resolves it for one rank (the process
// reserve, the host-emulated device and the arena come out of it; auto caps nothing).
Status ApplyHostMemory(const StepFlags& f, runtime::EngineOptions& o) {
  STRATA_ASSIGN_OR_RETURN(const runtime::HostBudget budget,
                          runtime::ParseHostBudget(f.host_memory, runtime::ReadHostMemory()));
  o.host_cache_budget = budget.budget;
  o.host_memory_budget = budget.automatic ? 0 : budget.budget;
  o.host_memory_source = "--host-memory";
  o.host_process_reserve = runtime::kHostProcessReserve;
  return Status::Ok();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Data {
  std::vector<torch::Tensor> x, y;
};

Data MakeData(const StepFlags& f, int n, torch::Device device) {
  Data d;
  for (int i = 0; i < n; ++i) {
    auto seq = torch::randint(0, 256, {f.batch, f.seq + 1}, torch::kLong);
    d.x.push_back(seq.narrow(1, 0, f.seq).contiguous().to(device));
    d.y.push_back(seq.narrow(1, 1, f.seq).contiguous().to(device));
  }
  return d;
}

// --device on a GPU: two devices (the full offload run's budget holds the resident parameters and
// --device-units units; the compute-alone run's holds them all), one compute stream libtorch
// computes on for both engines. Empty where the host-emulated device runs (each engine owns one).
struct GpuDevices {
  std::unique_ptr<DeviceBackend> full, compute;
  std::unique_ptr<Stream> stream;
  std::optional<runtime::TorchStreamGuard> current;
  torch::Device torch_device = torch::kCPU;
  std::string description = "host (emulated; libtorch computes on the CPU)";
};

Status OpenGpuDevices(const std::string& spec, uint64_t full_budget, uint64_t compute_budget,
                      GpuDevices* out) {
  STRATA_ASSIGN_OR_RETURN(runtime::ComputeDevice full,
                          runtime::OpenComputeDevice(spec, full_budget));
  if (full.device == nullptr) return Status::Ok();  // the host-emulated device
  STRATA_ASSIGN_OR_RETURN(runtime::ComputeDevice compute,
                          runtime::OpenComputeDevice(full.spec, compute_budget));
  out->full = std::move(full.device);
  out->compute = std::move(compute.device);
  out->torch_device = full.torch_device;
  STRATA_ASSIGN_OR_RETURN(out->stream, out->full->CreateStream("bench-compute"));
  STRATA_ASSIGN_OR_RETURN(
      runtime::TorchStreamGuard guard,
      runtime::TorchStreamGuard::Install(out->torch_device, out->stream->native_handle()));
  out->current.emplace(std::move(guard));
  out->description = full.spec + " (" + out->full->info().name + ")";
  return Status::Ok();
}

// The forward of batch `i`. A unit's failed gather (e.g. an NVMe read error) throws out of
// libtorch; it comes back here as the Status the engine put in it.
Result<torch::Tensor> Loss(runtime::Engine& engine, runtime::Gpt& model, const Data& data, int i) {
  try {
    return model->Loss(data.x[i], data.y[i]);
  } catch (const std::exception& e) {
    return engine.ErrorFromException(e);
  }
}

Status RunBenchStep(const StepFlags& f, nlohmann::json* out) {
  if (f.layers < 1 || f.width < 8 || f.width % f.heads != 0 || f.seq < 2 || f.batch < 1 ||
      f.steps < 1 || f.device_units < 1) {
    return InvalidArgumentError(
        "need --layers >= 1, --width >= 8 divisible by --heads, --seq >= 2, --batch, --steps and "
        "--device-units >= 1");
  }
  STRATA_ASSIGN_OR_RETURN(uint64_t sub_group, ParseBytes(f.sub_group));
  const int threads =
      f.threads > 0 ? f.threads : static_cast<int>(std::thread::hardware_concurrency());
  torch::set_num_threads(threads);
  STRATA_ASSIGN_OR_RETURN(const ScratchDir scratch, ScratchDir::Create(f.path));
  const std::string& dir = scratch.path;

  runtime::GptOptions g;
  g.n_layers = f.layers;
  g.d_model = f.width;
  g.n_heads = f.heads;
  g.seq_len = f.seq;
  // Parameters per block and outside the blocks, counted by the GPT's one formula
  // (model_presets.h).
  runtime::GptShape shape;
  shape.n_layers = f.layers;
  shape.d_model = f.width;
  shape.n_heads = f.heads;
  shape.seq_len = f.seq;
  shape.vocab = g.vocab;
  const uint64_t unit = runtime::BlockParams(shape);
  const uint64_t resident = runtime::ResidentParams(shape);
  // Declared before the engines: they use the devices and the stream until they are gone.
  GpuDevices gpu;
  STRATA_RETURN_IF_ERROR(OpenGpuDevices(
      f.device, AlignUp(resident * 4, 4096) + f.device_units * AlignUp(unit * 4, 4096),
      AlignUp(resident * 4, 4096) + f.layers * AlignUp(unit * 4, 4096) + (uint64_t{64} << 20),
      &gpu));
  torch::manual_seed(0);
  Data data = MakeData(f, f.steps + 1, gpu.torch_device);

  runtime::EngineOptions base = BaseEngineOptions(f, threads, sub_group);
  base.torch_device = gpu.torch_device;
  base.compute_stream = gpu.stream.get();

  nlohmann::json& j = *out;
  j["device"] = gpu.description;
  j["model"] = {{"layers", f.layers}, {"width", f.width},
                {"heads", f.heads},   {"seq", f.seq},
                {"batch", f.batch},   {"parameters", f.layers * unit + resident}};

  // The configurations run side by side and take turns, one round per step (full offload step,
  // its I/O replayed alone, the compute alone, the CPU optimizer alone), so that a disk or a
  // machine whose speed drifts over minutes affects every part alike and the ratios hold.
  runtime::Gpt full_model(g);
  runtime::EngineOptions full_options = AllOnNvme(base, dir);
  full_options.device_budget =
      AlignUp(resident * 4, 4096) + f.device_units * AlignUp(unit * 4, 4096);
  full_options.device = gpu.full.get();
  // --host-memory: the host-RAM tier keeps what the budget leaves off NVMe.
  STRATA_RETURN_IF_ERROR(ApplyHostMemory(f, full_options));
  STRATA_ASSIGN_OR_RETURN(auto full, runtime::Engine::Create(full_model.ptr(), full_options));
  const uint64_t optimizer_elements = OptimizerElements(*full);
  const uint64_t largest_subgroup = LargestSubGroupElements(*full);

  // Compute alone: parameters resident in host memory (offload_param cpu: no NVMe at all; each
  // gather is a host-to-device copy, as the offloaded run's gathers from pinned copies are).
  torch::manual_seed(0);
  runtime::Gpt compute_model(g);
  runtime::EngineOptions compute_options = base;
  compute_options.params = strata::Home::kCpu;
  compute_options.optimizer = strata::Home::kCpu;
  compute_options.device = gpu.compute.get();
  STRATA_ASSIGN_OR_RETURN(auto compute,
                          runtime::Engine::Create(compute_model.ptr(), compute_options));

  // The CPU optimizer alone over the same elements, in RAM, in sub-groups of the same size.
  STRATA_ASSIGN_OR_RETURN(auto cpu_opt,
                          cpu_optimizer::CpuOptimizer::Create(base.optimizer_options));
  std::vector<float> p(optimizer_elements, 0.01f), m(optimizer_elements, 0.0f),
      v(optimizer_elements, 0.0f), grad(optimizer_elements, 1e-3f), copy(largest_subgroup);
  auto optimizer_alone = [&](int s) -> Status {
    for (uint64_t b = 0; b < optimizer_elements; b += largest_subgroup) {
      cpu_optimizer::FlatSpan span;
      span.numel = std::min<uint64_t>(largest_subgroup, optimizer_elements - b);
      span.params = p.data() + b;
      span.exp_avg = m.data() + b;
      span.exp_avg_sq = v.data() + b;
      span.grads = grad.data() + b;
      cpu_optimizer::StepArgs args;
      args.step = s + 1;
      STRATA_RETURN_IF_ERROR(cpu_opt.Step(span, args));
      std::memcpy(copy.data(), span.params, span.numel * 4);
    }
    return Status::Ok();
  };

  std::vector<double> fb, opt, step, fb_io_v, opt_io_v, fb_compute_v, opt_cpu_v;
  // Bytes over the timed rounds: the full run's phases and the replays'.
  uint64_t fb_read = 0, fb_written = 0, opt_read = 0, opt_written = 0;
  uint64_t replay_read_fb = 0, replay_written_fb = 0, replay_read_opt = 0, replay_written_opt = 0;
  uint64_t checksum_bytes = 0;
  double checksum_seconds = 0;
  uint64_t faults_minor = 0, faults_major = 0;  // the process's, over the full run's timed steps
  for (int s = 0; s <= f.steps; ++s) {
    const bool timed = s > 0;  // step 0 records the unit order
    const bool last = s == f.steps;
    // Full offload.
    if (last && !f.trace.empty()) {
      TraceRecorder::Global().Clear();
      TraceRecorder::Global().Enable(true);
    }
    const PageFaults faults_before = ProcessPageFaults();
    const TierTelemetry t0 = full->telemetry();
    Stopwatch w;
    {
      TraceSpan span("compute", "forward+backward");
      STRATA_ASSIGN_OR_RETURN(torch::Tensor loss, Loss(*full, full_model, data, s));
      STRATA_RETURN_IF_ERROR(full->Backward(loss));
    }
    const double t_fb = w.Seconds();
    const TierTelemetry t1 = full->telemetry();
    // The whole optimizer phase (training overlaps its units' updates with the next forward;
    // here the phases are timed apart).
    STRATA_RETURN_IF_ERROR(full->Step());
    STRATA_RETURN_IF_ERROR(full->FinishStep());
    const double t_opt = w.Seconds() - t_fb;
    const TierTelemetry t2 = full->telemetry();
    const PageFaults faults_after = ProcessPageFaults();
    if (last && !f.trace.empty()) {
      TraceRecorder::Global().Enable(false);
      STRATA_RETURN_IF_ERROR(TraceRecorder::Global().WriteJson(f.trace));
    }
    if (timed) {
      fb.push_back(t_fb);
      opt.push_back(t_opt);
      step.push_back(t_fb + t_opt);
      fb_read += t1.nvme_to_pinned - t0.nvme_to_pinned;
      fb_written += t1.pinned_to_nvme - t0.pinned_to_nvme;
      opt_read += t2.nvme_to_pinned - t1.nvme_to_pinned;
      opt_written += t2.pinned_to_nvme - t1.pinned_to_nvme;
      checksum_bytes += t2.checksum_bytes - t0.checksum_bytes;
      checksum_seconds += t2.checksum_seconds - t0.checksum_seconds;
      faults_minor += faults_after.minor - faults_before.minor;
      faults_major += faults_after.major - faults_before.major;

      // Its I/O alone.
      const TierTelemetry r0 = full->telemetry();
      Stopwatch wr;
      STRATA_RETURN_IF_ERROR(ReplayPassIo(*full));
      fb_io_v.push_back(wr.Seconds());
      const TierTelemetry r1 = full->telemetry();
      Stopwatch wo;
      STRATA_RETURN_IF_ERROR(ReplayOptimizerIo(*full));
      opt_io_v.push_back(wo.Seconds());
      const TierTelemetry r2 = full->telemetry();
      replay_read_fb += r1.nvme_to_pinned - r0.nvme_to_pinned;
      replay_written_fb += r1.pinned_to_nvme - r0.pinned_to_nvme;
      replay_read_opt += r2.nvme_to_pinned - r1.nvme_to_pinned;
      replay_written_opt += r2.pinned_to_nvme - r1.pinned_to_nvme;
    }
    // Compute alone.
    {
      Stopwatch wc;
      STRATA_ASSIGN_OR_RETURN(torch::Tensor loss, Loss(*compute, compute_model, data, s));
      STRATA_RETURN_IF_ERROR(compute->Backward(loss));
      if (timed) fb_compute_v.push_back(wc.Seconds());
      STRATA_RETURN_IF_ERROR(compute->Step());
      STRATA_RETURN_IF_ERROR(compute->FinishStep());
    }
    // The CPU optimizer alone.
    {
      Stopwatch wo;
      STRATA_RETURN_IF_ERROR(optimizer_alone(s));
      if (timed) opt_cpu_v.push_back(wo.Seconds());
    }
  }
  const double fb_seconds = Median(fb);
  const double opt_seconds = Median(opt);
  const double step_seconds = Median(step);
  const double fb_io = Median(fb_io_v);
  const double opt_io = Median(opt_io_v);
  const double fb_compute = Median(fb_compute_v);
  const double opt_cpu = Median(opt_cpu_v);

  const uint64_t steps_measured = static_cast<uint64_t>(f.steps);
  auto phase = [](double seconds, double a, double b, const char* a_name, const char* b_name) {
    nlohmann::json p;
    p["seconds"] = seconds;
    p[a_name] = a;
    p[b_name] = b;
    p["ratio_to_larger_part"] = seconds / std::max(1e-9, std::max(a, b));
    return p;
  };
  j["forward_backward"] =
      phase(fb_seconds, fb_compute, fb_io, "compute_alone_seconds", "io_alone_seconds");
  j["optimizer"] = phase(opt_seconds, opt_cpu, opt_io, "cpu_alone_seconds", "io_alone_seconds");
  j["step_seconds"] = step_seconds;  // median of forward+backward+optimizer, full offload
  j["swap_checksums"] = !f.no_swap_checksums;
  j["target_ratio"] = 1.15;
  j["steps_timed"] = f.steps;
  j["optimizer_elements"] = optimizer_elements;
  const uint64_t read = (fb_read + opt_read) / steps_measured;
  const uint64_t written = (fb_written + opt_written) / steps_measured;
  j["nvme_read_bytes_per_step"] = read;
  j["nvme_write_bytes_per_step"] = written;
  j["nvme_bytes_per_step"] = {{"forward_backward_read", fb_read / steps_measured},
                              {"forward_backward_written", fb_written / steps_measured},
                              {"optimizer_read", opt_read / steps_measured},
                              {"optimizer_written", opt_written / steps_measured}};
  // What this layout moves per step when no block stays in device or pinned memory between uses
  // (fp32, Adam; README "the disk is the floor"): every unit read in forward and again in
  // backward, 16 B per optimizer element read (master, two moments, gradient) and written (the
  // same, the gradient in backward's hand-off). The units' fp32 parameter blocks are their
  // masters (one copy), so the master's 4 B of a unit element are those blocks' bytes: nothing
  // else is written for the parameters. Blocks that device or pinned memory still hold when they
  // are used again are not read: the read can be less.
  const uint64_t unit_bytes = static_cast<uint64_t>(f.layers) * unit * 4;
  const uint64_t min_read = 2 * unit_bytes + 16 * optimizer_elements;
  const uint64_t min_written = 16 * optimizer_elements;
  j["layout_bytes_per_step"] = {{"read", min_read}, {"written", min_written}};
  // The plan's bytes for this run's split between the host-RAM tier and NVMe (step_traffic.h:
  // writes and dense models' reads as a run's from the second step), and what the tier holds.
  if (std::optional<runtime::PlanInput> in = full->plan_input()) {
    const runtime::HostCacheSplit split = runtime::SplitHostCache(*in);
    j["host_cache"] = {{"budget", full_options.host_cache_budget},
                       {"beside", full->options().host_beside.total()},
                       {"bytes", split.bytes()},
                       {"grads", split.grad_bytes},
                       {"state", split.state_bytes},
                       {"params", split.unit_bytes}};
    j["pinned_arena_bytes"] = full->pinned_arena_bytes();
    const runtime::StepTraffic plan = runtime::NvmeTrafficPerStep(*in, 1);
    j["plan_bytes_per_step"] = runtime::StepTrafficJson(plan);
    j["written_vs_plan"] = static_cast<double>(written) / std::max(1.0, plan.written());
  }
  j["read_vs_layout"] = static_cast<double>(read) / static_cast<double>(min_read);
  j["written_vs_layout"] = static_cast<double>(written) / static_cast<double>(min_written);
  // Swap checksums in the full-offload steps: bytes hashed and hashing time (summed over threads;
  // its share of the step is an upper bound on what the checksums add to it).
  j["checksum_bytes_per_step"] = checksum_bytes / steps_measured;
  j["checksum_seconds_per_step"] = checksum_seconds / static_cast<double>(f.steps);
  j["io_alone_nvme_bytes_per_step"] = {
      {"forward_backward_read", replay_read_fb / steps_measured},
      {"forward_backward_written", replay_written_fb / steps_measured},
      {"optimizer_read", replay_read_opt / steps_measured},
      {"optimizer_written", replay_written_opt / steps_measured}};
  j["minor_faults_per_step"] = faults_minor / steps_measured;
  j["major_faults_per_step"] = faults_major / steps_measured;
  j["trace"] = f.trace;
  j["threads"] = threads;
  return Status::Ok();
}

// ---- --model: whole layers against --page-experts
// ------------------------------------------------

// One layout of the model under full NVMe offload, and what was measured of it.
struct LayoutRun {
  bool paged = false;
  std::unique_ptr<runtime::CausalLm> lm;
  std::unique_ptr<runtime::Engine> engine;
  runtime::PlanInput plan;            // the estimate's (step_traffic.h)
  std::vector<runtime::UnitUse> use;  // uniform routing
  std::vector<bool> expert;           // per unit: a routed expert
  std::vector<double> updated;        // per unit: timed steps that updated it
  std::vector<double> seconds;        // per timed step
  uint64_t read = 0, written = 0;     // over the timed steps
};

Status RunBenchStepModel(const StepFlags& f, nlohmann::json* out) {
  if (f.device != "auto" && f.device != "host") {
    return InvalidArgumentError(
        "--device " + f.device +
        ": with --model, bench step runs on the host-emulated device (it measures NVMe bytes, "
        "not the GPU)");
  }
  if (f.steps < 1 || f.batch < 1 || f.seq < 1) {
    return InvalidArgumentError("need --seq, --batch and --steps >= 1");
  }
  STRATA_ASSIGN_OR_RETURN(uint64_t sub_group, ParseBytes(f.sub_group));
  STRATA_ASSIGN_OR_RETURN(runtime::ModelSpec probe,
                          runtime::ResolveModel(f.model, f.seq, runtime::Weights::kRequired));
  if (!probe.llama) {
    return InvalidArgumentError("--model " + f.model +
                                ": bench step --model takes a Llama-family model (a GPT: "
                                "--layers, --width, --heads)");
  }
  const runtime::LlamaShape shape = *probe.llama;
  const bool moe = shape.num_experts > 0;
  if (f.page_experts && !moe) {
    return InvalidArgumentError("--page-experts needs a mixture of experts (Mixtral, Qwen2-MoE); " +
                                probe.name + " has no experts");
  }
  const int threads =
      f.threads > 0 ? f.threads : static_cast<int>(std::thread::hardware_concurrency());
  torch::set_num_threads(threads);
  STRATA_ASSIGN_OR_RETURN(const ScratchDir scratch, ScratchDir::Create(f.path));
  const std::string& dir = scratch.path;

  const uint64_t tokens = static_cast<uint64_t>(f.batch) * static_cast<uint64_t>(f.seq);
  runtime::PlanSettings settings;
  settings.sub_group_size = sub_group;
  settings.persistence_threshold = 0;
  std::vector<LayoutRun> runs;
  for (const bool paged : moe && !f.page_experts ? std::vector<bool>{false, true}
                                                 : std::vector<bool>{f.page_experts}) {
    LayoutRun run;
    run.paged = paged;
    STRATA_ASSIGN_OR_RETURN(runtime::ModelSpec spec,
                            runtime::ResolveModel(f.model, f.seq, runtime::Weights::kRequired));
    spec.llama->page_experts = paged;
    {
      runtime::ModelSpec plan_spec;
      plan_spec.llama = spec.llama;
      plan_spec.seq_len = spec.seq_len;
      run.plan = runtime::PlanInputFor(plan_spec, settings, f.batch, /*compute_bytes=*/4,
                                       /*world=*/1);
    }
    run.plan.params = strata::Home::kNvme;
    run.plan.optimizer = strata::Home::kNvme;
    run.plan.io_align = runtime::kIoAlign;
    run.use = runtime::LlamaUnitUse(*spec.llama, 1, tokens, 1);
    for (int64_t l = 0; l < shape.num_hidden_layers; ++l) {
      for (const runtime::LlamaUnitTensors& u : runtime::LlamaLayerUnits(*spec.llama, l)) {
        run.expert.push_back(u.kind == runtime::LlamaUnitTensors::Kind::kExpert);
      }
    }
    STRATA_ASSIGN_OR_RETURN(run.lm, runtime::OpenModel(std::move(spec), /*seed=*/1234));
    const std::string swap = dir + (paged ? "/paged" : "/whole");
    std::error_code ec;
    std::filesystem::create_directories(swap, ec);
    if (ec) return IoErrorFromErrno(ec.value(), "creating " + swap);
    runtime::EngineOptions o = AllOnNvme(BaseEngineOptions(f, threads, sub_group), swap);
    o.param_buffer_count = f.buffer_count;
    // The resident parameters and --device-units of the largest unit: every unit is fetched
    // again each pass, as in the GPT run.
    o.device_budget = AlignUp(run.plan.layout.resident_numel * 4, 4096) +
                      static_cast<uint64_t>(std::max(2, f.device_units)) *
                          AlignUp(run.plan.layout.largest_unit() * 4, 4096);
    o.initialize_unit = run.lm->UnitInitializer();
    o.step_without_gradient = true;  // as `strata train` steps strata's models
    STRATA_RETURN_IF_ERROR(ApplyHostMemory(f, o));
    STRATA_ASSIGN_OR_RETURN(run.engine, runtime::Engine::Create(run.lm->module(), o));
    // The engine's plan: the estimate's layout with the host-RAM tier the budget left.
    if (std::optional<runtime::PlanInput> in = run.engine->plan_input()) {
      run.plan.host_cache_bytes = in->host_cache_bytes;
    }
    run.updated.assign(run.plan.layout.unit_numel.size(), 0);
    runs.push_back(std::move(run));
  }

  torch::manual_seed(0);
  std::vector<torch::Tensor> xs, ys;
  for (int s = 0; s <= f.steps; ++s) {
    auto seq = torch::randint(0, shape.vocab_size, {f.batch, f.seq + 1}, torch::kLong);
    xs.push_back(seq.narrow(1, 0, f.seq).contiguous());
    ys.push_back(seq.narrow(1, 1, f.seq).contiguous());
  }
  // Step 0 records the unit order; the layouts take turns, so a disk whose speed drifts affects
  // both alike.
  for (int s = 0; s <= f.steps; ++s) {
    for (LayoutRun& run : runs) {
      runtime::Engine& engine = *run.engine;
      const TierTelemetry t0 = engine.telemetry();
      Stopwatch w;
      torch::Tensor loss;
      try {
        loss = run.lm->Loss(xs[s], ys[s]);
      } catch (const std::exception& e) {
        return engine.ErrorFromException(e);
      }
      STRATA_RETURN_IF_ERROR(engine.Backward(loss));
      STRATA_RETURN_IF_ERROR(engine.Step());
      STRATA_RETURN_IF_ERROR(engine.FinishStep());
      const double seconds = w.Seconds();
      const TierTelemetry t1 = engine.telemetry();
      if (s == 0) continue;
      run.seconds.push_back(seconds);
      run.read += t1.nvme_to_pinned - t0.nvme_to_pinned;
      run.written += t1.pinned_to_nvme - t0.pinned_to_nvme;
      const std::vector<bool> updated = engine.UnitsWithGradientsInLastStep();
      for (size_t u = 0; u < updated.size() && u < run.updated.size(); ++u) {
        run.updated[u] += updated[u] ? 1 : 0;
      }
    }
  }

  nlohmann::json& j = *out;
  const double p_step = runtime::ExpertHitProbability(shape, static_cast<double>(tokens));
  j["device"] = "host (emulated; libtorch computes on the CPU)";
  j["model"] = {{"name", probe.name},
                {"architecture", shape.architecture},
                {"layers", shape.num_hidden_layers},
                {"hidden_size", shape.hidden_size},
                {"num_experts", shape.num_experts},
                {"num_experts_per_tok", shape.num_experts_per_tok},
                {"moe_intermediate_size", shape.moe_intermediate_size},
                {"parameters", runtime::LlamaTotalParams(shape)}};
  j["batch"] = f.batch;
  j["seq"] = f.seq;
  j["tokens_per_step"] = tokens;
  j["steps_timed"] = f.steps;
  j["swap_checksums"] = !f.no_swap_checksums;
  j["threads"] = threads;
  j["sub_group_size"] = sub_group;
  j["buffer_count"] = f.buffer_count;
  j["routing"] =
      "uniform: an expert gets at least one of T tokens with probability 1 - (1 - k/E)^T";
  j["expert_hit_probability"] = p_step;
  j["experts_per_layer_expected"] = p_step * static_cast<double>(shape.num_experts);
  const int64_t sparse_layers = runtime::SparseLayerCount(shape);
  const double steps = f.steps;
  j["layouts"] = nlohmann::json::array();
  for (const LayoutRun& run : runs) {
    nlohmann::json r;
    r["name"] = run.paged ? "--page-experts" : "whole layers";
    r["page_experts"] = run.paged;
    r["units"] = run.plan.layout.unit_numel.size();
    r["largest_unit_params"] = run.plan.layout.largest_unit();
    const std::optional<runtime::ModelLayout> engine_layout = run.engine->plan_layout();
    r["layout_matches_estimate"] =
        engine_layout && engine_layout->unit_numel == run.plan.layout.unit_numel &&
        engine_layout->resident_numel == run.plan.layout.resident_numel &&
        engine_layout->subgroups == run.plan.layout.subgroups;
    r["step_seconds"] = Median(run.seconds);
    const runtime::HostCacheSplit split = runtime::SplitHostCache(run.plan);
    r["host_cache"] = {{"bytes", split.bytes()},
                       {"grads", split.grad_bytes},
                       {"state", split.state_bytes},
                       {"params", split.unit_bytes}};
    const uint64_t read = run.read / static_cast<uint64_t>(f.steps);
    const uint64_t written = run.written / static_cast<uint64_t>(f.steps);
    r["nvme_read_bytes_per_step"] = read;
    r["nvme_write_bytes_per_step"] = written;
    // Experts some token reached (a routed expert paged on its own: it ran and has a gradient;
    // the optimizer steps every unit). Whole layers: every layer, the unit being the layer.
    double experts = 0;
    std::vector<runtime::UnitUse> measured(run.updated.size());
    for (size_t u = 0; u < run.updated.size(); ++u) {
      const double share = run.updated[u] / steps;
      measured[u] = {share, share, 1};
      if (run.expert[u]) experts += share;
    }
    if (run.paged && sparse_layers > 0) {
      r["experts_routed_per_layer"] = experts / static_cast<double>(sparse_layers);
    }
    const runtime::StepTraffic predicted = runtime::NvmeTrafficPerStep(run.plan, 1, run.use);
    const runtime::StepTraffic by_routing = runtime::NvmeTrafficPerStep(run.plan, 1, measured);
    r["predicted_uniform"] = runtime::StepTrafficJson(predicted);
    r["predicted_from_routed_units"] = runtime::StepTrafficJson(by_routing);
    r["read_vs_predicted"] = static_cast<double>(read) / std::max(1.0, by_routing.read());
    r["written_vs_predicted"] = static_cast<double>(written) / std::max(1.0, by_routing.written());
    j["layouts"].push_back(r);
  }
  return Status::Ok();
}

void PrintHumanModel(const nlohmann::json& j, std::FILE* out) {
  const auto& m = j["model"];
  std::fprintf(out,
               "strata bench step --model %s: %s, %d layers, hidden %d, %d experts of %d, top-%d, "
               "%.1fM parameters; batch %d x %d = %llu tokens per step; parameters and optimizer "
               "state on NVMe, %s, median of %d steps\n",
               m["name"].get<std::string>().c_str(), m["architecture"].get<std::string>().c_str(),
               m["layers"].get<int>(), m["hidden_size"].get<int>(), m["num_experts"].get<int>(),
               m["moe_intermediate_size"].get<int>(), m["num_experts_per_tok"].get<int>(),
               m["parameters"].get<double>() / 1e6, j["batch"].get<int>(), j["seq"].get<int>(),
               static_cast<unsigned long long>(j["tokens_per_step"].get<uint64_t>()),
               j["device"].get<std::string>().c_str(), j["steps_timed"].get<int>());
  if (m["num_experts"].get<int>() > 0) {
    std::fprintf(out,
                 "  uniform routing: an expert gets one of %llu tokens with probability %.1f%%: "
                 "%.2f of %d experts per layer expected\n",
                 static_cast<unsigned long long>(j["tokens_per_step"].get<uint64_t>()),
                 100 * j["expert_hit_probability"].get<double>(),
                 j["experts_per_layer_expected"].get<double>(), m["num_experts"].get<int>());
  }
  std::fprintf(out, "  %-15s %6s %9s %8s | %11s %11s | %11s %11s | %11s %11s\n", "", "units",
               "experts", "step", "NVMe read", "written", "est. read", "written", "by routed",
               "written");
  for (const auto& r : j["layouts"]) {
    char experts[32] = "-";
    if (r.contains("experts_routed_per_layer")) {
      std::snprintf(experts, sizeof(experts), "%.2f", r["experts_routed_per_layer"].get<double>());
    }
    std::fprintf(out, "  %-15s %6zu %9s %7.2fs | %11s %11s | %11s %11s | %11s %11s\n",
                 r["name"].get<std::string>().c_str(), r["units"].get<size_t>(), experts,
                 r["step_seconds"].get<double>(),
                 FormatBytes(r["nvme_read_bytes_per_step"].get<uint64_t>()).c_str(),
                 FormatBytes(r["nvme_write_bytes_per_step"].get<uint64_t>()).c_str(),
                 FormatBytes(r["predicted_uniform"]["read"].get<uint64_t>()).c_str(),
                 FormatBytes(r["predicted_uniform"]["written"].get<uint64_t>()).c_str(),
                 FormatBytes(r["predicted_from_routed_units"]["read"].get<uint64_t>()).c_str(),
                 FormatBytes(r["predicted_from_routed_units"]["written"].get<uint64_t>()).c_str());
    if (!r["layout_matches_estimate"].get<bool>()) {
      std::fprintf(out, "    (the engine's layout differs from the estimate's)\n");
    }
  }
  std::fprintf(
      out,
      "  (experts: routed to per sparse layer per step, paged; est.: `strata estimate`'s "
      "bytes per step for uniform routing; by routed: the same model for the units the "
      "run's tokens reached. Writes are as counted; the count reads every block at each use, so a "
      "block still pinned when used again makes reads fall below it, and experts read "
      "ahead by the router's history but not routed to make paged reads exceed it)\n");
}

void PrintHuman(const nlohmann::json& j, std::FILE* out) {
  if (j.contains("layouts")) {
    PrintHumanModel(j, out);
    return;
  }
  const auto& m = j["model"];
  std::fprintf(
      out,
      "strata bench step: GPT %d layers x %d wide, %.1fM parameters, batch %d x %d tokens, "
      "parameters and optimizer state on NVMe, swap checksums %s, median of %d steps\n",
      m["layers"].get<int>(), m["width"].get<int>(), m["parameters"].get<double>() / 1e6,
      m["batch"].get<int>(), m["seq"].get<int>(), j["swap_checksums"].get<bool>() ? "on" : "off",
      j["steps_timed"].get<int>());
  std::fprintf(out, "  step             %8.3f s\n", j["step_seconds"].get<double>());
  const auto& fb = j["forward_backward"];
  const auto& op = j["optimizer"];
  std::fprintf(out,
               "  forward+backward %8.3f s   compute alone %8.3f s   I/O alone %8.3f s   "
               "ratio to larger %.2f\n",
               fb["seconds"].get<double>(), fb["compute_alone_seconds"].get<double>(),
               fb["io_alone_seconds"].get<double>(), fb["ratio_to_larger_part"].get<double>());
  std::fprintf(out,
               "  optimizer        %8.3f s   CPU alone     %8.3f s   I/O alone %8.3f s   "
               "ratio to larger %.2f\n",
               op["seconds"].get<double>(), op["cpu_alone_seconds"].get<double>(),
               op["io_alone_seconds"].get<double>(), op["ratio_to_larger_part"].get<double>());
  const auto& mb = j["layout_bytes_per_step"];
  std::fprintf(out,
               "  NVMe per step: read %s (%.2fx the layout's %s), written %s (%.2fx the layout's "
               "%s)   (target ratio <= %.2f)\n",
               FormatBytes(j["nvme_read_bytes_per_step"].get<uint64_t>()).c_str(),
               j["read_vs_layout"].get<double>(), FormatBytes(mb["read"].get<uint64_t>()).c_str(),
               FormatBytes(j["nvme_write_bytes_per_step"].get<uint64_t>()).c_str(),
               j["written_vs_layout"].get<double>(),
               FormatBytes(mb["written"].get<uint64_t>()).c_str(), j["target_ratio"].get<double>());
  const auto& pb = j["nvme_bytes_per_step"];
  std::fprintf(out, "    forward+backward read %s written %s, optimizer read %s written %s\n",
               FormatBytes(pb["forward_backward_read"].get<uint64_t>()).c_str(),
               FormatBytes(pb["forward_backward_written"].get<uint64_t>()).c_str(),
               FormatBytes(pb["optimizer_read"].get<uint64_t>()).c_str(),
               FormatBytes(pb["optimizer_written"].get<uint64_t>()).c_str());
  if (j.contains("host_cache")) {
    const auto& h = j["host_cache"];
    const auto& plan = j["plan_bytes_per_step"];
    std::fprintf(out,
                 "  host-RAM tier %s (gradients %s, optimizer state %s, parameters %s); the plan "
                 "for this split: read at most %s, written %s (measured %.2fx)\n",
                 FormatBytes(h["bytes"].get<uint64_t>()).c_str(),
                 FormatBytes(h["grads"].get<uint64_t>()).c_str(),
                 FormatBytes(h["state"].get<uint64_t>()).c_str(),
                 FormatBytes(h["params"].get<uint64_t>()).c_str(),
                 FormatBytes(plan["read"].get<uint64_t>()).c_str(),
                 FormatBytes(plan["written"].get<uint64_t>()).c_str(),
                 j["written_vs_plan"].get<double>());
  }
  if (j["swap_checksums"].get<bool>()) {
    std::fprintf(out, "  swap checksums per step: %s hashed in %.3f s (%.1f%% of the step)\n",
                 FormatBytes(j["checksum_bytes_per_step"].get<uint64_t>()).c_str(),
                 j["checksum_seconds_per_step"].get<double>(),
                 100 * j["checksum_seconds_per_step"].get<double>() /
                     std::max(1e-9, j["step_seconds"].get<double>()));
  }
  const auto& r = j["io_alone_nvme_bytes_per_step"];
  std::fprintf(
      out,
      "  I/O alone per step: forward+backward read %s written %s, optimizer read %s written %s\n",
      FormatBytes(r["forward_backward_read"].get<uint64_t>()).c_str(),
      FormatBytes(r["forward_backward_written"].get<uint64_t>()).c_str(),
      FormatBytes(r["optimizer_read"].get<uint64_t>()).c_str(),
      FormatBytes(r["optimizer_written"].get<uint64_t>()).c_str());
  if (!j["trace"].get<std::string>().empty())
    std::fprintf(out, "  Chrome trace of the last step: %s\n",
                 j["trace"].get<std::string>().c_str());
}

class BenchStepCommand final : public Command {
 public:
  BenchStepCommand()
      : Command(
            "step",
            "Training steps under full NVMe offload, each phase next to its compute and its I/O "
            "run alone") {}
  void AddFlags(CLI::App& cmd) override {
    namespace flags = runtime::flags;
    StepFlags& f = flags_;
    cmd.add_option("--path", f.path, "Directory for the swap files (default /tmp)")
        ->check(flags::InputDirectory());
    cmd.add_option("--model", f.model,
                   "A Llama-family preset or Hugging Face directory (e.g. mixtral-mini) instead of "
                   "the GPT: NVMe bytes per step with whole layers and with --page-experts, "
                   "measured and as `strata estimate` predicts them");
    cmd.add_flag("--page-experts", f.page_experts,
                 "With --model, a mixture of experts: only the --page-experts layout (default: "
                 "whole layers and --page-experts side by side)");
    cmd.add_option("--buffer-count", f.buffer_count,
                   "With --model: offload_param.buffer_count, the pinned slots of NVMe parameters "
                   "(default 2, DeepSpeed's least: blocks kept pinned between uses are not read "
                   "again, so few slots measure the disk's bytes)")
        ->check(CLI::Range(2, 1024));
    cmd.add_option("--host-memory", f.host_memory,
                   "The offloaded run's host budget, as `strata train --host-memory` (a size or "
                   "auto; default 0: no host-RAM tier, every block on NVMe)")
        ->check(flags::ByteSizeOrAuto(0, flags::kMaxBytes));
    cmd.add_option("--layers", f.layers, "Transformer blocks (default 8)")
        ->check(CLI::Range(1, 1024));
    cmd.add_option("--width", f.width, "Model width (default 512)")->check(CLI::Range(1, 65536));
    cmd.add_option("--heads", f.heads, "Attention heads (default 8)")->check(CLI::Range(1, 1024));
    cmd.add_option("--seq", f.seq, "Tokens per sequence (default 128)")->check(flags::SeqLen());
    cmd.add_option("--batch", f.batch, "Sequences per step (default 2)")
        ->check(CLI::Range(1, 1 << 20));
    cmd.add_option("--steps", f.steps, "Timed steps after one recording step (default 3)")
        ->check(CLI::Range(1, 1 << 20));
    cmd.add_option("--device-units", f.device_units,
                   "Units the device budget holds besides the resident parameters (default 3)")
        ->check(CLI::Range(0, 1024));
    cmd.add_option("--sub-group", f.sub_group, "zero_optimization.sub_group_size (default 1e9)")
        ->check(flags::ByteSize(1, flags::kMaxBytes));
    runtime::AddResourceFlags(cmd, {.device = &f.device, .threads = &f.threads});
    cmd.add_option("--backend", f.backend, "I/O backend auto|uring|aio|posix (default auto)")
        ->check(CLI::IsMember({"auto", "uring", "aio", "posix"}));
    cmd.add_flag("--no-swap-checksums", f.no_swap_checksums,
                 "Do not checksum swap blocks nor verify them on reads (strata.swap_checksums "
                 "false)");
    cmd.add_option("--trace", f.trace,
                   "Chrome trace of the last step (default strata-step-trace.json; '' = none)")
        ->check(flags::OutputFile(/*allow_empty=*/true));
  }
  Status Run(runtime::CommandContext& /*ctx*/, nlohmann::json& j) override {
    if (!flags_.model.empty()) return RunBenchStepModel(flags_, &j);
    if (flags_.page_experts) return InvalidArgumentError("--page-experts goes with --model");
    return RunBenchStep(flags_, &j);
  }
  void PrintText(const nlohmann::json& j, std::FILE* out) const override { PrintHuman(j, out); }

 private:
  StepFlags flags_;
};

}  // namespace

std::unique_ptr<Command> NewBenchStepCommand() { return std::make_unique<BenchStepCommand>(); }

}  // namespace strata::bench
