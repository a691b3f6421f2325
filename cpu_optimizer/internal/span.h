// Internal: helpers shared by optimizer.cc and bandwidth.cc to turn a FlatSpan into kernel calls.
#pragma once

#include "base/status.h"
#include "cpu_optimizer/internal/kernel_table.h"
#include "cpu_optimizer/optimizer.h"

namespace strata::cpu_optimizer::internal {

// InvalidArgument when `span` lacks (or has superfluous) buffers or dtypes `type` cannot use.
Status CheckSpan(OptimizerType type, const FlatSpan& span);
KernelBuffers BuffersOf(const FlatSpan& span);
// Index into KernelTable::step for `kind` and the span's grad/moment/copy-out dtypes.
int StepIndexFor(KernelKind kind, const FlatSpan& span);

}  // namespace strata::cpu_optimizer::internal
