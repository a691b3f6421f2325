// Internal: the per-ISA kernel table. Each of kernels_{scalar,avx2,avx512}.cc builds one table from
// the templates in kernels_impl.h; optimizer.cc and bandwidth.cc pick a table (TableFor) and split
// the work over threads (parallel.h). Every function here works on one contiguous element range
// [begin, end) of flat buffers and is safe to call concurrently on disjoint ranges.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu_optimizer/isa.h"

namespace strata::cpu_optimizer::internal {

// The element-wise update a step kernel runs. The kPattern* kernels are the bandwidth ceilings of
// bandwidth.h: the same loads and stores as the optimizer they shadow, with x = g*0 + x for x in
// p, m, v instead of the optimizer math.
enum class KernelKind : int {
  kAdam = 0,     // Adam (L2 when `l2`) and AdamW (decoupled decay via `decay`)
  kAdagrad,      // uses v (state sum) only
  kLion,         // uses m only
  kPatternAdam,  // reads p, m, v, g; writes p, m, v (+ copy-out)
  kPatternAdagrad,
  kPatternLion,
};
inline constexpr int kNumKernelKinds = 6;
inline constexpr int kNumGradTypes = 3;    // DType: fp32, fp16, bf16
inline constexpr int kNumMomentTypes = 2;  // 0 fp32, 1 bf16
inline constexpr int kNumCopyOuts = 3;     // 0 none, 1 fp16, 2 bf16
inline constexpr int kNumStepFns = kNumKernelKinds * kNumGradTypes * kNumMomentTypes * kNumCopyOuts;

constexpr int StepIndex(int kind, int grad, int moment, int copy_out) {
  return ((kind * kNumGradTypes + grad) * kNumMomentTypes + moment) * kNumCopyOuts + copy_out;
}

// Per-call constants, already rounded to float (as PyTorch rounds its double hyper-parameters
// when it applies them to a float tensor).
struct KernelParams {
  float grad_scale = 1.0f;  // multiplies every gradient first (unscale, clip, maximize sign)
  float beta1 = 0.0f, beta2 = 0.0f;
  float one_minus_beta1 = 0.0f, one_minus_beta2 = 0.0f;
  float eps = 0.0f;
  float weight_decay = 0.0f;   // L2 coefficient, used when l2
  float decay = 1.0f;          // p *= decay before the update (decoupled weight decay)
  float neg_step_size = 0.0f;  // Adam: -lr/bias1; Adagrad: -lr/(1+(step-1)*lr_decay); Lion: -lr
  float sqrt_bias2 = 1.0f;     // Adam: sqrt(1 - beta2^step)
  bool l2 = false;             // Adam, Adagrad: g += weight_decay * p
};

struct KernelBuffers {
  float* p = nullptr;
  void* m = nullptr;  // float* or uint16_t* (bf16)
  void* v = nullptr;
  const void* g = nullptr;
  void* out = nullptr;  // uint16_t* (fp16 or bf16) copy of the updated p
};

using StepRangeFn = void (*)(const KernelParams&, const KernelBuffers&, size_t begin, size_t end);
using SumSquaresFn = double (*)(const void* g, size_t begin, size_t end);
using NonFiniteFn = bool (*)(const void* g, size_t begin, size_t end);
using TriadFn = void (*)(float* a, const float* b, const float* c, float s, size_t begin,
                         size_t end);
using ConvertFn = void (*)(const void* src, void* dst, size_t n);

struct KernelTable {
  Isa isa = Isa::kScalar;
  StepRangeFn step[kNumStepFns] = {};
  SumSquaresFn sum_squares[kNumGradTypes] = {};
  NonFiniteFn has_non_finite[kNumGradTypes] = {};
  TriadFn triad = nullptr;
  // The kernels' own vector conversions, exposed for the exhaustive conversion tests.
  ConvertFn f32_to_f16 = nullptr, f16_to_f32 = nullptr, f32_to_bf16 = nullptr,
            bf16_to_f32 = nullptr;
};

const KernelTable& ScalarTable();
#if STRATA_CPU_OPT_X86
const KernelTable& Avx2Table();
const KernelTable& Avx512Table();
#endif
// REQUIRES: IsaSupported(isa), isa != kAuto.
const KernelTable& TableFor(Isa isa);

}  // namespace strata::cpu_optimizer::internal
