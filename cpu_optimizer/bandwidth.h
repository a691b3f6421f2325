// Memory-bandwidth ceilings for the CPU optimizer, measured with the optimizer's own ISA, threads
// and chunking, so that `strata bench adam` can report the kernel as a fraction of what the memory
// system allows:
//
//  - AdamPatternPass: the exact loads and stores of CpuOptimizer::Step for a span (read p, m, v, g,
//    write p, m, v in place, plus the copy-out with the same non-temporal stores), with the update
//    replaced by p, m, v += g. In-place rewrites pay no write-allocate, so this ceiling is higher
//    than STREAM's triad; an optimizer kernel cannot beat it, only match it.
//  - Triad: STREAM's a[i] = b[i] + s*c[i] with normal stores. Counted as STREAM counts it,
//    24 B/element (the write-allocate read of a is real traffic but not counted).
//
// Buffers are the caller's; both functions overwrite their outputs with meaningless values.
// Thread-safety as CpuOptimizer::Step.
#pragma once

#include <cstddef>

#include "base/status.h"
#include "cpu_optimizer/isa.h"
#include "cpu_optimizer/optimizer.h"

namespace strata::cpu_optimizer {

inline constexpr size_t kTriadBytesPerElement = 24;

// One pass of the memory pattern of `type`'s Step() over `span` (same buffers and dtypes rules).
// Bytes moved per element: CpuOptimizer::BytesPerElement for the span.
Status AdamPatternPass(OptimizerType type, const FlatSpan& span, int threads = 0,
                       Isa isa = Isa::kAuto);

// a[i] = b[i] + scalar * c[i] for i < n. REQUIRES: a, b, c do not overlap.
Status Triad(float* a, const float* b, const float* c, float scalar, size_t n, int threads = 0,
             Isa isa = Isa::kAuto);

}  // namespace strata::cpu_optimizer
