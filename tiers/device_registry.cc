// The registry is a map from kind to factory behind one mutex, created on first use (so that
// static initializers in other objects may register into it) and never destroyed (so that code
// running at exit may still open devices). "host" is put in when the map is created.
#include "tiers/device_registry.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <utility>

#include "base/logging.h"
#include "base/mutex.h"
#include "strata/config.h"
#include "tiers/host_device.h"

namespace strata {
namespace {

constexpr std::string_view kAuto = "auto";
constexpr std::string_view kHost = "host";
constexpr std::string_view kCuda = "cuda";

Result<std::unique_ptr<DeviceBackend>> OpenHost(const DeviceOptions& options) {
  HostDeviceOptions host;
  if (options.budget_bytes != 0) host.budget_bytes = options.budget_bytes;
  host.copy_delay_us = options.copy_delay_us;
  host.copy_bytes_per_second = options.copy_bytes_per_second;
  host.poison = options.poison;
  return std::unique_ptr<DeviceBackend>(std::make_unique<HostDevice>(host));
}

class Registry {
 public:
  static Registry& Get() {
    static Registry* registry = new Registry();  // never destroyed: usable at exit
    return *registry;
  }

  Status Add(std::string kind, DeviceFactory factory) {
    MutexLock lock(&mu_);
    if (factories_.contains(kind)) {
      return AlreadyExistsError("device kind '" + kind + "' is already registered");
    }
    factories_.emplace(std::move(kind), std::move(factory));
    return Status::Ok();
  }

  // Null when `kind` is not registered.
  DeviceFactory Find(std::string_view kind) const {
    MutexLock lock(&mu_);
    auto it = factories_.find(kind);
    return it == factories_.end() ? DeviceFactory() : it->second;
  }

  std::vector<std::string> Kinds() const {
    MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& [kind, factory] : factories_) out.push_back(kind);
    return out;  // sorted: std::map
  }

 private:
  Registry() { factories_.emplace(std::string(kHost), OpenHost); }

  mutable Mutex mu_;
  std::map<std::string, DeviceFactory, std::less<>> factories_ GUARDED_BY(mu_);
};

bool ValidKind(std::string_view kind) {
  return !kind.empty() && kind != kAuto && std::all_of(kind.begin(), kind.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

std::string JoinKinds() {
  std::string out;
  for (const std::string& kind : Registry::Get().Kinds()) {
    if (!out.empty()) out += ", ";
    out += kind;
  }
  return out;
}

// The error for a kind nobody registered. "cuda" gets its own, because what the user must do
// differs: rebuild with CUDA, or (a build mistake) link the object that registers it.
Status UnregisteredKind(std::string_view spec, std::string_view kind) {
  const std::string prefix = "device " + std::string(spec) + ": ";
  if (kind == kCuda) {
    if (!STRATA_HAVE_CUDA) {
      return UnavailableError(prefix +
                              "strata was not built with CUDA support (configure with "
                              "STRATA_WITH_CUDA=ON)");
    }
    return InternalError(prefix +
                         "this build has CUDA but the program does not link the cuda device "
                         "kind (link the CMake target strata_devices, see "
                         "tiers/device_registry.h)");
  }
  return InvalidArgumentError(prefix + "unknown device kind '" + std::string(kind) +
                              "' (registered: " + JoinKinds() + "; or auto)");
}

// Splits "kind" or "kind:N".
Status ParseSpec(std::string_view spec, std::string* kind, int* index) {
  const size_t colon = spec.find(':');
  *kind = std::string(spec.substr(0, colon));
  *index = 0;
  if (colon == std::string_view::npos) return Status::Ok();
  const std::string_view digits = spec.substr(colon + 1);
  const char* end = digits.data() + digits.size();
  auto [ptr, ec] = std::from_chars(digits.data(), end, *index);
  if (digits.empty() || ec != std::errc() || ptr != end || *index < 0) {
    return InvalidArgumentError("device " + std::string(spec) +
                                ": the index after ':' must be a non-negative integer");
  }
  if (*kind == kAuto) {
    return InvalidArgumentError("device " + std::string(spec) + ": auto takes no index");
  }
  return Status::Ok();
}

Result<std::unique_ptr<DeviceBackend>> OpenOne(std::string_view spec, const std::string& kind,
                                               DeviceOptions options) {
  DeviceFactory factory = Registry::Get().Find(kind);
  if (!factory) return UnregisteredKind(spec, kind);
  Result<std::unique_ptr<DeviceBackend>> device = factory(options);
  if (!device.ok()) return device.status().WithContext("device " + std::string(spec));
  if (*device == nullptr) {
    return InternalError("device " + std::string(spec) + ": the factory returned no device");
  }
  return device;
}

}  // namespace

Status RegisterDevice(std::string kind, DeviceFactory factory) {
  if (!ValidKind(kind)) {
    return InvalidArgumentError("device kind '" + kind +
                                "' is not lower-case letters, digits and '_' (or is 'auto')");
  }
  if (!factory) return InvalidArgumentError("device kind '" + kind + "': empty factory");
  return Registry::Get().Add(std::move(kind), std::move(factory));
}

std::vector<std::string> RegisteredDeviceKinds() { return Registry::Get().Kinds(); }

Result<std::unique_ptr<DeviceBackend>> OpenDevice(std::string_view spec,
                                                  const DeviceOptions& options) {
  if (spec.empty()) spec = kAuto;
  std::string kind;
  DeviceOptions opened = options;
  STRATA_RETURN_IF_ERROR(ParseSpec(spec, &kind, &opened.index));
  if (kind != kAuto) return OpenOne(spec, kind, opened);

  opened.index = 0;
  Result<std::unique_ptr<DeviceBackend>> gpu = OpenOne("cuda:0", std::string(kCuda), opened);
  if (gpu.ok()) {
    STRATA_LOG(kInfo) << "device auto: using cuda:0 (" << (*gpu)->info().name << ")";
    return gpu;
  }
  if (gpu.status().code() != StatusCode::kUnavailable) return gpu.status();
  STRATA_LOG(kInfo) << "device auto: using host, the emulated device (" << gpu.status().message()
                    << ")";
  return OpenOne("host", std::string(kHost), opened);
}

}  // namespace strata
