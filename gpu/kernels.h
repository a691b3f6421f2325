// CUDA kernels for the device side of the engine, behind host launchers with no CUDA types.
//
// Not used by the engine yet (only tests/gpu/cuda_device_test.cc calls them): on a GPU the engine
// computes through libtorch, whose casts and reductions do this work today. They are kept, tested,
// for the device-home groups' overflow check and gradient norm on the GPU (issue 28's remainder),
// where one fused pass over a flat block beats libtorch's per-tensor calls. Until a caller lands,
// a change here needs only its test.
//
// Every launcher enqueues its kernel on `stream` (a cudaStream_t as void*, from CudaStreamHandle)
// and returns at once; results are valid once an event recorded after it completes. Pointers are
// device pointers. Element counts may be any size (grid-stride loops), 0 included.
// Roundings: fp32 -> bf16 and fp32 -> fp16 round to nearest even; NaN stays NaN.
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "base/status.h"

namespace strata::gpu {

// dst[i] = convert(src[i]) between any two of fp32/fp16/bf16.
Status Cast(const void* src, DType src_type, void* dst, DType dst_type, uint64_t n, void* stream);

// g[i] *= multiplier in place (fp32), and sets *found_nonfinite (a device int, not reset here) to 1
// if any g[i], before or after scaling, is inf or NaN. Used for loss-scale unscaling.
Status UnscaleAndCheck(float* g, uint64_t n, float multiplier, int* found_nonfinite, void* stream);

// *sum_sq (a device double, not reset here) += sum of x[i]^2, accumulated in double.
Status AddSumOfSquares(const void* x, DType type, uint64_t n, double* sum_sq, void* stream);

// acc[i] += scale * g[i]: gradient accumulation across micro-batches into fp32.
Status Accumulate(float* acc, const void* g, DType type, uint64_t n, float scale, void* stream);

}  // namespace strata::gpu
