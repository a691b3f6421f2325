// `strata report`: what this machine and this build offer strata, for bug reports and for
// choosing a config: CPU model, the optimizer ISA in use, threads and affinity, memory, the I/O
// backends that work on a directory (each opened and probed there, with direct-I/O support), the
// CUDA driver and devices, NCCL and libtorch versions. Nothing here fails the command: what cannot
// be probed is printed with its reason.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/env.h"
#include "cpu_optimizer/isa.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/commands/command.h"
#include "runtime/commands/commands.h"
#include "runtime/commands/flag_checks.h"
#include "runtime/plan/machine_info.h"
#include "strata/config.h"
#include "swap/direct_io.h"
#include "swap/io_backend.h"

namespace strata::runtime {
namespace {

using nlohmann::json;

std::string DriverVersionString(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string MemlockLimit() {
  struct rlimit rl {};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return "unknown";
  if (rl.rlim_cur == RLIM_INFINITY) return "unlimited";
  return FormatBytes(rl.rlim_cur);
}

std::string Str(const json& j) { return j.get<std::string>(); }

class ReportCommand final : public Command {
 public:
  ReportCommand()
      : Command(
            "report",
            "What this machine and build offer: CPU ISA, threads, memory, I/O backends on a path, "
            "CUDA, NCCL, libtorch") {}
  void AddFlags(CLI::App& cmd) override {
    cmd.add_option("--path", path_, "Directory to probe I/O backends on (default /tmp)")
        ->check(flags::InputDirectory());
  }
  Status Run(CommandContext& ctx, json& j) override;
  void PrintText(const json& j, std::FILE* out) const override;

 private:
  std::string path_ = "/tmp";
};

Status ReportCommand::Run(CommandContext& /*ctx*/, json& j) {
  const CpuSummary cpu = ReadCpuSummary();
  Result<cpu_optimizer::Isa> isa = cpu_optimizer::ResolveIsa();
  j["version"] = STRATA_VERSION;
  j["cpu"] = {
      {"model", cpu.model},
      {"hardware_threads", cpu.hardware_threads},
      {"affinity", cpu.affinity},
      {"affinity_count", cpu.affinity.size()},
      {"isa", isa.ok() ? std::string(cpu_optimizer::IsaName(*isa)) : isa.status().ToString()},
      {"best_isa", std::string(cpu_optimizer::IsaName(cpu_optimizer::BestIsa()))}};
  Result<HostMemory> mem = ReadHostMemory();
  if (mem.ok()) {
    j["memory"] = {
        {"total", mem->total}, {"available", mem->available}, {"memlock", MemlockLimit()}};
  } else {
    j["memory"] = {{"error", mem.status().ToString()}, {"memlock", MemlockLimit()}};
  }

  Result<DirectIoSupport> direct = ProbeDirectIo(path_);
  json backends = json::array();
  for (const std::string& name : CompiledIoBackends()) {
    IoOptions options;
    if (direct.ok()) {
      options.use_direct = direct->direct;
      options.alignment = direct->alignment;
    }
    json b = {{"name", name}};
    Result<std::unique_ptr<IoBackend>> backend = OpenIoBackend(name, options, path_);
    b["available"] = backend.ok();
    if (backend.ok()) {
      const IoCapabilities caps = (*backend)->capabilities();
      b["direct_io"] = caps.direct_io;
      b["fixed_buffers"] = caps.fixed_buffers;
      b["fixed_files"] = caps.fixed_files;
      b["max_queue_depth"] = caps.max_queue_depth;
    } else {
      b["error"] = backend.status().ToString();
    }
    backends.push_back(b);
  }
  Result<std::unique_ptr<IoBackend>> chosen = OpenIoBackend("auto", IoOptions{}, path_);
  json io = {{"path", path_},
             {"auto", chosen.ok() ? std::string((*chosen)->name()) : chosen.status().ToString()}};
  if (direct.ok()) {
    io["direct_io"] = direct->direct;
    io["logical_block_size"] = direct->logical_block_size;
    io["alignment"] = direct->alignment;
    if (!direct->direct) io["direct_io_reason"] = direct->reason;
  } else {
    io["direct_io"] = false;
    io["direct_io_reason"] = direct.status().ToString();
  }
  io["backends"] = backends;
  j["io"] = io;

  const GpuSummary gpu = ProbeGpus();
  json cuda = {{"gpu_target_built", gpu.gpu_target_built},
               {"runtime", gpu.cuda_runtime.empty() ? json(nullptr) : json(gpu.cuda_runtime)},
               {"driver", gpu.driver_version ? json(DriverVersionString(gpu.driver_version))
                                             : json(nullptr)}};
  if (!gpu.driver_version) cuda["driver_reason"] = gpu.driver_reason;
  cuda["devices"] = json::array();
  for (const GpuDevice& d : gpu.devices) {
    cuda["devices"].push_back(
        {{"ordinal", d.ordinal}, {"name", d.name}, {"total_bytes", d.total_bytes}});
  }
  if (gpu.devices.empty()) cuda["reason"] = gpu.reason;
  j["cuda"] = cuda;
  const NcclSummary nccl = ProbeNccl();
  j["nccl"] = nccl.found ? json{{"found", true}, {"version", nccl.version}}
                         : json{{"found", false}, {"reason", nccl.reason}};
  // Whether this build can put ranks on GPUs (the NCCL communicator, runtime/comm).
  j["nccl"]["communicator"] = NcclBuilt();
  const std::string torch = TorchVersion();
  j["torch"] = torch.empty() ? json{{"built", false}} : json{{"built", true}, {"version", torch}};
  if (!torch.empty()) {
    const std::string cuda = TorchCudaVersion(), nccl = TorchNcclVersion();
    j["torch"]["cuda"] = cuda.empty() ? json(nullptr) : json(cuda);
    j["torch"]["nccl"] = nccl.empty() ? json(nullptr) : json(nccl);
  }
  // Every environment variable strata reads (base/env.h), with the value this process sees.
  json env = json::array();
  for (const EnvVar& v : EnvVars()) {
    const char* value = GetEnv(v.name);
    env.push_back({{"name", v.name},
                   {"value", value != nullptr ? json(value) : json(nullptr)},
                   {"default", v.default_value},
                   {"meaning", v.meaning},
                   {"read_by", v.reader},
                   {"test_only", v.test_only}});
  }
  j["environment"] = env;
  return Status::Ok();
}

void ReportCommand::PrintText(const json& j, std::FILE* out) const {
  const json& cpu = j["cpu"];
  std::fprintf(out, "strata %s\n", Str(j["version"]).c_str());
  std::fprintf(out, "CPU:      %s\n", Str(cpu["model"]).c_str());
  std::fprintf(out, "          optimizer ISA in use: %s (best on this CPU: %s)\n",
               Str(cpu["isa"]).c_str(), Str(cpu["best_isa"]).c_str());
  std::fprintf(out, "          %u hardware threads; this process may run on %zu: %s\n",
               cpu["hardware_threads"].get<unsigned>(), cpu["affinity_count"].get<size_t>(),
               FormatCpuList(cpu["affinity"].get<std::vector<int>>()).c_str());
  const json& mem = j["memory"];
  if (!mem.contains("error")) {
    std::fprintf(out, "Memory:   %s total, %s available; memlock limit %s\n",
                 FormatBytes(mem["total"].get<uint64_t>()).c_str(),
                 FormatBytes(mem["available"].get<uint64_t>()).c_str(),
                 Str(mem["memlock"]).c_str());
  } else {
    std::fprintf(out, "Memory:   %s\n", Str(mem["error"]).c_str());
  }
  const json& io = j["io"];
  std::fprintf(out, "I/O on %s:\n", Str(io["path"]).c_str());
  if (io.contains("logical_block_size")) {  // the probe ran
    const bool direct = io["direct_io"].get<bool>();
    std::fprintf(out, "          O_DIRECT %s (logical block %u B, alignment %u B)%s%s\n",
                 direct ? "supported" : "not supported", io["logical_block_size"].get<unsigned>(),
                 io["alignment"].get<unsigned>(), direct ? "" : ": ",
                 direct ? "" : Str(io["direct_io_reason"]).c_str());
  } else {
    std::fprintf(out, "          direct I/O probe failed: %s\n",
                 Str(io["direct_io_reason"]).c_str());
  }
  for (const json& b : io["backends"]) {
    if (b["available"].get<bool>()) {
      std::fprintf(
          out, "          %-6s available (direct I/O %s, fixed buffers %s, max queue depth %u)\n",
          Str(b["name"]).c_str(), b["direct_io"].get<bool>() ? "yes" : "no",
          b["fixed_buffers"].get<bool>() ? "yes" : "no", b["max_queue_depth"].get<unsigned>());
    } else {
      std::fprintf(out, "          %-6s unavailable: %s\n", Str(b["name"]).c_str(),
                   Str(b["error"]).c_str());
    }
  }
  std::fprintf(out, "          auto chooses: %s\n", Str(io["auto"]).c_str());
  const json& cuda = j["cuda"];
  const std::string runtime =
      !cuda["gpu_target_built"].get<bool>()
          ? "gpu/ not built"
          : (cuda["runtime"].is_null() ? "built (version unknown)" : Str(cuda["runtime"]));
  std::fprintf(out, "CUDA:     driver: %s; runtime: %s\n",
               Str(cuda["driver"].is_null() ? cuda["driver_reason"] : cuda["driver"]).c_str(),
               runtime.c_str());
  for (const json& d : cuda["devices"]) {
    std::fprintf(out, "          GPU %d: %s, %s\n", d["ordinal"].get<int>(), Str(d["name"]).c_str(),
                 FormatBytes(d["total_bytes"].get<uint64_t>()).c_str());
  }
  if (cuda["devices"].empty()) {
    std::fprintf(out, "          no GPU: %s; the device is emulated in host memory\n",
                 Str(cuda["reason"]).c_str());
  }
  const json& nccl = j["nccl"];
  std::fprintf(out, "NCCL:     %s; %s\n",
               Str(nccl["found"].get<bool>() ? nccl["version"] : nccl["reason"]).c_str(),
               nccl["communicator"].get<bool>()
                   ? "ranks on GPUs communicate over it (c10d's ProcessGroupNCCL)"
                   : "ranks on GPUs unavailable: this build has no NCCL communicator (its "
                     "libtorch has no CUDA)");
  std::string torch_text = "not built with libtorch";
  if (j["torch"]["built"].get<bool>()) {
    const json& t = j["torch"];
    torch_text = Str(t["version"]) + " (" +
                 (t["cuda"].is_null() ? std::string("CPU only") : "CUDA " + Str(t["cuda"])) +
                 (t["nccl"].is_null() ? std::string() : ", NCCL " + Str(t["nccl"])) + ")";
  }
  std::fprintf(out, "libtorch: %s\n", torch_text.c_str());
  std::fprintf(out, "Environment variables (set ones marked *; test hooks last):\n");
  for (const bool test_only : {false, true}) {
    for (const json& v : j["environment"]) {
      if (v["test_only"].get<bool>() != test_only) continue;
      const bool set = !v["value"].is_null();
      std::fprintf(out, "  %c %-26s %s\n", set ? '*' : ' ', Str(v["name"]).c_str(),
                   Str(v["meaning"]).c_str());
      std::fprintf(out, "    %-26s %s: %s\n", "", set ? "value" : "unset",
                   Str(set ? v["value"] : v["default"]).c_str());
    }
  }
}

}  // namespace

std::unique_ptr<Command> NewReportCommand() { return std::make_unique<ReportCommand>(); }

}  // namespace strata::runtime
