// What this machine has, for `strata estimate` (does a plan fit?) and `strata report`.
//
// Every probe is cheap (no benchmark) and never fails the caller: what cannot be read is reported
// as unknown with the reason. GPU probing goes through gpu/ (CudaDevice) when this build has it;
// the CUDA driver and NCCL versions are read by loading libcuda.so.1 / libnccl.so.2 at run time,
// so no CUDA header is needed here and a missing library is a reason, not an error.
//
// Thread-safety: all functions may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace strata::runtime {

struct HostMemory {
  uint64_t total = 0;      // MemTotal
  uint64_t available = 0;  // MemAvailable
  // cgroup v2 (/sys/fs/cgroup/memory.max and memory.current of the root the process sees): the
  // limit and the group's usage; 0 when there is no limit ("max") or no cgroup v2 file.
  uint64_t cgroup_limit = 0;
  uint64_t cgroup_usage = 0;

  // What this process may take at most: MemTotal, or the cgroup's limit where lower.
  uint64_t limit() const;
  // What it may still take now: MemAvailable, or the cgroup's limit less its usage where lower.
  uint64_t usable() const;
};
// From /proc/meminfo and, where present, cgroup v2's memory.max and memory.current.
Result<HostMemory> ReadHostMemory();

struct DiskSpace {
  uint64_t free = 0;        // bytes an unprivileged user may still write (statvfs f_bavail)
  uint64_t total = 0;       // size of the filesystem
  uint64_t filesystem = 0;  // st_dev, to tell whether two paths share a filesystem
};
// statvfs/stat of `path`, or of its nearest existing parent if it does not exist yet.
Result<DiskSpace> ReadDiskSpace(const std::string& path);

struct CpuSummary {
  std::string model;              // /proc/cpuinfo "model name" ("unknown" if absent)
  unsigned hardware_threads = 0;  // std::thread::hardware_concurrency
  std::vector<int> affinity;      // CPUs this process may run on (sched_getaffinity)
};
CpuSummary ReadCpuSummary();

// "0-3,6,8-9".
std::string FormatCpuList(const std::vector<int>& cpus);

struct GpuDevice {
  int ordinal = 0;
  std::string name;
  uint64_t total_bytes = 0;
};
struct GpuSummary {
  bool gpu_target_built = false;   // STRATA_HAVE_CUDA
  std::string cuda_runtime;        // toolkit version gpu/ was built with, "" if not built
  int driver_version = 0;          // cuDriverGetVersion (e.g. 12040), 0 if unknown
  std::string driver_reason;       // why driver_version is 0
  std::vector<GpuDevice> devices;  // the devices that answered through gpu/
  std::string reason;              // why `devices` is empty
};
GpuSummary ProbeGpus();

struct NcclSummary {
  bool found = false;
  std::string version;  // "2.21.5"
  std::string reason;   // when not found
};
NcclSummary ProbeNccl();

// "2.4.0" when built with libtorch, else "".
std::string TorchVersion();
// The CUDA version libtorch was built with ("13.0"), "" for a CPU libtorch or none.
std::string TorchCudaVersion();
// The NCCL version libtorch runs (torch.cuda.nccl.version() at configure time), "" when unknown.
std::string TorchNcclVersion();

}  // namespace strata::runtime
