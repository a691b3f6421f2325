// runtime/comm/ holds the collectives between data-parallel ranks; the engine calls them where
// ranks meet and knows no transport.
//
// Communicator: the collective operations the engine needs across data-parallel ranks
// (ARCHITECTURE.md §8). Every rank owns 1/world of each group's flat state; a gather is an
// all-gather into the device buffer and gradients are reduce-scattered. Implementations: the
// single-rank one here, c10d's ProcessGroupGloo (gloo_communicator.h: CPU memory, which is the
// host-emulated device's memory too) and, where libtorch has CUDA, ProcessGroupNCCL
// (nccl_communicator.h: ranks on GPUs).
//
// Buffers are host or device addresses of the engine's compute device; one call's buffers are all
// host or all device memory, the same kind on every rank (the NCCL communicator routes a Broadcast
// by it). Calls are collective: every rank calls them in the same order with the same sizes.
// Thread-safety: one thread at a time per communicator; the engine uses one communicator per thread
// that calls collectives (the training thread, the gradient hand-off worker), each its own process
// group, so that their orders never interleave differently on different ranks.
//
// Failures: a collective that cannot complete (a rank died, the timeout passed) returns
// kUnavailable naming the rank(s) lost where it can tell (see gloo_communicator.h); after a
// failure the communicator is unusable and the caller ends the run.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "base/status.h"

namespace strata::runtime {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // "single", "gloo", "nccl".
  virtual std::string backend() const = 0;

  // Sums `count` doubles across ranks, in place (gradient-norm partial sums, overflow flags,
  // loss sums). Every rank receives the same bits.
  virtual Status AllReduceSum(double* values, size_t count) = 0;
  // Sums `count` floats across ranks, in place; every rank receives the same bits.
  virtual Status AllReduceSumFloat(float* values, size_t count) = 0;
  // Rank r's `bytes` bytes at `send` become bytes [r*bytes, (r+1)*bytes) of `recv` on all ranks.
  // In place allowed: send == recv + rank()*bytes.
  virtual Status AllGather(const void* send, void* recv, size_t bytes) = 0;
  // Sums world*count floats across ranks; rank r receives the sum of block r in `recv` (count
  // floats). `recv` may alias block r of `send`.
  virtual Status ReduceScatterSum(const float* send, float* recv, size_t count) = 0;
  // Root's `bytes` bytes at `data` are copied to every rank's `data`.
  virtual Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual Status Barrier() = 0;
};

// World of one: reductions are identities, gathers are copies (skipped when send == recv).
std::unique_ptr<Communicator> MakeSingleRankCommunicator();

// Broadcasts a string (at most 1 GiB; a larger one fails on every rank) from `root` to every
// rank.
Status BroadcastString(Communicator& comm, std::string& value, int root);

}  // namespace strata::runtime
