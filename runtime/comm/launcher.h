// LaunchLocalRanks: starts N ranks of this program on this machine, as torchrun's
// --nproc-per-node does, for `strata train --nproc N` and `strata bench comm --nproc N`.
//
// Contract: each rank is the executable (default /proc/self/exe) run with the given argv and the
// environment of the launcher plus RANK=i, WORLD_SIZE=N, LOCAL_RANK=i, LOCAL_WORLD_SIZE=N,
// MASTER_ADDR=127.0.0.1 and MASTER_PORT=<a free loopback port> (CUDA_VISIBLE_DEVICES is left as
// it is; a rank picks GPU LOCAL_RANK itself). Rank 0's stdout is the launcher's (or captured);
// the other ranks' stdout goes to /dev/null; every rank's stderr is printed on the launcher's
// stderr line by line, prefixed "[rank r] ", a line that several ranks write alike only once
// (the first rank's). Each rank is in a process group of its own (so a
// terminal's Ctrl-C reaches it once, through the launcher) and gets SIGTERM if the launcher dies.
// SIGINT/SIGTERM received by the launcher while it waits are forwarded to every rank.
// When a rank fails (non-zero exit or a signal) the launcher says so on stderr ("strata: rank 1
// exited with code 1", "strata: rank 1 was killed by signal 9 (SIGKILL)"), gives the others
// `grace` to end on their own (their collectives fail), then sends SIGTERM, and SIGKILL after
// `kill_after` more.
//
// Returns the exit code for the launcher: 0 when every rank succeeded, else the first failing
// rank's code (128 + the signal for a signal). An error Status only when ranks cannot be started.
//
// Threads: call from one thread; it installs SIGINT/SIGTERM handlers while it runs and puts the
// previous ones back before returning.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "base/status.h"

namespace strata::runtime {

struct LaunchOptions {
  std::string executable = "/proc/self/exe";
  std::chrono::milliseconds grace{30000};
  std::chrono::milliseconds kill_after{5000};
  // Non-null: rank 0's stdout is captured here instead of going to the launcher's stdout.
  std::string* rank0_stdout = nullptr;
};

// `argv` is the whole command line of a rank, argv[0] included (without --nproc).
Result<int> LaunchLocalRanks(int nproc, const std::vector<std::string>& argv,
                             const LaunchOptions& options = {});

// `argv` without "--nproc N" / "--nproc=N" (every occurrence). kInvalidArgument for a --nproc
// without a value.
Result<std::vector<std::string>> RemoveNprocFlag(const std::vector<std::string>& argv);

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then closed).
Result<int> FreeLoopbackPort();

}  // namespace strata::runtime
