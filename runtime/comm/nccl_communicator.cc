// MakeNcclCommunicator (nccl_communicator.h): c10d's ProcessGroupNCCL on tensors over the caller's
// device memory, or on device copies of its host memory. Stateless between calls but for the first
// failure (failed_), which every later call returns. Threads: one at a time, like every
// Communicator; each call sets this communicator's CUDA device for its duration.
//
// Two paths per call, by where the caller's buffers are:
//   device: the collective runs on the buffers themselves (or on a device scratch where a chunk of
//       the caller's layout is not one contiguous tensor, or where send and recv alias), ordered by
//       c10d after the work queued on the calling thread's current stream;
//   staged (host buffers): copies to the device, the collective and copies back all run on a stream
//       of this communicator's own, so the host waits for them only, never for the caller's
//       compute.
// Either way the host waits at the end of a call for the stream the results were written on (with
// c10d's blocking wait, the default here, wait() itself already waits for the collective).
//
// Needs libtorch's CUDA headers (ProcessGroupNCCL.hpp includes ATen/cuda and nccl.h; c10's CUDA
// stream guard) and the CUDA runtime (cudaPointerGetAttributes): compiled only where
// runtime/comm/CMakeLists.txt found both (STRATA_HAVE_NCCL).
#include "runtime/comm/nccl_communicator.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <utility>
#include <vector>

#include "base/bytes.h"

namespace strata::runtime {
namespace {

// Whether `p` is memory of a CUDA device (device or managed); host memory, pinned or not, is not.
bool IsDeviceMemory(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)
        cudaGetLastError();  // an unknown pointer is host memory (older runtimes said so this way)
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

// Whether [a, a + a_bytes) and [b, b + b_bytes) overlap.
bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

// The environment variable that switches c10d's blocking wait on, by libtorch version (2.x warns
// about the old name).
const char* BlockingWaitVariable() {
  return TORCH_VERSION_MAJOR >= 2 ? "TORCH_NCCL_BLOCKING_WAIT" : "NCCL_BLOCKING_WAIT";
}

// Ends a process group's communicators before it is destroyed (libtorch 2.x warns, and may throw
// from its destructor, otherwise). abort(), not shutdown(): it is bounded by the timeout, where
// shutdown's finalize may wait for a peer that is gone; libtorch 1.x has neither call and cleans
// up itself.
template <typename ProcessGroup>
void ShutDown(ProcessGroup& pg) {
  if constexpr (requires { pg.abort(); }) {
    try {
      pg.abort();
    } catch (const std::exception&) {
      // Ending anyway: the run already failed or finished.
    }
  }
}

class NcclCommunicator final : public Communicator {
 public:
  // `staging`: a stream of this communicator's own on `cuda_device` (it destroys it).
  NcclCommunicator(std::shared_ptr<Communicator> control,
                   c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg, int cuda_device,
                   cudaStream_t staging, std::function<std::string()> diagnose)
      : control_(std::move(control)),
        pg_(std::move(pg)),
        device_(torch::kCUDA, static_cast<c10::DeviceIndex>(cuda_device)),
        staging_(staging),
        diagnose_(std::move(diagnose)) {}

  ~NcclCommunicator() override {
    c10::DeviceGuard guard(device_);
    ShutDown(*pg_);
    pg_.reset();
    (void)cudaStreamDestroy(staging_);  // after the last work that used it
  }

  int rank() const override { return control_->rank(); }
  int world_size() const override { return control_->world_size(); }
  std::string backend() const override { return "nccl"; }

  Status AllReduceSum(double* values, size_t count) override {
    return AllReduce(values, count, torch::kFloat64, sizeof(double));
  }
  Status AllReduceSumFloat(float* values, size_t count) override {
    return AllReduce(values, count, torch::kFloat32, sizeof(float));
  }

  Status AllGather(const void* send, void* recv, size_t bytes) override {
    const int n = world_size();
    const size_t total = bytes * static_cast<size_t>(n);
    auto* in = const_cast<uint8_t*>(static_cast<const uint8_t*>(send));
    auto* out = static_cast<uint8_t*>(recv);
    return Run("all_gather", total, {{send, bytes}, {recv, total}}, [&](bool on_device) {
      for (size_t off = 0; off < bytes; off += kNcclChunkBytes) {
        const int64_t len = static_cast<int64_t>(std::min(kNcclChunkBytes, bytes - off));
        const bool whole = on_device && off == 0 && static_cast<size_t>(len) == bytes;
        // The input is a tensor of its own where it overlaps the output (in place: this rank's
        // block), so that c10d never sees aliased tensors.
        at::Tensor input = !on_device ? ToDevice(in + off, len, torch::kUInt8)
                           : whole && Overlap(send, bytes, recv, total)
                               ? Wrap(in, len, torch::kUInt8).clone()
                               : Wrap(in + off, len, torch::kUInt8);
        at::Tensor output = whole ? Wrap(out, len * n, torch::kUInt8)
                                  : torch::empty({n * len}, Options(torch::kUInt8));
        Finish(pg_->_allgather_base(output, input));
        if (whole) continue;
        for (int r = 0; r < n; ++r) {
          CopyOut(output.narrow(0, r * len, len), out + static_cast<size_t>(r) * bytes + off, len,
                  torch::kUInt8, on_device);
        }
      }
    });
  }

  Status ReduceScatterSum(const float* send, float* recv, size_t count) override {
    const int n = world_size();
    const size_t bytes = count * sizeof(float);
    const size_t total = bytes * static_cast<size_t>(n);
    auto* in = const_cast<float*>(send);
    const size_t per_chunk = kNcclChunkBytes / sizeof(float);
    return Run("reduce_scatter", total, {{send, total}, {recv, bytes}}, [&](bool on_device) {
      for (size_t off = 0; off < count; off += per_chunk) {
        const int64_t len = static_cast<int64_t>(std::min(per_chunk, count - off));
        const bool whole = on_device && off == 0 && static_cast<size_t>(len) == count;
        at::Tensor input;
        if (whole) {
          input = Wrap(in, len * n, torch::kFloat32);
        } else {
          input = torch::empty({n * len}, Options(torch::kFloat32));
          for (int r = 0; r < n; ++r) {
            float* block = in + static_cast<size_t>(r) * count + off;
            input.narrow(0, r * len, len)
                .copy_(on_device ? Wrap(block, len, torch::kFloat32)
                                 : Host(block, len, torch::kFloat32));
          }
        }
        // `recv` may alias this rank's block of `send`: then the sum lands in a scratch first.
        const bool direct = whole && !Overlap(send, total, recv, bytes);
        at::Tensor output = direct ? Wrap(recv, len, torch::kFloat32)
                                   : torch::empty({len}, Options(torch::kFloat32));
        Finish(pg_->_reduce_scatter_base(output, input));
        if (!direct) CopyOut(output, recv + off, len, torch::kFloat32, on_device);
      }
    });
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= world_size()) {
      return InvalidArgumentError("Broadcast: root " + std::to_string(root) + " outside 0.." +
                                  std::to_string(world_size() - 1));
    }
    {
      c10::DeviceGuard guard(device_);
      if (!IsDeviceMemory(data)) {  // control messages: over Gloo, as they are
        if (!failed_.ok()) return failed_;
        return control_->Broadcast(data, bytes, root);
      }
    }
    return Run("broadcast", bytes, {{data, bytes}}, [&](bool on_device) {
      for (size_t off = 0; off < bytes; off += kNcclChunkBytes) {
        const int64_t len = static_cast<int64_t>(std::min(kNcclChunkBytes, bytes - off));
        std::vector<at::Tensor> t = {Wrap(static_cast<uint8_t*>(data) + off, len, torch::kUInt8)};
        c10d::BroadcastOptions opts;
        opts.rootRank = root;
        Finish(pg_->broadcast(t, opts));
      }
    });
  }

  Status Barrier() override {
    if (!failed_.ok()) return failed_;
    return control_->Barrier();
  }

 private:
  struct Span {
    const void* p;
    size_t bytes;
  };

  torch::TensorOptions Options(at::ScalarType type) const {
    return torch::TensorOptions().dtype(type).device(device_);
  }
  // A tensor over memory of this rank's device.
  at::Tensor Wrap(void* p, int64_t numel, at::ScalarType type) const {
    return torch::from_blob(p, {numel}, Options(type));
  }
  static at::Tensor Host(void* p, int64_t numel, at::ScalarType type) {
    return torch::from_blob(p, {numel}, torch::TensorOptions().dtype(type));
  }
  // A device copy of host memory (on the current stream: the side stream when staged).
  at::Tensor ToDevice(void* p, int64_t numel, at::ScalarType type) const {
    return Host(p, numel, type).to(device_);
  }
  // A device tensor's values into the caller's memory (host: the host waits for the copy).
  void CopyOut(const at::Tensor& from, void* p, int64_t numel, at::ScalarType type,
               bool on_device) const {
    (on_device ? Wrap(p, numel, type) : Host(p, numel, type)).copy_(from);
  }
  // Waits for a collective: the current stream waits for it (and, with blocking wait, the host).
  // The host then waits for the current stream where results land in device memory (Run), and
  // the staged path's copies back to the host wait for it.
  template <typename WorkPtr>
  static void Finish(const WorkPtr& work) {
    work->wait();
  }

  Status AllReduce(void* values, size_t count, at::ScalarType type, size_t elem) {
    const size_t per_chunk = kNcclChunkBytes / elem;
    return Run("all_reduce", count * elem, {{values, count * elem}}, [&](bool on_device) {
      for (size_t off = 0; off < count; off += per_chunk) {
        const int64_t len = static_cast<int64_t>(std::min(per_chunk, count - off));
        void* p = static_cast<uint8_t*>(values) + off * elem;
        std::vector<at::Tensor> t = {on_device ? Wrap(p, len, type) : ToDevice(p, len, type)};
        Finish(pg_->allreduce(t));
        if (!on_device) CopyOut(t[0], p, len, type, false);
      }
    });
  }

  // Runs `body(on_device)` with this communicator's device current, turning what c10d and
  // libtorch throw into a Status. `buffers`: the caller's, all device memory (on_device) or all
  // host memory (staged, on a side stream); a mix is refused.
  template <typename Body>
  Status Run(const char* op, size_t bytes, std::initializer_list<Span> buffers, Body&& body) {
    if (!failed_.ok()) return failed_;
    const std::string what = std::string(op) + " of " + FormatBytes(bytes) + " over nccl on " +
                             device_.str() + " (rank " + std::to_string(rank()) + ")";
    try {
      c10::DeviceGuard guard(device_);
      int device_buffers = 0, host_buffers = 0;
      for (const Span& s : buffers) {
        if (s.bytes == 0) continue;
        ++(IsDeviceMemory(s.p) ? device_buffers : host_buffers);
      }
      if (device_buffers > 0 && host_buffers > 0) {
        return InvalidArgumentError(what + ": the buffers mix host and device memory");
      }
      if (device_buffers + host_buffers == 0) return Status::Ok();  // nothing to send
      if (device_buffers > 0) {
        body(true);
        // Results in device memory (some through a scratch copied on this stream) are there when
        // the call returns, for whichever stream or thread reads them next.
        c10::impl::VirtualGuardImpl impl(device_.type());
        impl.getStream(device_).synchronize();
      } else {
        // Staging on this communicator's own stream: not another process group's NCCL stream
        // (libtorch's pool hands those out too), and the host waits for nothing else.
        c10::cuda::CUDAStreamGuard side(
            c10::cuda::getStreamFromExternal(staging_, device_.index()));
        body(false);
      }
      return Status::Ok();
    } catch (const c10::OutOfMemoryError& e) {
      failed_ = ResourceExhaustedError(
          what + ": CUDA out of memory staging the buffers (chunks of " +
          FormatBytes(kNcclChunkBytes) + "): " + ExceptionFirstLine(e) +
          "; lower --device-memory to leave libtorch and NCCL more of the GPU");
    } catch (const std::exception& e) {
      failed_ = UnavailableError(what + " failed: " + diagnose_() + ": " + ExceptionFirstLine(e));
    } catch (...) {
      failed_ = UnavailableError(what + " failed: " + diagnose_() + ": unknown exception");
    }
    return failed_;
  }

  std::shared_ptr<Communicator> control_;          // Gloo: barrier, host broadcasts
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;  // shut down and destroyed before control_
  const torch::Device device_;
  const cudaStream_t staging_;  // owned: the staged path's copies and collectives
  std::function<std::string()> diagnose_;
  Status failed_;  // the first failure; then every call fails
};

}  // namespace

void PrepareNcclEnvironment() {
  // A collective that outlives the timeout throws from wait() (then reported, with the lost
  // ranks) instead of c10d's watchdog ending the process; the user's own setting wins.
  ::setenv(BlockingWaitVariable(), "1", /*overwrite=*/0);
}

Result<std::shared_ptr<Communicator>> MakeNcclCommunicator(
    std::shared_ptr<Communicator> control, const c10::intrusive_ptr<c10d::Store>& store,
    int cuda_device, std::chrono::milliseconds timeout, std::function<std::string()> diagnose) {
  const std::string where = "cuda:" + std::to_string(cuda_device) + " (rank " +
                            std::to_string(control->rank()) + " of " +
                            std::to_string(control->world_size()) + ")";
  std::shared_ptr<Communicator> comm;
  try {
    c10::DeviceGuard guard(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(cuda_device)));
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, control->rank(),
                                                          control->world_size(), options);
    cudaStream_t staging = nullptr;
    if (const cudaError_t err = cudaStreamCreateWithFlags(&staging, cudaStreamNonBlocking);
        err != cudaSuccess) {
      return UnavailableError("creating a stream for nccl on " + where + ": " +
                              cudaGetErrorString(err));
    }
    comm = std::make_shared<NcclCommunicator>(std::move(control), std::move(pg), cuda_device,
                                              staging, std::move(diagnose));
  } catch (const std::exception& e) {
    return UnavailableError("creating the nccl process group on " + where +
                            " failed: " + ExceptionFirstLine(e));
  }
  // NCCL's communicator now, not at the first collective: every rank creates its process groups in
  // the same order on one thread, where later the engine's threads would each create one at once
  // (NCCL's init allocates device memory while another communicator's kernels may run).
  double one = 1;
  if (Status s = comm->AllReduceSum(&one, 1); !s.ok()) {
    return UnavailableError("starting nccl on " + where + ": " + std::string(s.message()));
  }
  if (one != static_cast<double>(comm->world_size())) {
    return InternalError("starting nccl on " + where + ": a sum of ones over " +
                         std::to_string(comm->world_size()) + " ranks gave " + std::to_string(one));
  }
  return comm;
}

}  // namespace strata::runtime
