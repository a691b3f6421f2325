// CudaDevice. Every CUDA call is checked and turned into a kCudaError Status that names the call
// and the error string; nothing throws. Host functions go through cudaLaunchHostFunc with a
// heap-allocated std::function; the trampoline hands it to the device's callback thread and waits
// for it to finish there, so the stream still moves on only after the function has run.
#include "gpu/cuda_device.h"

#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "base/bytes.h"
#include "base/logging.h"

namespace strata {
namespace {

Status CudaError(cudaError_t err, std::string_view what) {
  return Status(StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(err) +
                                            " (cuda error " +
                                            std::to_string(static_cast<int>(err)) + ")");
}

#define STRATA_CUDA_RETURN_IF_ERROR(call)                                           \
  do {                                                                              \
    cudaError_t strata_cuda_err_ = (call);                                          \
    if (strata_cuda_err_ != cudaSuccess) return CudaError(strata_cuda_err_, #call); \
  } while (0)

class CudaStream final : public Stream {
 public:
  CudaStream(std::string name, cudaStream_t s, int ordinal)
      : name_(std::move(name)), stream_(s), ordinal_(ordinal) {}
  ~CudaStream() override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);  // the contract: destruction waits for queued work
    cudaStreamDestroy(stream_);
  }
  std::string_view name() const override { return name_; }
  void* native_handle() const override { return stream_; }
  cudaStream_t get() const { return stream_; }

 private:
  std::string name_;
  cudaStream_t stream_;
  int ordinal_;
};

class CudaEventState final : public EventState {
 public:
  explicit CudaEventState(cudaEvent_t e) : event_(e) {}
  ~CudaEventState() override { cudaEventDestroy(event_); }
  bool Query() const override { return cudaEventQuery(event_) != cudaErrorNotReady; }
  Status Wait() const override {
    cudaError_t err = cudaEventSynchronize(event_);
    return err == cudaSuccess ? Status::Ok() : CudaError(err, "cudaEventSynchronize");
  }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_;
};

CudaStream& AsCuda(Stream& s) { return static_cast<CudaStream&>(s); }

struct HostFunc {
  CudaDevice* device;
  std::function<void()> fn;
};

// Runs on CUDA's callback thread, where CUDA calls are not allowed: hands the function to the
// device's callback thread and waits for it there (cudaLaunchHostFunc's ordering: later work on
// the stream starts after the function returns).
void CUDART_CB RunHostFunc(void* user) {
  auto* f = static_cast<HostFunc*>(user);
  Mutex mu;
  CondVar cv;
  bool done = false;  // guarded by mu
  f->device->PostCallback([&] {
    f->fn();
    MutexLock lock(&mu);
    done = true;
    cv.Signal();
  });
  MutexLock lock(&mu);
  while (!done) cv.Wait(&mu);
  delete f;
}

}  // namespace

bool IsNoGpuError(int cuda_error) {
  return cuda_error == cudaErrorStubLibrary || cuda_error == cudaErrorInsufficientDriver ||
         cuda_error == cudaErrorNoDevice;
}

Result<std::unique_ptr<CudaDevice>> CudaDevice::Open(const CudaDeviceOptions& options) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    Status s = CudaError(err, "cudaGetDeviceCount");
    if (IsNoGpuError(err)) return UnavailableError("no usable GPU: " + std::string(s.message()));
    return s;
  }
  if (options.ordinal < 0 || options.ordinal >= count) {
    return UnavailableError("GPU " + std::to_string(options.ordinal) + " requested but " +
                            std::to_string(count) + " present");
  }
  STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.ordinal));
  cudaDeviceProp prop{};
  STRATA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options.ordinal));
  size_t free_bytes = 0, total_bytes = 0;
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));

  // Keep freed pool memory cached for reuse instead of releasing it at every sync.
  cudaMemPool_t pool;
  STRATA_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, options.ordinal));
  uint64_t threshold = UINT64_MAX;
  STRATA_CUDA_RETURN_IF_ERROR(
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));

  cudaStream_t alloc_stream;
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&alloc_stream, cudaStreamNonBlocking));

  DeviceInfo info;
  info.name = prop.name;
  info.total_bytes = total_bytes;
  info.budget_bytes =
      options.budget_bytes != 0 ? options.budget_bytes : static_cast<uint64_t>(free_bytes * 0.9);
  if (info.budget_bytes > free_bytes) {
    cudaStreamDestroy(alloc_stream);
    return ResourceExhaustedError("GPU budget of " + FormatBytes(info.budget_bytes) +
                                  " exceeds the free device memory " + FormatBytes(free_bytes) +
                                  " on " + info.name);
  }
  return std::unique_ptr<CudaDevice>(new CudaDevice(options.ordinal, info, alloc_stream));
}

CudaDevice::CudaDevice(int ordinal, DeviceInfo info, void* alloc_stream)
    : ordinal_(ordinal), info_(std::move(info)), alloc_stream_(alloc_stream) {
  callback_thread_ = std::thread([this] { CallbackLoop(); });
}

void CudaDevice::PostCallback(std::function<void()> fn) {
  {
    MutexLock lock(&callback_mu_);
    callbacks_.push_back(std::move(fn));
  }
  callback_cv_.Signal();
}

void CudaDevice::CallbackLoop() {
  cudaSetDevice(ordinal_);
  MutexLock lock(&callback_mu_);
  while (true) {
    while (!stopping_ && callbacks_.empty()) callback_cv_.Wait(&callback_mu_);
    if (callbacks_.empty()) return;  // stopping, and everything posted has run
    std::function<void()> fn = std::move(callbacks_.front());
    callbacks_.pop_front();
    lock.Unlock();
    fn();
    lock.Lock();
  }
}

CudaDevice::~CudaDevice() {
  // Work queued on streams has completed (streams wait for it when destroyed, and they must not
  // outlive the device), so every host function has been posted: run them out, then stop.
  {
    MutexLock lock(&callback_mu_);
    stopping_ = true;
  }
  callback_cv_.Signal();
  callback_thread_.join();
  cudaSetDevice(ordinal_);
  cudaStreamSynchronize(static_cast<cudaStream_t>(alloc_stream_));
  cudaStreamDestroy(static_cast<cudaStream_t>(alloc_stream_));
  if (used_bytes() != 0) {
    STRATA_LOG(kError) << "CudaDevice destroyed with " << FormatBytes(used_bytes())
                       << " still allocated";
  }
}

Result<void*> CudaDevice::AllocateRaw(uint64_t bytes) {
  MutexLock lock(&alloc_mu_);
  const uint64_t used = used_.load();
  if (bytes > info_.budget_bytes || used > info_.budget_bytes - bytes) {
    return ResourceExhaustedError("GPU allocation of " + FormatBytes(bytes) +
                                  " exceeds the budget: " + FormatBytes(used) + " of " +
                                  FormatBytes(info_.budget_bytes) + " in use on " + info_.name);
  }
  STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  auto s = static_cast<cudaStream_t>(alloc_stream_);
  void* p = nullptr;
  STRATA_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&p, bytes, s));
  // Other streams may use the memory at once: make the allocation complete before returning.
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  used_.store(used + bytes);
  if (used + bytes > peak_.load()) peak_.store(used + bytes);
  return p;
}

void CudaDevice::FreeRaw(void* ptr, uint64_t bytes) {
  cudaSetDevice(ordinal_);
  cudaError_t err = cudaFreeAsync(ptr, static_cast<cudaStream_t>(alloc_stream_));
  if (err != cudaSuccess) STRATA_LOG(kError) << CudaError(err, "cudaFreeAsync").ToString();
  MutexLock lock(&alloc_mu_);
  used_.fetch_sub(bytes);
}

Result<std::unique_ptr<Stream>> CudaDevice::CreateStream(std::string_view name) {
  STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  cudaStream_t s;
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return std::unique_ptr<Stream>(std::make_unique<CudaStream>(std::string(name), s, ordinal_));
}

Status CudaDevice::CopyAsync(void* dst, const void* src, uint64_t bytes, CopyKind kind,
                             Stream& stream) {
  if (bytes == 0) return Status::Ok();
  const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                             : cudaMemcpyDeviceToDevice;
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, k, AsCuda(stream).get()));
  return Status::Ok();
}

Status CudaDevice::LaunchHostFunc(Stream& stream, std::function<void()> fn) {
  auto* heap = new HostFunc{this, std::move(fn)};
  cudaError_t err = cudaLaunchHostFunc(AsCuda(stream).get(), RunHostFunc, heap);
  if (err != cudaSuccess) {
    delete heap;
    return CudaError(err, "cudaLaunchHostFunc");
  }
  return Status::Ok();
}

Result<Event> CudaDevice::RecordEvent(Stream& stream) {
  cudaEvent_t e;
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  auto state = std::make_shared<CudaEventState>(e);
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(e, AsCuda(stream).get()));
  return Event(std::move(state));
}

Status CudaDevice::StreamWaitEvent(Stream& stream, const Event& event) {
  if (event.state() == nullptr) return Status::Ok();
  const auto* state = dynamic_cast<const CudaEventState*>(event.state());
  if (state == nullptr) return InvalidArgumentError("StreamWaitEvent: event is not a CUDA event");
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(AsCuda(stream).get(), state->get(), 0));
  return Status::Ok();
}

Status CudaDevice::Synchronize(Stream& stream) {
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(AsCuda(stream).get()));
  return Status::Ok();
}

Status CudaDevice::RegisterHost(void* ptr, uint64_t bytes) {
  STRATA_CUDA_RETURN_IF_ERROR(cudaHostRegister(ptr, bytes, cudaHostRegisterDefault));
  return Status::Ok();
}

Status CudaDevice::UnregisterHost(void* ptr) {
  STRATA_CUDA_RETURN_IF_ERROR(cudaHostUnregister(ptr));
  return Status::Ok();
}

void* CudaStreamHandle(Stream& stream) { return AsCuda(stream).get(); }

}  // namespace strata
