// The NCCL communicator: data-parallel ranks on CUDA devices (c10d's ProcessGroupNCCL). Internal
// to runtime/comm: ConnectGloo (gloo_communicator.h) builds it when asked for a CUDA device.
//
// What runs where: the data collectives (AllReduceSum, AllReduceSumFloat, AllGather,
// ReduceScatterSum, and Broadcast of device memory) run over NCCL on the CUDA device; Barrier and
// Broadcast of host memory (small control messages: strings, sizes) go through the Gloo
// communicator this one wraps, whose rendezvous also names lost ranks. Buffers may be host memory
// (pageable or pinned: the engine's gathers, gradient hand-off and norms) or memory of this rank's
// CUDA device (torch::optim's flat gradients without offload): host buffers are staged through a
// device tensor (libtorch's caching allocator) in chunks of at most kNcclChunkBytes per buffer.
// Each call returns when its results are in the caller's memory (the host waits for the device),
// as with Gloo; the ordering with the caller's stream is c10d's: a collective waits for the work
// queued before it on the calling thread's current stream.
//
// Numbers: NCCL's sums are the same bits on every rank (each reduced value is computed once and
// broadcast), as the communicator contract requires; their order over ranks differs from Gloo's,
// which the ranks' tolerance (README "Multiple GPUs and machines") covers.
//
// Failures: c10d throws; every call is wrapped and returns kUnavailable naming the operation and
// what the rendezvous diagnoses about the ranks (a CUDA out-of-memory while staging:
// kResourceExhausted with the bytes). c10d's blocking wait is switched on
// (TORCH_NCCL_BLOCKING_WAIT, unless the environment sets it) so that a collective that outlives
// strata.comms_timeout_seconds throws here instead of aborting the process from c10d's watchdog. A
// communicator that failed stays failed.
//
// Build: this file's implementation (nccl_communicator.cc) needs libtorch's CUDA headers and
// NCCL's, so it is compiled only where libtorch was built with CUDA and a configure-time compile of
// it succeeds (runtime/comm/CMakeLists.txt, STRATA_HAVE_NCCL); elsewhere nccl_unavailable.cc
// returns kUnavailable saying so. Debian's CPU-only libtorch here has the headers but no CUDA
// library, so the CUDA build on this machine compiles the unavailable stub.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "base/status.h"
#include "runtime/comm/communicator.h"

namespace strata::runtime {

// Bytes of one buffer staged through the device at a time (and per NCCL call).
inline constexpr size_t kNcclChunkBytes = size_t{256} << 20;

// Wraps `control` (a Gloo communicator of the same ranks) in a communicator whose data collectives
// run over a ProcessGroupNCCL built on `store` (a prefix of the rendezvous store of its own) on
// CUDA device `cuda_device`. `diagnose` says which ranks are gone (Gloo's heartbeat). kUnavailable
// when c10d cannot build the process group, or when this build has no NCCL (nccl_unavailable.cc).
Result<std::shared_ptr<Communicator>> MakeNcclCommunicator(
    std::shared_ptr<Communicator> control, const c10::intrusive_ptr<c10d::Store>& store,
    int cuda_device, std::chrono::milliseconds timeout, std::function<std::string()> diagnose);

// The first line of an exception's message (c10::Error appends a backtrace); shared by the Gloo
// and NCCL communicators.
std::string ExceptionFirstLine(const std::exception& e);

}  // namespace strata::runtime
