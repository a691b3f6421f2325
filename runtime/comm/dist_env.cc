// DistEnvFromEnvironment: the torchrun contract's variables, parsed strictly (gloo_communicator.h).
// Free of libtorch, so builds without it still tell a multi-rank launch apart from a single rank.
#include <charconv>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/env.h"
#include "runtime/comm/gloo_communicator.h"

namespace strata::runtime {
namespace {

// The whole of `text` as a decimal int, or kInvalidArgument naming `name`.
Result<int> ParseInt(const char* name, const char* text) {
  const std::string s(text);
  int value = 0;
  const char* end = s.data() + s.size();
  const auto [ptr, ec] = std::from_chars(s.data(), end, value);
  if (s.empty() || ec != std::errc() || ptr != end) {
    return InvalidArgumentError(std::string(name) + "='" + s + "' is not an integer");
  }
  return value;
}

}  // namespace

Result<std::optional<DistEnv>> DistEnvFromEnvironment() {
  return DistEnvFromVariables([](const char* name) { return GetEnv(name); });
}

Result<std::optional<DistEnv>> DistEnvFromVariables(
    const std::function<const char*(const char*)>& lookup) {
  static constexpr const char* kRequired[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                              "MASTER_PORT"};
  std::vector<std::string> set, unset;
  for (const char* name : kRequired) {
    const char* v = lookup(name);
    if (v != nullptr) {
      set.push_back(std::string(name) + "=" + v);
    } else {
      unset.push_back(name);
    }
  }
  // A process is a rank of a group when RANK or WORLD_SIZE says so; MASTER_ADDR/MASTER_PORT or
  // LOCAL_RANK alone (a cluster profile, a wrapper) leave it a single rank.
  if (lookup("RANK") == nullptr && lookup("WORLD_SIZE") == nullptr) return std::optional<DistEnv>();
  if (!unset.empty()) {
    std::string msg;
    for (const std::string& s : set) msg += (msg.empty() ? "" : ", ") + s;
    msg += " set but not ";
    for (size_t i = 0; i < unset.size(); ++i) msg += (i ? ", " : "") + unset[i];
    return InvalidArgumentError(
        msg +
        " (a multi-rank launch sets all of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, "
        "MASTER_PORT, as torchrun and `strata ... --nproc N` do)");
  }
  DistEnv env;
  STRATA_ASSIGN_OR_RETURN(env.rank, ParseInt("RANK", lookup("RANK")));
  STRATA_ASSIGN_OR_RETURN(env.world_size, ParseInt("WORLD_SIZE", lookup("WORLD_SIZE")));
  STRATA_ASSIGN_OR_RETURN(env.local_rank, ParseInt("LOCAL_RANK", lookup("LOCAL_RANK")));
  STRATA_ASSIGN_OR_RETURN(env.master_port, ParseInt("MASTER_PORT", lookup("MASTER_PORT")));
  env.local_world_size = env.world_size;
  if (const char* lws = lookup("LOCAL_WORLD_SIZE"); lws != nullptr) {
    STRATA_ASSIGN_OR_RETURN(env.local_world_size, ParseInt("LOCAL_WORLD_SIZE", lws));
  }
  env.master_addr = lookup("MASTER_ADDR");
  const auto n = [](int v) { return std::to_string(v); };
  if (env.world_size < 1) return InvalidArgumentError("WORLD_SIZE=" + n(env.world_size) + " < 1");
  if (env.rank < 0 || env.rank >= env.world_size) {
    return InvalidArgumentError("RANK=" + n(env.rank) + " is outside 0..WORLD_SIZE-1 (WORLD_SIZE=" +
                                n(env.world_size) + ")");
  }
  if (env.local_world_size < 1 || env.local_world_size > env.world_size) {
    return InvalidArgumentError("LOCAL_WORLD_SIZE=" + n(env.local_world_size) +
                                " is outside 1..WORLD_SIZE (WORLD_SIZE=" + n(env.world_size) + ")");
  }
  if (env.local_rank < 0 || env.local_rank >= env.local_world_size) {
    return InvalidArgumentError(
        "LOCAL_RANK=" + n(env.local_rank) +
        " is outside 0..LOCAL_WORLD_SIZE-1 (LOCAL_WORLD_SIZE=" + n(env.local_world_size) + ")");
  }
  if (env.master_port < 1 || env.master_port > 65535) {
    return InvalidArgumentError("MASTER_PORT=" + n(env.master_port) + " is outside 1..65535");
  }
  if (env.master_addr.empty()) return InvalidArgumentError("MASTER_ADDR is empty");
  return std::optional<DistEnv>(std::move(env));
}

}  // namespace strata::runtime
