// ConnectGloo in builds without libtorch (or without Gloo's headers): only the single-rank
// communicator exists there.
#include "runtime/comm/gloo_communicator.h"

namespace strata::runtime {

bool NcclBuilt() { return false; }

Result<std::vector<std::shared_ptr<Communicator>>> ConnectGloo(const DistEnv& env, int,
                                                               std::chrono::milliseconds,
                                                               const std::string&, int) {
  return UnavailableError(
      "more than one rank (WORLD_SIZE=" + std::to_string(env.world_size) +
      ", RANK=" + std::to_string(env.rank) +
      ") needs strata built with libtorch and Gloo (c10d's ProcessGroupGloo; Debian: "
      "libgloo-dev); this build has the single-rank communicator only");
}

}  // namespace strata::runtime
