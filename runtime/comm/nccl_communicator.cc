// MakeNcclCommunicator (nccl_communicator.h): c10d's ProcessGroupNCCL on tensors that wrap the
// caller's device memory, or on device copies of its host memory. Stateless between calls but for
// the first failure (failed_), which every later call returns. Threads: one at a time, like every
// Communicator; the CUDA device of each call is set for the calling thread by c10d's guards.
//
// Needs libtorch's CUDA headers (ProcessGroupNCCL.hpp includes ATen/cuda and nccl.h) and the CUDA
// runtime (cudaPointerGetAttributes): compiled only where runtime/comm/CMakeLists.txt found both
// (STRATA_HAVE_NCCL).
#include "runtime/comm/nccl_communicator.h"

#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
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

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Communicator> control,
                   c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg, int cuda_device,
                   std::function<std::string()> diagnose)
      : control_(std::move(control)),
        pg_(std::move(pg)),
        device_(torch::kCUDA, static_cast<c10::DeviceIndex>(cuda_device)),
        diagnose_(std::move(diagnose)) {}

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
    auto* in = const_cast<uint8_t*>(static_cast<const uint8_t*>(send));
    auto* out = static_cast<uint8_t*>(recv);
    const bool device_in = IsDeviceMemory(send);
    const bool device_out = IsDeviceMemory(recv);
    return Run("all_gather", bytes * static_cast<size_t>(n), [&] {
      for (size_t off = 0; off < bytes; off += kNcclChunkBytes) {
        const int64_t len = static_cast<int64_t>(std::min(kNcclChunkBytes, bytes - off));
        // The input is always a tensor of its own: it may alias this rank's block of the output.
        std::vector<at::Tensor> input = {device_in ? Wrap(in + off, len, torch::kUInt8).clone()
                                                   : ToDevice(in + off, len, torch::kUInt8)};
        at::Tensor staging;
        if (!device_out) staging = torch::empty({n, len}, Options(torch::kUInt8));
        std::vector<std::vector<at::Tensor>> outputs(1);
        for (int r = 0; r < n; ++r) {
          outputs[0].push_back(
              device_out ? Wrap(out + static_cast<size_t>(r) * bytes + off, len, torch::kUInt8)
                         : staging[r]);
        }
        pg_->allgather(outputs, input)->wait();
        Synchronize();
        if (!device_out) {
          for (int r = 0; r < n; ++r) {
            ToHost(staging[r], out + static_cast<size_t>(r) * bytes + off, len, torch::kUInt8);
          }
        }
      }
    });
  }

  Status ReduceScatterSum(const float* send, float* recv, size_t count) override {
    const int n = world_size();
    auto* in = const_cast<float*>(send);
    const bool device_in = IsDeviceMemory(send);
    const bool device_out = IsDeviceMemory(recv);
    const size_t per_chunk = kNcclChunkBytes / sizeof(float);
    return Run("reduce_scatter", count * static_cast<size_t>(n) * sizeof(float), [&] {
      for (size_t off = 0; off < count; off += per_chunk) {
        const int64_t len = static_cast<int64_t>(std::min(per_chunk, count - off));
        std::vector<std::vector<at::Tensor>> inputs(1);
        for (int r = 0; r < n; ++r) {
          float* block = in + static_cast<size_t>(r) * count + off;
          // `recv` may alias this rank's block of `send`: device inputs are copied too.
          inputs[0].push_back(device_in ? Wrap(block, len, torch::kFloat32).clone()
                                        : ToDevice(block, len, torch::kFloat32));
        }
        std::vector<at::Tensor> output = {device_out
                                              ? Wrap(recv + off, len, torch::kFloat32)
                                              : torch::empty({len}, Options(torch::kFloat32))};
        pg_->reduce_scatter(output, inputs)->wait();
        Synchronize();
        if (!device_out) ToHost(output[0], recv + off, len, torch::kFloat32);
      }
    });
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    if (!IsDeviceMemory(data)) return control_->Broadcast(data, bytes, root);
    if (root < 0 || root >= world_size()) {
      return InvalidArgumentError("Broadcast: root " + std::to_string(root) + " outside 0.." +
                                  std::to_string(world_size() - 1));
    }
    return Run("broadcast", bytes, [&] {
      for (size_t off = 0; off < bytes; off += kNcclChunkBytes) {
        const int64_t len = static_cast<int64_t>(std::min(kNcclChunkBytes, bytes - off));
        std::vector<at::Tensor> t = {Wrap(static_cast<uint8_t*>(data) + off, len, torch::kUInt8)};
        c10d::BroadcastOptions opts;
        opts.rootRank = root;
        pg_->broadcast(t, opts)->wait();
        Synchronize();
      }
    });
  }

  Status Barrier() override {
    if (!failed_.ok()) return failed_;
    return control_->Barrier();
  }

 private:
  torch::TensorOptions Options(at::ScalarType type) const {
    return torch::TensorOptions().dtype(type).device(device_);
  }
  // A tensor over memory of this rank's device.
  at::Tensor Wrap(void* p, int64_t numel, at::ScalarType type) const {
    return torch::from_blob(p, {numel}, Options(type));
  }
  // A device copy of host memory.
  at::Tensor ToDevice(void* p, int64_t numel, at::ScalarType type) const {
    at::Tensor host = torch::from_blob(p, {numel}, torch::TensorOptions().dtype(type));
    return host.to(device_);
  }
  // A device tensor's values into host memory (waits for the copy).
  static void ToHost(const at::Tensor& device, void* p, int64_t numel, at::ScalarType type) {
    torch::from_blob(p, {numel}, torch::TensorOptions().dtype(type)).copy_(device);
  }
  // The host waits for the calling thread's current stream on this device (which c10d made wait
  // for the collective), so results are in memory when a call returns.
  void Synchronize() const {
    c10::impl::VirtualGuardImpl impl(device_.type());
    impl.getStream(device_).synchronize();
  }

  Status AllReduce(void* values, size_t count, at::ScalarType type, size_t elem) {
    const bool on_device = IsDeviceMemory(values);
    const size_t per_chunk = kNcclChunkBytes / elem;
    return Run("all_reduce", count * elem, [&] {
      for (size_t off = 0; off < count; off += per_chunk) {
        const int64_t len = static_cast<int64_t>(std::min(per_chunk, count - off));
        void* p = static_cast<uint8_t*>(values) + off * elem;
        std::vector<at::Tensor> t = {on_device ? Wrap(p, len, type) : ToDevice(p, len, type)};
        pg_->allreduce(t)->wait();
        Synchronize();
        if (!on_device) ToHost(t[0], p, len, type);
      }
    });
  }

  // Runs `body` (c10d and libtorch calls), turning what it throws into a Status.
  template <typename Body>
  Status Run(const char* op, size_t bytes, Body&& body) {
    if (!failed_.ok()) return failed_;
    const std::string what = std::string(op) + " of " + FormatBytes(bytes) + " over nccl on " +
                             device_.str() + " (rank " + std::to_string(rank()) + ")";
    try {
      body();
      return Status::Ok();
    } catch (const c10::OutOfMemoryError& e) {
      failed_ =
          ResourceExhaustedError(what + ": CUDA out of memory staging the buffers (chunks of " +
                                 FormatBytes(kNcclChunkBytes) + "): " + ExceptionFirstLine(e) +
                                 "; lower --device-memory to leave libtorch more of the GPU");
    } catch (const std::exception& e) {
      failed_ = UnavailableError(what + " failed: " + diagnose_() + ": " + ExceptionFirstLine(e));
    } catch (...) {
      failed_ = UnavailableError(what + " failed: " + diagnose_() + ": unknown exception");
    }
    return failed_;
  }

  std::shared_ptr<Communicator> control_;          // Gloo: barrier, host broadcasts
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;  // destroyed before control_
  const torch::Device device_;
  std::function<std::string()> diagnose_;
  Status failed_;  // the first failure; then every call fails
};

}  // namespace

Result<std::shared_ptr<Communicator>> MakeNcclCommunicator(
    std::shared_ptr<Communicator> control, const c10::intrusive_ptr<c10d::Store>& store,
    int cuda_device, std::chrono::milliseconds timeout, std::function<std::string()> diagnose) {
  // A collective that outlives the timeout throws from wait() (then reported, with the lost
  // ranks) instead of c10d's watchdog ending the process. The names of torch 2.x and 1.x; the
  // user's own setting wins.
  ::setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
  ::setenv("NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
  const std::string where = "cuda:" + std::to_string(cuda_device) + " (rank " +
                            std::to_string(control->rank()) + " of " +
                            std::to_string(control->world_size()) + ")";
  try {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, control->rank(),
                                                          control->world_size(), options);
    return std::shared_ptr<Communicator>(std::make_shared<NcclCommunicator>(
        std::move(control), std::move(pg), cuda_device, std::move(diagnose)));
  } catch (const std::exception& e) {
    return UnavailableError("creating the nccl process group on " + where +
                            " failed: " + ExceptionFirstLine(e));
  }
}

}  // namespace strata::runtime
