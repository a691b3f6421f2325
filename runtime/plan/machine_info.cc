// Machine probes: /proc files, statvfs, sched_getaffinity, and run-time loading of the CUDA driver
// and NCCL (dlopen), so versions can be reported without linking either.
#include "runtime/plan/machine_info.h"

#include <dlfcn.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "strata/config.h"

#if STRATA_HAVE_CUDA
#include "gpu/cuda_device.h"
#endif

namespace strata::runtime {
namespace {

// A library opened with dlopen, closed on destruction.
class Library {
 public:
  explicit Library(const char* name) : handle_(dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
    if (handle_ == nullptr) {
      const char* err = dlerror();
      error_ = err ? err : std::string(name) + ": not found";
    }
  }
  ~Library() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  bool ok() const { return handle_ != nullptr; }
  const std::string& error() const { return error_; }
  template <typename Fn>
  Fn Symbol(const char* name) const {
    return reinterpret_cast<Fn>(dlsym(handle_, name));
  }

 private:
  void* handle_;
  std::string error_;
};

}  // namespace

Result<HostMemory> ReadHostMemory() {
  std::ifstream in("/proc/meminfo");
  if (!in) return IoErrorFromErrno(errno, "open /proc/meminfo");
  HostMemory mem;
  bool have_total = false, have_available = false;
  std::string key;
  uint64_t value = 0;
  std::string unit;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    if (!(fields >> key >> value)) continue;
    fields >> unit;
    const uint64_t bytes = unit == "kB" ? value * 1024 : value;
    if (key == "MemTotal:") {
      mem.total = bytes;
      have_total = true;
    } else if (key == "MemAvailable:") {
      mem.available = bytes;
      have_available = true;
    }
  }
  if (!have_total || !have_available) {
    return NotFoundError("/proc/meminfo has no MemTotal or MemAvailable line");
  }
  // cgroup v2: "max" (no limit) or a byte count; a missing file (cgroup v1, no cgroup
  // namespace) leaves the limit unknown, i.e. the machine's.
  std::ifstream max_file("/sys/fs/cgroup/memory.max");
  std::string limit;
  if (max_file >> limit && limit != "max") {
    uint64_t bytes = 0;
    std::istringstream(limit) >> bytes;
    mem.cgroup_limit = bytes;
    std::ifstream current("/sys/fs/cgroup/memory.current");
    current >> mem.cgroup_usage;
  }
  return mem;
}

uint64_t HostMemory::limit() const {
  return cgroup_limit != 0 ? std::min(total, cgroup_limit) : total;
}

uint64_t HostMemory::usable() const {
  if (cgroup_limit == 0) return available;
  return std::min(available, cgroup_limit > cgroup_usage ? cgroup_limit - cgroup_usage : 0);
}

Result<DiskSpace> ReadDiskSpace(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path.empty() ? "." : path, ec);
  if (ec) return InvalidArgumentError("bad path '" + path + "': " + ec.message());
  while (!std::filesystem::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) {
    p = p.parent_path();
  }
  struct statvfs vfs {};
  if (statvfs(p.c_str(), &vfs) != 0) return IoErrorFromErrno(errno, "statvfs " + p.string());
  struct stat st {};
  if (stat(p.c_str(), &st) != 0) return IoErrorFromErrno(errno, "stat " + p.string());
  DiskSpace out;
  out.free = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  out.total = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  out.filesystem = static_cast<uint64_t>(st.st_dev);
  return out;
}

CpuSummary ReadCpuSummary() {
  CpuSummary cpu;
  cpu.model = "unknown";
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        cpu.model = line.substr(line.find_first_not_of(" \t", colon + 1));
      }
      break;
    }
  }
  cpu.hardware_threads = std::thread::hardware_concurrency();
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int i = 0; i < CPU_SETSIZE; ++i) {
      if (CPU_ISSET(i, &set)) cpu.affinity.push_back(i);
    }
  }
  return cpu;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

GpuSummary ProbeGpus() {
  GpuSummary gpu;
  {
    Library cuda("libcuda.so.1");
    if (!cuda.ok()) {
      gpu.driver_reason = "not found (" + cuda.error() + ")";
    } else {
      using GetVersion = int (*)(int*);
      auto get_version = cuda.Symbol<GetVersion>("cuDriverGetVersion");
      int version = 0;
      const int rc = get_version ? get_version(&version) : -1;
      if (rc == 0 && version > 0) {
        gpu.driver_version = version;
      } else {
        gpu.driver_reason = "cuDriverGetVersion failed (" + std::to_string(rc) + ")";
      }
    }
  }
#if STRATA_HAVE_CUDA
  gpu.gpu_target_built = true;
#ifdef STRATA_CUDA_TOOLKIT_VERSION
  gpu.cuda_runtime = STRATA_CUDA_TOOLKIT_VERSION;
#endif
  for (int ordinal = 0; ordinal < 64; ++ordinal) {
    CudaDeviceOptions options;
    options.ordinal = ordinal;
    Result<std::unique_ptr<CudaDevice>> device = CudaDevice::Open(options);
    if (!device.ok()) {
      if (ordinal == 0) gpu.reason = device.status().ToString();
      break;
    }
    const DeviceInfo info = (*device)->info();
    gpu.devices.push_back({ordinal, info.name, info.total_bytes});
  }
#else
  gpu.reason = "gpu/ not built (configured with STRATA_WITH_CUDA=OFF or no CUDA toolkit found)";
#endif
  return gpu;
}

NcclSummary ProbeNccl() {
  NcclSummary nccl;
  Library lib("libnccl.so.2");
  if (!lib.ok()) {
    nccl.reason = "not found (" + lib.error() + ")";
    return nccl;
  }
  using GetVersion = int (*)(int*);
  auto get_version = lib.Symbol<GetVersion>("ncclGetVersion");
  int code = 0;
  if (get_version == nullptr || get_version(&code) != 0 || code <= 0) {
    nccl.reason = "libnccl.so.2 loaded but ncclGetVersion failed";
    return nccl;
  }
  // NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9 (major*1000 + minor*100 before).
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? (code % 10000) / 100 : (code % 1000) / 100;
  const int patch = code % 100;
  nccl.found = true;
  nccl.version = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  return nccl;
}

std::string TorchVersion() {
#if STRATA_HAVE_TORCH
  return STRATA_TORCH_VERSION;
#else
  return "";
#endif
}

std::string TorchCudaVersion() {
#if STRATA_HAVE_TORCH
  return STRATA_TORCH_CUDA_VERSION;
#else
  return "";
#endif
}

std::string TorchNcclVersion() {
#if STRATA_HAVE_TORCH
  return STRATA_TORCH_NCCL_VERSION_TEXT;
#else
  return "";
#endif
}

}  // namespace strata::runtime
