// The device registry: opens a DeviceBackend (tiers/device.h) from a spec string, so that the
// engine, the benchmarks and the conformance tests name devices the same way and none of them
// needs CUDA headers or an #if to pick one (ARCHITECTURE.md §2, §4).
//
// Specs:
//   "host", "host:N"  HostDevice, the GPU emulated in host memory (always registered, by tiers/).
//                     Every open is an independent emulation; N only names it, so code that
//                     opens "<kind>:<local rank>" also runs on CPU-only machines.
//   "cuda", "cuda:N"  CudaDevice on GPU N (default 0). Registered by gpu/ where CUDA was found.
//   "auto" (or "")    "cuda:0" if it opens, else "host". Logs which one and why. Only "no usable
//                     GPU" (kUnavailable) falls back: any other CUDA failure (a budget larger than
//                     the free memory, a driver error) is returned, because a GPU machine that
//                     silently trains on the emulation looks like a hang, not like an error.
//
// Errors, each starting with "device <spec>: ":
//   * an unknown kind is kInvalidArgument and lists the registered kinds;
//   * "cuda" in a build without CUDA is kUnavailable: "strata was not built with CUDA support
//     (configure with STRATA_WITH_CUDA=ON)";
//   * a factory's own error comes through with its code and message (CudaDevice on a machine
//     without a GPU: kUnavailable naming the CUDA error, 35 or 100).
//
// Registration (Note [Device registration]). A factory is registered under a kind once per
// process, before the first OpenDevice that needs it. gpu/cuda_device_kind.cc registers "cuda"
// from a static initializer. A linker copies an object out of a static library only when
// something refers to a symbol in it, and nothing refers to a self-registering object, so it
// would be dropped silently. Hence that object is alone in the library strata_gpu_device_kind,
// which the CMake target strata_devices links with $<LINK_LIBRARY:WHOLE_ARCHIVE,...>: a program
// that links strata_devices has every kind this build has. A program that links only strata_tiers
// sees "host" alone; asking it for "cuda" in a CUDA build is a kInternal error that says to link
// strata_devices, never a misleading "not built with CUDA". The registry itself is a
// function-local static, so registering from a static initializer is safe in any order.
//
// Ownership: OpenDevice returns a device the caller owns; it must outlive every stream, memory
// block and PinnedArena registered with it (tiers/device.h). The registry keeps only factories.
//
// Thread-safety: every function may be called from any thread. Factories run without the
// registry's lock held, so a slow one (CUDA initialisation takes seconds) blocks no other caller,
// and may run concurrently with themselves.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tiers/device.h"

namespace strata {

// What a factory is asked to open. Backends ignore the fields that do not apply to them.
struct DeviceOptions {
  // N of "kind:N"; OpenDevice sets it from the spec (0 when the spec has no index).
  int index = 0;
  // Bytes of device memory strata may allocate; 0 = the backend's default (HostDevice: 1 GiB,
  // CudaDevice: 90% of the GPU's free memory when opened).
  uint64_t budget_bytes = 0;
  // HostDevice emulation knobs for tests and benchmarks (see HostDeviceOptions); real devices
  // ignore them.
  uint32_t copy_delay_us = 0;
  double copy_bytes_per_second = 0;
  bool poison = false;
};

// Opens one device. Must be callable from any thread; returns an error rather than a null device.
using DeviceFactory =
    std::function<Result<std::unique_ptr<DeviceBackend>>(const DeviceOptions& options)>;

// Registers `factory` under `kind`: lower-case letters, digits and '_', not "auto".
// kInvalidArgument for a bad kind or an empty factory, kAlreadyExists for a kind taken.
Status RegisterDevice(std::string kind, DeviceFactory factory);

// The registered kinds, sorted: {"host"} or {"cuda", "host"} in this tree.
std::vector<std::string> RegisteredDeviceKinds();

// Opens the device named by `spec` (above) with `options`, whose `index` is replaced by the
// spec's.
Result<std::unique_ptr<DeviceBackend>> OpenDevice(std::string_view spec,
                                                  const DeviceOptions& options = {});

}  // namespace strata
