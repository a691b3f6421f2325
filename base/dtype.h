// DType: the one element-type enum of strata's flat state buffers (ARCHITECTURE.md §1, §2).
//
// fp32 holds master weights, Adam moments and accumulated gradients; fp16/bf16 hold the compute
// copy of parameters, produced gradients and (optionally) bf16 moments. The CPU optimizer
// (cpu_optimizer/, which also owns the scalar fp16/bf16 conversions) and the CUDA kernels (gpu/)
// both take this type, so a buffer described once is read the same way on either side.
//
// This header is also compiled by nvcc as C++17 (gpu/kernels.cu): keep it free of C++20.
// Thread-safety: pure functions over constants.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace strata {

enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16 };

// "fp32", "fp16", "bf16": DeepSpeed's spelling, used in flags, JSON reports and errors.
constexpr std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
  }
  return "unknown";
}

// Bytes per element: 4 or 2.
constexpr size_t DTypeBytes(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// Accepts "fp32"/"float32"/"float", "fp16"/"float16"/"half", "bf16"/"bfloat16"; anything else is
// kInvalidArgument naming the text and the accepted names.
Result<DType> ParseDType(std::string_view text);

}  // namespace strata
