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
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
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
#include "runtime/engine/io_replay.h"
#include "runtime/engine/torch_stream.h"
#include "runtime/models/gpt.h"
#include "runtime/plan/model_presets.h"

namespace strata::bench {
namespace {

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
};

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
  const std::string dir = f.path + "/strata-bench-step-" + std::to_string(getpid());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoErrorFromErrno(ec.value(), "creating " + dir);
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code e;
      std::filesystem::remove_all(dir, e);
    }
  } cleanup{dir};

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

  runtime::EngineOptions base;
  base.optimizer_options.threads = threads;
  base.persistence_threshold = 0;
  base.pin_memory = false;
  base.sub_group_size = sub_group;
  base.io_backend = f.backend;
  base.swap_checksums = !f.no_swap_checksums;
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
  runtime::EngineOptions full_options = base;
  full_options.params = strata::Home::kNvme;
  full_options.optimizer = strata::Home::kNvme;
  full_options.param_nvme_path = dir;
  full_options.optimizer_nvme_path = dir;
  full_options.device_budget =
      AlignUp(resident * 4, 4096) + f.device_units * AlignUp(unit * 4, 4096);
  full_options.device = gpu.full.get();
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

void PrintHuman(const nlohmann::json& j, std::FILE* out) {
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
    return RunBenchStep(flags_, &j);
  }
  void PrintText(const nlohmann::json& j, std::FILE* out) const override { PrintHuman(j, out); }

 private:
  StepFlags flags_;
};

}  // namespace

std::unique_ptr<Command> NewBenchStepCommand() { return std::make_unique<BenchStepCommand>(); }

}  // namespace strata::bench
