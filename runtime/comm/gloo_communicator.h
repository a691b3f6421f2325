// Communicators over PyTorch c10d's ProcessGroupGloo (CPU memory), with the rendezvous of the
// torchrun contract (ARCHITECTURE.md §8).
//
// Contract: DistEnvFromEnvironment reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (optional),
// MASTER_ADDR and MASTER_PORT; none of them set means a single rank. ConnectGloo meets the other
// ranks through a c10d TCPStore (rank 0 serves it on MASTER_ADDR:MASTER_PORT), checks that every
// rank was started with the same WORLD_SIZE, and returns `groups` independent process groups (one
// per thread that calls collectives, see communicator.h). Buffers are CPU memory.
//
// Failures: a collective that fails (a peer died: Gloo's connection closed or reset; the timeout
// passed) returns kUnavailable naming the rank(s) lost. Every rank bumps a heartbeat counter in
// the store about once a second from a thread of its own; after a failed collective the counters
// are read twice 2.5 s apart and the ranks whose counter stood still are named. When the store
// itself is unreachable, rank 0 (which hosts it) is named. A communicator that failed stays
// failed: every later call returns the same error.
//
// Threads: each communicator is used by one thread at a time; distinct communicators of one
// ConnectGloo call may be used from different threads. The heartbeat thread is shared by the
// communicators of one call and stops (joined) when the last of them is destroyed.
//
// Ownership: the returned communicators share the store connection and the heartbeat thread
// (reference-counted); rank 0's store server lives as long as rank 0's communicators.
//
// Builds without libtorch (or without Gloo's headers) have DistEnvFromEnvironment; their
// ConnectGloo returns kUnavailable.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/comm/communicator.h"

namespace strata::runtime {

// The torchrun contract of one process.
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;  // LOCAL_WORLD_SIZE, or WORLD_SIZE when it is not set
  std::string master_addr;
  int master_port = 0;
};

// nullopt when neither RANK nor WORLD_SIZE is set (a single rank, whatever else is set).
// kInvalidArgument naming the variable and its value when some are set and others are not,
// when one does not parse, when RANK >= WORLD_SIZE (or LOCAL_RANK >= LOCAL_WORLD_SIZE) or when
// MASTER_PORT is outside 1..65535.
Result<std::optional<DistEnv>> DistEnvFromEnvironment();
// The same, with variables looked up through `lookup` (tests); null means unset.
Result<std::optional<DistEnv>> DistEnvFromVariables(
    const std::function<const char*(const char*)>& lookup);

// Connects this rank to the others and returns `groups` (>= 1) communicators, each its own
// ProcessGroupGloo whose collectives time out after `timeout`. With `nccl_device` >= 0 (ranks on
// GPUs), each is instead an NCCL communicator on CUDA device `nccl_device` (nccl_communicator.h:
// its data collectives over its own ProcessGroupNCCL, barriers and host broadcasts over the Gloo
// one); kUnavailable when this build has no NCCL (NcclBuilt()). Joining also waits at most
// `timeout` for every rank. kUnavailable when MASTER_ADDR:MASTER_PORT cannot be reached, when
// ranks do not join in time or when this build has no libtorch; kInvalidArgument when the ranks
// disagree on WORLD_SIZE.
//
// `settings`: what must be the same on every rank, as "key=value" lines (the trainer's model,
// sequence length, precision, optimizer, seed, data...). Each rank publishes its own when it
// joins and compares every other rank's: a difference is kInvalidArgument on every rank, naming
// the first differing key and both values, before any collective could disagree on sizes.
Result<std::vector<std::shared_ptr<Communicator>>> ConnectGloo(const DistEnv& env, int groups,
                                                               std::chrono::milliseconds timeout,
                                                               const std::string& settings = "",
                                                               int nccl_device = -1);

// Whether this build has the NCCL communicator (libtorch with CUDA, runtime/comm/CMakeLists.txt).
bool NcclBuilt();

}  // namespace strata::runtime
