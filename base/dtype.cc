#include "base/dtype.h"

#include <string>

namespace strata {

Result<DType> ParseDType(std::string_view text) {
  if (text == "fp32" || text == "float32" || text == "float") return DType::kFloat32;
  if (text == "fp16" || text == "float16" || text == "half") return DType::kFloat16;
  if (text == "bf16" || text == "bfloat16") return DType::kBFloat16;
  return InvalidArgumentError("unknown dtype '" + std::string(text) +
                              "' (expected fp32, fp16 or bf16)");
}

}  // namespace strata
