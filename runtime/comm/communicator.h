// runtime/comm/ holds the collectives between data-parallel ranks; the engine calls them where
// ranks meet and knows no transport.
//
// Communicator: the collective operations the engine needs across data-parallel ranks
// (ARCHITECTURE.md §8). Every rank owns 1/world of each unit's flat state; a gather is an
// all-gather into the device buffer and gradients are reduce-scattered. This release ships only
// the single-rank implementation, so that NCCL (GPU) and Gloo (CPU) ranks can be added behind the
// same calls without changing the engine.
//
// Buffers are host or device addresses of the engine's compute device; element type fp32 unless
// stated. Calls are collective: every rank calls them in the same order. Thread-safety: one
// thread at a time per communicator (the engine calls from its step thread).
#pragma once

#include <cstddef>
#include <memory>

#include "base/status.h"

namespace strata::runtime {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // Sums `count` doubles across ranks, in place (gradient-norm partial sums, overflow flags).
  virtual Status AllReduceSum(double* values, size_t count) = 0;
  // Rank r's `count` floats at `send` become floats [r*count, (r+1)*count) of `recv` on all ranks.
  virtual Status AllGather(const float* send, float* recv, size_t count) = 0;
  // Sums world*count floats across ranks; rank r receives the sum of block r in `recv`.
  virtual Status ReduceScatterSum(const float* send, float* recv, size_t count) = 0;
  virtual Status Barrier() = 0;
};

// World of one: reductions are identities, gathers are copies (skipped when send == recv).
std::unique_ptr<Communicator> MakeSingleRankCommunicator();

}  // namespace strata::runtime
