// `strata report`: what this machine and this build offer strata, for bug reports and for
// choosing a config: CPU model, the optimizer ISA in use, threads and affinity, memory, the I/O
// backends that work on a directory (each opened and probed there, with direct-I/O support), the
// CUDA driver and devices, NCCL and libtorch versions. Nothing here fails the command: what cannot
// be probed is printed with its reason.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "cpu_optimizer/isa.h"
#include "runtime/commands/commands.h"
#include "runtime/plan/machine_info.h"
#include "strata/config.h"
#include "swap/direct_io.h"
#include "swap/io_backend.h"

namespace strata::runtime {
namespace {

using nlohmann::json;

struct BackendProbe {
  std::string name;
  bool ok = false;
  IoCapabilities caps;
  std::string error;
};

std::string DriverVersionString(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string MemlockLimit() {
  struct rlimit rl {};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return "unknown";
  if (rl.rlim_cur == RLIM_INFINITY) return "unlimited";
  return FormatBytes(rl.rlim_cur);
}

}  // namespace

void AddReportCommand(CLI::App& app, int* exit_code) {
  struct Flags {
    std::string path = "/tmp";
    bool json = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "report",
      "What this machine and build offer: CPU ISA, threads, memory, I/O backends on a "
      "path, CUDA, NCCL, libtorch");
  cmd->add_option("--path", flags->path, "Directory to probe I/O backends on (default /tmp)");
  cmd->add_flag("--json", flags->json, "Print one JSON object instead of text");

  cmd->callback([flags, exit_code] {
    const CpuSummary cpu = ReadCpuSummary();
    Result<cpu_optimizer::Isa> isa = cpu_optimizer::ResolveIsa();
    const std::string isa_name =
        isa.ok() ? std::string(cpu_optimizer::IsaName(*isa)) : isa.status().ToString();
    const std::string best_isa(cpu_optimizer::IsaName(cpu_optimizer::BestIsa()));
    Result<HostMemory> mem = ReadHostMemory();
    const std::string memlock = MemlockLimit();

    Result<DirectIoSupport> direct = ProbeDirectIo(flags->path);
    std::vector<BackendProbe> backends;
    for (const std::string& name : CompiledIoBackends()) {
      BackendProbe probe{name};
      IoOptions options;
      if (direct.ok()) {
        options.use_direct = direct->direct;
        options.alignment = direct->alignment;
      }
      Result<std::unique_ptr<IoBackend>> backend = OpenIoBackend(name, options, flags->path);
      if (backend.ok()) {
        probe.ok = true;
        probe.caps = (*backend)->capabilities();
      } else {
        probe.error = backend.status().ToString();
      }
      backends.push_back(probe);
    }
    std::string auto_choice;
    {
      Result<std::unique_ptr<IoBackend>> chosen = OpenIoBackend("auto", IoOptions{}, flags->path);
      auto_choice = chosen.ok() ? std::string((*chosen)->name()) : chosen.status().ToString();
    }
    const GpuSummary gpu = ProbeGpus();
    const NcclSummary nccl = ProbeNccl();
    const std::string torch = TorchVersion();

    if (flags->json) {
      json j;
      j["version"] = STRATA_VERSION;
      j["cpu"] = {{"model", cpu.model},       {"hardware_threads", cpu.hardware_threads},
                  {"affinity", cpu.affinity}, {"affinity_count", cpu.affinity.size()},
                  {"isa", isa_name},          {"best_isa", best_isa}};
      if (mem.ok()) {
        j["memory"] = {{"total", mem->total}, {"available", mem->available}, {"memlock", memlock}};
      } else {
        j["memory"] = {{"error", mem.status().ToString()}, {"memlock", memlock}};
      }
      json io = {{"path", flags->path}, {"auto", auto_choice}};
      if (direct.ok()) {
        io["direct_io"] = direct->direct;
        io["logical_block_size"] = direct->logical_block_size;
        io["alignment"] = direct->alignment;
        if (!direct->direct) io["direct_io_reason"] = direct->reason;
      } else {
        io["direct_io"] = false;
        io["direct_io_reason"] = direct.status().ToString();
      }
      io["backends"] = json::array();
      for (const BackendProbe& b : backends) {
        json bj = {{"name", b.name}, {"available", b.ok}};
        if (b.ok) {
          bj["direct_io"] = b.caps.direct_io;
          bj["fixed_buffers"] = b.caps.fixed_buffers;
          bj["fixed_files"] = b.caps.fixed_files;
          bj["max_queue_depth"] = b.caps.max_queue_depth;
        } else {
          bj["error"] = b.error;
        }
        io["backends"].push_back(bj);
      }
      j["io"] = io;
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
      j["nccl"] = nccl.found ? json{{"found", true}, {"version", nccl.version}}
                             : json{{"found", false}, {"reason", nccl.reason}};
      j["torch"] =
          torch.empty() ? json{{"built", false}} : json{{"built", true}, {"version", torch}};
      std::cout << j.dump(2) << std::endl;
      *exit_code = 0;
      return;
    }

    std::printf("strata %s\n", STRATA_VERSION);
    std::printf("CPU:      %s\n", cpu.model.c_str());
    std::printf("          optimizer ISA in use: %s (best on this CPU: %s)\n", isa_name.c_str(),
                best_isa.c_str());
    std::printf("          %u hardware threads; this process may run on %zu: %s\n",
                cpu.hardware_threads, cpu.affinity.size(), FormatCpuList(cpu.affinity).c_str());
    if (mem.ok()) {
      std::printf("Memory:   %s total, %s available; memlock limit %s\n",
                  FormatBytes(mem->total).c_str(), FormatBytes(mem->available).c_str(),
                  memlock.c_str());
    } else {
      std::printf("Memory:   %s\n", mem.status().ToString().c_str());
    }
    std::printf("I/O on %s:\n", flags->path.c_str());
    if (direct.ok()) {
      std::printf("          O_DIRECT %s (logical block %u B, alignment %u B)%s%s\n",
                  direct->direct ? "supported" : "not supported", direct->logical_block_size,
                  direct->alignment, direct->direct ? "" : ": ", direct->reason.c_str());
    } else {
      std::printf("          direct I/O probe failed: %s\n", direct.status().ToString().c_str());
    }
    for (const BackendProbe& b : backends) {
      if (b.ok) {
        std::printf(
            "          %-6s available (direct I/O %s, fixed buffers %s, max queue depth %u)\n",
            b.name.c_str(), b.caps.direct_io ? "yes" : "no", b.caps.fixed_buffers ? "yes" : "no",
            b.caps.max_queue_depth);
      } else {
        std::printf("          %-6s unavailable: %s\n", b.name.c_str(), b.error.c_str());
      }
    }
    std::printf("          auto chooses: %s\n", auto_choice.c_str());
    std::printf("CUDA:     driver: %s; runtime: %s\n",
                gpu.driver_version ? DriverVersionString(gpu.driver_version).c_str()
                                   : gpu.driver_reason.c_str(),
                gpu.gpu_target_built ? (gpu.cuda_runtime.empty() ? "built (version unknown)"
                                                                 : gpu.cuda_runtime.c_str())
                                     : "gpu/ not built");
    for (const GpuDevice& d : gpu.devices) {
      std::printf("          GPU %d: %s, %s\n", d.ordinal, d.name.c_str(),
                  FormatBytes(d.total_bytes).c_str());
    }
    if (gpu.devices.empty()) {
      std::printf("          no GPU: %s; the device is emulated in host memory\n",
                  gpu.reason.c_str());
    }
    std::printf("NCCL:     %s\n", nccl.found ? nccl.version.c_str() : nccl.reason.c_str());
    std::printf("libtorch: %s\n", torch.empty() ? "not built with libtorch" : torch.c_str());
    *exit_code = 0;
  });
}

}  // namespace strata::runtime
