// ISA detection and the STRATA_CPU_ISA override (see isa.h).
#include "cpu_optimizer/isa.h"

#include <cstdlib>
#include <string>

#include "base/env.h"
#include "cpu_optimizer/internal/kernel_table.h"

namespace strata::cpu_optimizer {

std::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAuto:
      return "auto";
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

Result<Isa> ParseIsa(std::string_view text) {
  if (text == "auto") return Isa::kAuto;
  if (text == "scalar") return Isa::kScalar;
  if (text == "avx2") return Isa::kAvx2;
  if (text == "avx512") return Isa::kAvx512;
  return InvalidArgumentError("unknown ISA '" + std::string(text) +
                              "' (expected auto, avx512, avx2 or scalar)");
}

bool IsaSupported(Isa isa) {
  switch (isa) {
    case Isa::kAuto:
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
#if STRATA_CPU_OPT_X86
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
#else
      return false;
#endif
    case Isa::kAvx512:
#if STRATA_CPU_OPT_X86
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
      return false;
#endif
  }
  return false;
}

Isa BestIsa() {
  if (IsaSupported(Isa::kAvx512)) return Isa::kAvx512;
  if (IsaSupported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

Result<Isa> ResolveIsa(Isa requested) {
  if (requested == Isa::kAuto) {
    const char* env = GetEnv("STRATA_CPU_ISA");
    if (env != nullptr && *env != '\0') {
      Result<Isa> parsed = ParseIsa(env);
      if (!parsed.ok()) return parsed.status().WithContext("STRATA_CPU_ISA");
      requested = *parsed;
    }
  }
  if (requested == Isa::kAuto) return BestIsa();
  if (!IsaSupported(requested)) {
    return UnavailableError("CPU ISA '" + std::string(IsaName(requested)) +
                            "' is not supported by this CPU or build (best available: " +
                            std::string(IsaName(BestIsa())) + ")");
  }
  return requested;
}

namespace internal {

const KernelTable& TableFor(Isa isa) {
  switch (isa) {
#if STRATA_CPU_OPT_X86
    case Isa::kAvx512:
      return Avx512Table();
    case Isa::kAvx2:
      return Avx2Table();
#endif
    default:
      return ScalarTable();
  }
}

}  // namespace internal
}  // namespace strata::cpu_optimizer
