// Memory-bandwidth ceilings for the CPU optimizer, measured with the optimizer's own ISA, threads
// and chunking, so that `strata bench adam` can report the kernel as a fraction of what the memory
// system allows:
//
//  - AdamPatternPass: the exact loads and stores of CpuOptimizer::Step for a span (read p, m, v, g,
//    write p, m, v in place, plus the copy-out with the same non-temporal stores), with the update
//    replaced by x = g*0 + x for x in p, m, v (finite values come back unchanged, so passes can be
//    interleaved with real steps on the same buffers). In-place rewrites pay no write-allocate, so
//    on most machines this ceiling is above STREAM's triad; an optimizer kernel can only match it.
//  - Triad: STREAM's a[i] = b[i] + s*c[i] with normal stores. Counted as STREAM counts it,
//    24 B/element (the write-allocate read of a is real traffic but not counted).
//
// Buffers are the caller's; Triad overwrites `a`, AdamPatternPass rewrites p, m, v in place (and
// fills the copy-out).
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
