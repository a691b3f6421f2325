// Bandwidth ceilings (see bandwidth.h): the kPattern* kernels and the triad of the ISA's table,
// run through the same ParallelChunks as CpuOptimizer::Step.
#include "cpu_optimizer/bandwidth.h"

#include "cpu_optimizer/internal/kernel_table.h"
#include "cpu_optimizer/internal/parallel.h"
#include "cpu_optimizer/internal/span.h"

namespace strata::cpu_optimizer {

Status AdamPatternPass(OptimizerType type, const FlatSpan& span, int threads, Isa isa) {
  STRATA_RETURN_IF_ERROR(internal::CheckSpan(type, span));
  STRATA_ASSIGN_OR_RETURN(const Isa resolved, ResolveIsa(isa));
  internal::KernelKind kind = internal::KernelKind::kPatternAdam;
  if (type == OptimizerType::kAdagrad) kind = internal::KernelKind::kPatternAdagrad;
  if (type == OptimizerType::kLion) kind = internal::KernelKind::kPatternLion;
  const internal::StepRangeFn fn =
      internal::TableFor(resolved).step[internal::StepIndexFor(kind, span)];
  const internal::KernelParams k;
  const internal::KernelBuffers b = internal::BuffersOf(span);
  internal::ParallelChunks(threads, span.numel,
                           [&](size_t begin, size_t end) { fn(k, b, begin, end); });
  return Status::Ok();
}

Status Triad(float* a, const float* b, const float* c, float scalar, size_t n, int threads,
             Isa isa) {
  if (n == 0) return Status::Ok();
  if (a == nullptr || b == nullptr || c == nullptr)
    return InvalidArgumentError("Triad: null array");
  STRATA_ASSIGN_OR_RETURN(const Isa resolved, ResolveIsa(isa));
  const internal::TriadFn fn = internal::TableFor(resolved).triad;
  internal::ParallelChunks(threads, n,
                           [&](size_t begin, size_t end) { fn(a, b, c, scalar, begin, end); });
  return Status::Ok();
}

}  // namespace strata::cpu_optimizer
