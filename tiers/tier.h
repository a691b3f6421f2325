// The one placement vocabulary of strata (ARCHITECTURE.md §1, §2).
//
//   Tier: where bytes physically are right now (a copy of a block): the device's memory, the
//         pinned host arena, pageable host memory, or an NVMe extent.
//   Home: where a kind of training state lives between uses, as DeepSpeed's
//         `offload_param.device` / `offload_optimizer.device` say it: "none" (on the device, not
//         offloaded), "cpu" (pinned host memory), "nvme" (swap files, staged through pinned slots).
//
// HomeTier() maps a Home to the tier that holds its resident copy. Config parsing, the memory plan,
// the engine and the CLI all use these two enums; there are no other spellings of them.
//
// Thread-safety: pure functions over constants.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

// A block of model state registered with a TierManager (its index there).
using BlockId = uint32_t;

enum class Tier : uint8_t { kDevice = 0, kPinned, kHost, kNvme };
// "device", "pinned", "host", "nvme".
constexpr std::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return "device";
    case Tier::kPinned:
      return "pinned";
    case Tier::kHost:
      return "host";
    case Tier::kNvme:
      return "nvme";
  }
  return "?";
}

enum class Home : uint8_t { kDevice = 0, kCpu, kNvme };
// DeepSpeed's spelling of the offload device: "none", "cpu", "nvme".
constexpr std::string_view HomeName(Home home) {
  switch (home) {
    case Home::kDevice:
      return "none";
    case Home::kCpu:
      return "cpu";
    case Home::kNvme:
      return "nvme";
  }
  return "?";
}
// The inverse of HomeName; nullopt for anything else (callers phrase their own error).
constexpr std::optional<Home> HomeFromName(std::string_view name) {
  if (name == "none") return Home::kDevice;
  if (name == "cpu") return Home::kCpu;
  if (name == "nvme") return Home::kNvme;
  return std::nullopt;
}
// The tier holding the resident copy of state whose home is `home`: the device, the pinned host
// arena, or NVMe.
constexpr Tier HomeTier(Home home) {
  switch (home) {
    case Home::kDevice:
      return Tier::kDevice;
    case Home::kCpu:
      return Tier::kPinned;
    case Home::kNvme:
      return Tier::kNvme;
  }
  return Tier::kDevice;
}

}  // namespace strata
