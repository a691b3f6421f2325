// The NCCL communicator: data-parallel ranks on CUDA devices (c10d's ProcessGroupNCCL). Internal
// to runtime/comm: ConnectGloo (gloo_communicator.h) builds it when asked for a CUDA device.
//
// What runs where: the data collectives (AllReduceSum, AllReduceSumFloat, AllGather,
// ReduceScatterSum, and Broadcast of device memory) run over NCCL on the CUDA device; Barrier and
// Broadcast of host memory (small control messages: strings, sizes) go through the Gloo
// communicator this one wraps, whose rendezvous also names lost ranks (every rank must pass the
// same kind of memory to one Broadcast). A call's buffers are all memory of this rank's CUDA device
// (the engine's gathers into device buffers, device homes) or all host memory, pageable or pinned
// (norms, flags, the gradient hand-off, torch::optim's flat gradients); a mix is kInvalidArgument.
// Device buffers are used in place where a chunk is one contiguous tensor (else through a device
// scratch), ordered by c10d after the work queued before the call on the calling thread's current
// stream: a caller on another thread than the compute must order its buffers itself (the engine's
// ahead all-gather waits for a compute event). Host buffers are staged through device tensors
// (libtorch's caching allocator) on a CUDA stream of the communicator's own, in chunks of at most
// kNcclChunkBytes, so the host never waits for the caller's compute. Each call returns when its
// results are in the caller's memory, as with Gloo.
//
// Numbers: NCCL's sums are the same bits on every rank (each reduced value is computed once and
// broadcast), as the communicator contract requires; their order over ranks differs from Gloo's,
// which the ranks' tolerance (README "Multiple GPUs and machines") covers.
//
// NCCL's own communicator is created when the process group is (a one-element all-reduce), in the
// same order on every rank and on the connecting thread, not lazily at the first collective of
// each of the engine's threads: NCCL's initialization allocates device memory, which must not run
// beside another communicator's kernels.
//
// Failures: c10d throws; every call is wrapped and returns kUnavailable naming the operation and
// what the rendezvous diagnoses about the ranks (a CUDA out-of-memory while staging:
// kResourceExhausted with the bytes). c10d's blocking wait is switched on (PrepareNcclEnvironment:
// TORCH_NCCL_BLOCKING_WAIT, unless the environment sets it) so that a collective that outlives
// strata.comms_timeout_seconds throws here instead of c10d's watchdog ending the process. A
// communicator that failed stays failed; destroying it aborts its process group's NCCL
// communicators where libtorch has the call (2.x; bounded by the timeout, unlike a shutdown that
// may wait for a lost peer).
//
// Build: this file's implementation (nccl_communicator.cc) needs libtorch's CUDA headers and
// NCCL's, so it is compiled only where libtorch was built with CUDA and a configure-time compile of
// it succeeds (runtime/comm/CMakeLists.txt, STRATA_HAVE_NCCL); elsewhere nothing calls these
// (ConnectGloo refuses an NCCL device with kUnavailable). Debian's CPU-only libtorch here has the
// headers but no CUDA library, so the CUDA build on this machine has no NCCL communicator.
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
inline constexpr size_t kNcclChunkBytes = size_t{64} << 20;

// Sets c10d's blocking wait for the process groups created later. Call before
// other threads start reading the environment.
void PrepareNcclEnvironment();

// Wraps `control` (a Gloo communicator of the same ranks) in a communicator whose data collectives
// run over a ProcessGroupNCCL built on `store` (a prefix of the rendezvous store of its own) on
// CUDA device `cuda_device`, and starts NCCL's communicator (a collective every rank calls:
// every rank calls this in the same order). `diagnose` says which ranks are gone (Gloo's
// heartbeat). kUnavailable when c10d cannot build the process group or NCCL cannot start.
Result<std::shared_ptr<Communicator>> MakeNcclCommunicator(
    std::shared_ptr<Communicator> control, const c10::intrusive_ptr<c10d::Store>& store,
    int cuda_device, std::chrono::milliseconds timeout, std::function<std::string()> diagnose);

// The first line of an exception's message (c10::Error appends a backtrace); shared by the Gloo
// and NCCL communicators.
std::string ExceptionFirstLine(const std::exception& e);

}  // namespace strata::runtime
