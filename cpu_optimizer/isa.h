// Which instruction set the CPU optimizer kernels run with.
//
// Every kernel is compiled three times, one translation unit per instruction set (see
// cpu_optimizer/internal/kernels_impl.h): AVX-512 (F/BW/VL/DQ + FMA + F16C), AVX2 (+FMA + F16C) and
// portable scalar C++. Nothing is chosen at build time: SelectIsa() picks the best one the running
// CPU supports (__builtin_cpu_supports), unless the environment variable STRATA_CPU_ISA says
// otherwise:
//
//   STRATA_CPU_ISA=avx512|avx2|scalar   force one (an ISA this CPU lacks is an error, not a
//   fallback) STRATA_CPU_ISA=auto or unset        the best supported
//
// The scalar kernels are the test oracle: all three produce bit-identical optimizer updates and
// conversions (the math is the same sequence of IEEE-rounded operations, fused multiply-adds
// included); reductions (SumOfSquares) differ only in summation order.
//
// Thread-safety: all functions are thread-safe.
#pragma once

#include <string_view>

#include "base/status.h"

namespace strata::cpu_optimizer {

enum class Isa { kAuto, kScalar, kAvx2, kAvx512 };

// "auto", "scalar", "avx2", "avx512".
std::string_view IsaName(Isa isa);
// Parses the names above. Unknown names are InvalidArgument.
Result<Isa> ParseIsa(std::string_view text);

// True when this build has kernels for `isa` and the running CPU can execute them (kAuto: true).
bool IsaSupported(Isa isa);
// The best ISA this CPU supports (never kAuto).
Isa BestIsa();

// Resolves `requested`: kAuto means STRATA_CPU_ISA if set, else BestIsa(). Returns Unavailable when
// the requested (or environment-forced) ISA cannot run here, InvalidArgument when STRATA_CPU_ISA
// holds an unknown name. Never returns kAuto.
Result<Isa> ResolveIsa(Isa requested = Isa::kAuto);

}  // namespace strata::cpu_optimizer
