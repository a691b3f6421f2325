// Fused CPU optimizers over flat host buffers: Adam, AdamW, Adagrad and Lion.
//
// When optimizer state lives in pinned host RAM or on NVMe, every training step streams all of it
// through the CPU, so the step is bound by memory bandwidth, not arithmetic. Step() therefore makes
// exactly one pass per element: it reads the gradient (fp32, fp16 or bf16) and p, m, v, updates
// them in fp32, writes p, m, v back in place and, optionally, writes the updated parameter rounded
// to fp16/bf16 into a separate copy-out buffer (e.g. the pinned staging buffer for the GPU copy).
// fp32 AdamW with fp32 gradients moves 28 bytes per element (reads p m v g, writes p m v); bf16
// moments cut that to 20, bf16 gradients to 18; a 16-bit copy-out adds 2.
//
// Semantics are PyTorch's (libtorch 1.13, torch.optim), per element, in fp32:
//   g = grad * grad_scale  (grad_scale folds loss-scale unscaling and clipping; negated if
//   maximize) Adam:    g += wd*p;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
//            p += -(lr/bias1) * m / (sqrt(v)/sqrt(bias2) + eps)     bias_i = 1 - b_i^step
//   AdamW:   p *= 1 - lr*wd;  then as Adam without the g += wd*p
//   Adagrad: g += wd*p;  v += g*g;  p += -clr * g / (sqrt(v) + eps),  clr =
//   lr/(1+(step-1)*lr_decay) Lion:    p *= 1 - lr*wd;  p += -lr * sign(b1*m + (1-b1)*g);  m = b2*m
//   + (1-b2)*g
// bias_correction=false sets bias1 = bias2 = 1 (Adam/AdamW). Hyper-parameters are computed in
// double and rounded to float once per call, as PyTorch does. amsgrad is refused.
// Moments may be stored as bf16 (rounded to nearest even after each update, math in fp32): half the
// state traffic, at some accuracy cost (tests/cpu_optimizer/bf16_moments_test.cc reports it).
//
// Ownership: the caller owns every buffer; nothing is allocated or retained per step. The step
// counter is the caller's (pass the 1-based step; the kernel keeps no state between calls).
//
// Threads: each call splits the elements into contiguous chunks and runs them on a TBB task_arena
// with `threads` slots (the calling thread is one of them); small spans (< 128K elements) run on
// the calling thread alone. libtorch's intra-op pool (OpenMP) is separate: both pools want the same
// cores, so strata runs them in different phases (the optimizer step never overlaps a torch op)
// and sizes both explicitly (torch::set_num_threads and `threads` here) instead of letting each
// assume the whole machine. Under OMP_WAIT_POLICY=active, idle OpenMP threads spin and steal the
// cores this kernel needs: keep libgomp's default (spin briefly, then sleep) or set it passive.
// A CpuOptimizer is immutable after Create(); Step() may be called from any thread, and
// concurrently on disjoint buffers.
//
// Instruction sets: see isa.h (STRATA_CPU_ISA). Results are bit-identical across ISAs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "base/dtype.h"
#include "base/status.h"
#include "cpu_optimizer/convert.h"
#include "cpu_optimizer/isa.h"

namespace strata::cpu_optimizer {

enum class OptimizerType { kAdam, kAdamW, kAdagrad, kLion };

// The moments an optimizer keeps per element, as its kernels (internal/kernels_impl.h) define them:
// Adam/AdamW m and v (2); Adagrad the sum of squares, Lion m (1). The one home of this count: the
// engine's state blocks (engine/engine_layout.h) and `strata estimate` both size state from it.
constexpr int MomentCount(OptimizerType type) {
  return (type == OptimizerType::kAdam || type == OptimizerType::kAdamW) ? 2 : 1;
}

// Bytes of optimizer state per parameter element: the fp32 master (4, unless it lives elsewhere)
// plus MomentCount moments of `moment_bytes` each (4 fp32; 2 with bf16.bf16_optimizer_states).
constexpr uint64_t StateBytesPerElement(int moments, uint64_t moment_bytes,
                                        bool master_elsewhere = false) {
  return (master_elsewhere ? 0 : 4) + static_cast<uint64_t>(moments) * moment_bytes;
}

// "adam", "adamw", "adagrad", "lion".
std::string_view OptimizerTypeName(OptimizerType type);
Result<OptimizerType> ParseOptimizerType(std::string_view text);

struct OptimizerOptions {
  OptimizerType type = OptimizerType::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;           // Lion: the interpolation beta of the update direction
  double beta2 = 0.999;         // Lion: the momentum decay
  double eps = 1e-8;            // Adam, AdamW, Adagrad (outside the square root); unused by Lion
  double weight_decay = 0.0;    // L2 for Adam and Adagrad, decoupled for AdamW and Lion
  bool bias_correction = true;  // Adam, AdamW
  bool maximize = false;
  double lr_decay = 0.0;                   // Adagrad only
  double initial_accumulator_value = 0.0;  // Adagrad only (see InitState)
  bool amsgrad = false;                    // not supported: Validate() refuses it
  int threads = 0;                         // 0: every core this process may use
  Isa isa = Isa::kAuto;                    // kAuto: STRATA_CPU_ISA, else the best available

  // PyTorch's defaults for `type` (AdamW: weight_decay 1e-2; Adagrad: lr 1e-2, eps 1e-10;
  // Lion: lr 1e-4, betas (0.9, 0.99)).
  static OptimizerOptions Defaults(OptimizerType type);

  // InvalidArgument naming the offending option: negative or non-finite lr/eps/weight_decay,
  // betas outside [0, 1), negative threads, amsgrad, Adagrad-only options on other optimizers.
  Status Validate() const;
};

// One flat partition of parameters and its optimizer state. All pointers may be unaligned; the
// buffers must not overlap one another. Unused pointers must be null.
struct FlatSpan {
  size_t numel = 0;
  float* params = nullptr;     // fp32 master parameters, updated in place
  void* exp_avg = nullptr;     // m: Adam, AdamW, Lion (null for Adagrad)
  void* exp_avg_sq = nullptr;  // v: Adam, AdamW; the state sum for Adagrad (null for Lion)
  DType moment_dtype = DType::kFloat32;     // kFloat32 (float*) or kBFloat16 (uint16_t*)
  const void* grads = nullptr;              // read only
  DType grad_dtype = DType::kFloat32;       // fp32, fp16 or bf16
  void* copy_out = nullptr;                 // optional: receives the updated params, rounded
  DType copy_out_dtype = DType::kBFloat16;  // kFloat16 or kBFloat16 (round to nearest even)
};

struct StepArgs {
  int64_t step = 1;          // 1-based step number of this update (bias correction, lr_decay)
  double grad_scale = 1.0;   // every gradient is multiplied by this first; must be finite
  std::optional<double> lr;  // this step's learning rate (a scheduler's); default options.lr
};

class CpuOptimizer {
 public:
  // Validates `options` and resolves the ISA (Unavailable if a forced one cannot run here).
  static Result<CpuOptimizer> Create(const OptimizerOptions& options);

  // One optimizer step over `span`. InvalidArgument (and nothing written) when a required buffer
  // is null, a dtype is not allowed, step < 1, or grad_scale/lr is not finite. The result does
  // not depend on `threads` or on the ISA.
  Status Step(const FlatSpan& span, const StepArgs& args) const;

  // Fills the state of a fresh span: m = 0, v = 0 (Adagrad: initial_accumulator_value).
  Status InitState(const FlatSpan& span) const;

  // Bytes one Step() reads plus writes per element for these dtypes (no copy-out: nullopt).
  static size_t BytesPerElement(OptimizerType type, DType grad_dtype, DType moment_dtype,
                                std::optional<DType> copy_out_dtype);

  const OptimizerOptions& options() const { return options_; }
  Isa isa() const { return isa_; }
  int threads() const { return threads_; }

 private:
  CpuOptimizer(const OptimizerOptions& options, Isa isa, int threads)
      : options_(options), isa_(isa), threads_(threads) {}

  OptimizerOptions options_;
  Isa isa_;
  int threads_;
};

// True if any of the `n` gradients is inf or NaN (loss-scaler overflow check). One read pass,
// stops early at the chunk that holds one. threads: 0 = all; isa as in OptimizerOptions.
Result<bool> HasInfOrNan(const void* grads, DType dtype, size_t n, int threads = 0,
                         Isa isa = Isa::kAuto);

// Sum of the squares of the `n` gradients (raw values, no grad_scale), for the global gradient
// norm. Squares are exact in double and accumulated in double (per lane, per 64K-element chunk,
// then chunk sums in order), so the result is deterministic for a given ISA whatever `threads` is,
// and overflows only past ~1e308. Gradients with inf/NaN give inf/NaN.
Result<double> SumOfSquares(const void* grads, DType dtype, size_t n, int threads = 0,
                            Isa isa = Isa::kAuto);

}  // namespace strata::cpu_optimizer
