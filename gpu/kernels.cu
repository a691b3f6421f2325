// Grid-stride elementwise kernels and a block-reduced sum of squares. Launch shapes: 256 threads
// per block, at most 4096 blocks (enough to fill an H100 with grid-stride loops).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "gpu/kernels.h"

namespace strata::gpu {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(uint64_t n) {
  uint64_t b = (n + kThreads - 1) / kThreads;
  if (b > 4096) b = 4096;
  return b == 0 ? 1u : static_cast<unsigned>(b);
}

Status LaunchStatus(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(err) +
                                            " (cuda error " + std::to_string(int(err)) + ")");
}

__device__ __forceinline__ float Load(const float* p, uint64_t i) { return p[i]; }
__device__ __forceinline__ float Load(const __half* p, uint64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float Load(const __nv_bfloat16* p, uint64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void Store(float* p, uint64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void Store(__half* p, uint64_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void Store(__nv_bfloat16* p, uint64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

template <typename S, typename D>
__global__ void CastKernel(const S* src, D* dst, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x) {
    Store(dst, i, Load(src, i));
  }
}

__global__ void UnscaleKernel(float* g, uint64_t n, float multiplier, int* found) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x) {
    const float x = g[i];
    const float y = x * multiplier;
    if (!isfinite(x) || !isfinite(y)) *found = 1;  // benign race: every writer writes 1
    g[i] = y;
  }
}

template <typename T>
__global__ void SumSqKernel(const T* x, uint64_t n, double* out) {
  __shared__ double partial[kThreads];
  double acc = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x) {
    const double v = Load(x, i);
    acc += v * v;
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, partial[0]);
}

template <typename T>
__global__ void AccumulateKernel(float* acc, const T* g, uint64_t n, float scale) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x) {
    acc[i] += scale * Load(g, i);
  }
}

// Calls f(typed pointer) for the runtime dtype.
template <typename F>
void WithType(const void* p, DType t, F&& f) {
  switch (t) {
    case DType::kFloat32:
      f(static_cast<const float*>(p));
      break;
    case DType::kFloat16:
      f(static_cast<const __half*>(p));
      break;
    case DType::kBFloat16:
      f(static_cast<const __nv_bfloat16*>(p));
      break;
  }
}

template <typename F>
void WithMutableType(void* p, DType t, F&& f) {
  switch (t) {
    case DType::kFloat32:
      f(static_cast<float*>(p));
      break;
    case DType::kFloat16:
      f(static_cast<__half*>(p));
      break;
    case DType::kBFloat16:
      f(static_cast<__nv_bfloat16*>(p));
      break;
  }
}

}  // namespace

Status Cast(const void* src, DType src_type, void* dst, DType dst_type, uint64_t n, void* stream) {
  if (n == 0) return Status::Ok();
  auto s = static_cast<cudaStream_t>(stream);
  WithType(src, src_type, [&](auto* in) {
    WithMutableType(dst, dst_type,
                    [&](auto* out) { CastKernel<<<Blocks(n), kThreads, 0, s>>>(in, out, n); });
  });
  return LaunchStatus("cast kernel");
}

Status UnscaleAndCheck(float* g, uint64_t n, float multiplier, int* found_nonfinite, void* stream) {
  if (n == 0) return Status::Ok();
  UnscaleKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(g, n, multiplier,
                                                                               found_nonfinite);
  return LaunchStatus("unscale kernel");
}

Status AddSumOfSquares(const void* x, DType type, uint64_t n, double* sum_sq, void* stream) {
  if (n == 0) return Status::Ok();
  auto s = static_cast<cudaStream_t>(stream);
  WithType(x, type, [&](auto* in) { SumSqKernel<<<Blocks(n), kThreads, 0, s>>>(in, n, sum_sq); });
  return LaunchStatus("sum-of-squares kernel");
}

Status Accumulate(float* acc, const void* g, DType type, uint64_t n, float scale, void* stream) {
  if (n == 0) return Status::Ok();
  auto s = static_cast<cudaStream_t>(stream);
  WithType(g, type,
           [&](auto* in) { AccumulateKernel<<<Blocks(n), kThreads, 0, s>>>(acc, in, n, scale); });
  return LaunchStatus("accumulate kernel");
}

}  // namespace strata::gpu
