// CpuOptimizer: validates options and spans, turns the double hyper-parameters of one step into
// the float constants of KernelParams (as PyTorch rounds them), picks the kernel for the span's
// (optimizer, grad dtype, moment dtype, copy-out) from the ISA's table and runs it over chunks
// (parallel.h). Reductions keep one partial per chunk and combine them in chunk order, so their
// result does not depend on the thread count.
#include "cpu_optimizer/optimizer.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_optimizer/internal/kernel_table.h"
#include "cpu_optimizer/internal/parallel.h"
#include "cpu_optimizer/internal/span.h"

namespace strata::cpu_optimizer {
namespace {

using internal::KernelKind;

bool IsAdamLike(OptimizerType t) { return t == OptimizerType::kAdam || t == OptimizerType::kAdamW; }
bool UsesM(OptimizerType t) { return IsAdamLike(t) || t == OptimizerType::kLion; }
bool UsesV(OptimizerType t) { return IsAdamLike(t) || t == OptimizerType::kAdagrad; }

KernelKind KindFor(OptimizerType t) {
  switch (t) {
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW:
      return KernelKind::kAdam;
    case OptimizerType::kAdagrad:
      return KernelKind::kAdagrad;
    case OptimizerType::kLion:
      return KernelKind::kLion;
  }
  return KernelKind::kAdam;
}

Status CheckFinite(double value, const char* name, bool allow_negative = false) {
  if (!std::isfinite(value)) return InvalidArgumentError(std::string(name) + " must be finite");
  if (!allow_negative && value < 0) {
    return InvalidArgumentError(std::string(name) + " must be >= 0, got " + std::to_string(value));
  }
  return Status::Ok();
}

}  // namespace

std::string_view OptimizerTypeName(OptimizerType type) {
  switch (type) {
    case OptimizerType::kAdam:
      return "adam";
    case OptimizerType::kAdamW:
      return "adamw";
    case OptimizerType::kAdagrad:
      return "adagrad";
    case OptimizerType::kLion:
      return "lion";
  }
  return "unknown";
}

Result<OptimizerType> ParseOptimizerType(std::string_view text) {
  if (text == "adam") return OptimizerType::kAdam;
  if (text == "adamw") return OptimizerType::kAdamW;
  if (text == "adagrad") return OptimizerType::kAdagrad;
  if (text == "lion") return OptimizerType::kLion;
  return InvalidArgumentError("unknown optimizer '" + std::string(text) +
                              "' (expected adam, adamw, adagrad or lion)");
}

OptimizerOptions OptimizerOptions::Defaults(OptimizerType type) {
  OptimizerOptions o;
  o.type = type;
  switch (type) {
    case OptimizerType::kAdam:
      break;
    case OptimizerType::kAdamW:
      o.weight_decay = 1e-2;
      break;
    case OptimizerType::kAdagrad:
      o.lr = 1e-2;
      o.eps = 1e-10;
      break;
    case OptimizerType::kLion:
      o.lr = 1e-4;
      o.beta2 = 0.99;
      break;
  }
  return o;
}

Status OptimizerOptions::Validate() const {
  const std::string name(OptimizerTypeName(type));
  if (amsgrad) {
    return InvalidArgumentError(name + ": amsgrad is not supported by the CPU optimizer kernels");
  }
  STRATA_RETURN_IF_ERROR(CheckFinite(lr, "lr"));
  STRATA_RETURN_IF_ERROR(CheckFinite(eps, "eps"));
  STRATA_RETURN_IF_ERROR(CheckFinite(weight_decay, "weight_decay"));
  if (type != OptimizerType::kAdagrad) {
    if (!(beta1 >= 0 && beta1 < 1)) {
      return InvalidArgumentError(name + ": beta1 must be in [0, 1), got " + std::to_string(beta1));
    }
    if (!(beta2 >= 0 && beta2 < 1)) {
      return InvalidArgumentError(name + ": beta2 must be in [0, 1), got " + std::to_string(beta2));
    }
    if (lr_decay != 0 || initial_accumulator_value != 0) {
      return InvalidArgumentError(name +
                                  ": lr_decay and initial_accumulator_value are Adagrad options");
    }
  } else {
    STRATA_RETURN_IF_ERROR(CheckFinite(lr_decay, "lr_decay"));
    STRATA_RETURN_IF_ERROR(CheckFinite(initial_accumulator_value, "initial_accumulator_value"));
  }
  if (threads < 0) return InvalidArgumentError("threads must be >= 0 (0: all cores)");
  return Status::Ok();
}

Result<CpuOptimizer> CpuOptimizer::Create(const OptimizerOptions& options) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  STRATA_ASSIGN_OR_RETURN(const Isa isa, ResolveIsa(options.isa));
  return CpuOptimizer(options, isa, internal::ResolveThreads(options.threads));
}

size_t CpuOptimizer::BytesPerElement(OptimizerType type, DType grad_dtype, DType moment_dtype,
                                     std::optional<DType> copy_out_dtype) {
  size_t bytes = DTypeBytes(grad_dtype) + 2 * sizeof(float);  // read g; read and write p
  if (UsesM(type)) bytes += 2 * DTypeBytes(moment_dtype);
  if (UsesV(type)) bytes += 2 * DTypeBytes(moment_dtype);
  if (copy_out_dtype) bytes += DTypeBytes(*copy_out_dtype);
  return bytes;
}

namespace internal {

Status CheckSpan(OptimizerType type, const FlatSpan& s) {
  const std::string name(OptimizerTypeName(type));
  if (s.numel == 0) return Status::Ok();
  if (s.params == nullptr) return InvalidArgumentError(name + ": params is null");
  if (s.grads == nullptr) return InvalidArgumentError(name + ": grads is null");
  if (UsesM(type) && s.exp_avg == nullptr) return InvalidArgumentError(name + ": exp_avg is null");
  if (!UsesM(type) && s.exp_avg != nullptr) {
    return InvalidArgumentError(name + " has no exp_avg: pass null");
  }
  if (UsesV(type) && s.exp_avg_sq == nullptr) {
    return InvalidArgumentError(name + ": exp_avg_sq is null");
  }
  if (!UsesV(type) && s.exp_avg_sq != nullptr) {
    return InvalidArgumentError(name + " has no exp_avg_sq: pass null");
  }
  if (s.moment_dtype == DType::kFloat16) {
    return InvalidArgumentError(name + ": moments must be fp32 or bf16, not fp16");
  }
  if (s.copy_out != nullptr && s.copy_out_dtype == DType::kFloat32) {
    return InvalidArgumentError(name + ": copy_out_dtype must be fp16 or bf16");
  }
  return Status::Ok();
}

KernelBuffers BuffersOf(const FlatSpan& s) {
  KernelBuffers b;
  b.p = s.params;
  b.m = s.exp_avg;
  b.v = s.exp_avg_sq;
  b.g = s.grads;
  b.out = s.copy_out;
  return b;
}

int StepIndexFor(KernelKind kind, const FlatSpan& s) {
  const int copy = s.copy_out == nullptr ? 0 : (s.copy_out_dtype == DType::kFloat16 ? 1 : 2);
  return StepIndex(static_cast<int>(kind), static_cast<int>(s.grad_dtype),
                   s.moment_dtype == DType::kBFloat16 ? 1 : 0, copy);
}

}  // namespace internal

Status CpuOptimizer::Step(const FlatSpan& span, const StepArgs& args) const {
  const OptimizerOptions& o = options_;
  STRATA_RETURN_IF_ERROR(internal::CheckSpan(o.type, span));
  if (args.step < 1) {
    return InvalidArgumentError("step must be >= 1 (1-based), got " + std::to_string(args.step));
  }
  if (!std::isfinite(args.grad_scale)) return InvalidArgumentError("grad_scale must be finite");
  const double lr = args.lr.value_or(o.lr);
  STRATA_RETURN_IF_ERROR(CheckFinite(lr, "lr"));
  if (span.numel == 0) return Status::Ok();

  internal::KernelParams k;
  k.grad_scale = static_cast<float>(o.maximize ? -args.grad_scale : args.grad_scale);
  k.beta1 = static_cast<float>(o.beta1);
  k.beta2 = static_cast<float>(o.beta2);
  k.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  k.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  k.eps = static_cast<float>(o.eps);
  k.weight_decay = static_cast<float>(o.weight_decay);
  const double step = static_cast<double>(args.step);
  switch (o.type) {
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW: {
      const bool decoupled = o.type == OptimizerType::kAdamW;
      k.l2 = !decoupled && o.weight_decay != 0;
      k.decay = decoupled ? static_cast<float>(1.0 - lr * o.weight_decay) : 1.0f;
      const double bias1 = o.bias_correction ? 1.0 - std::pow(o.beta1, step) : 1.0;
      const double bias2 = o.bias_correction ? 1.0 - std::pow(o.beta2, step) : 1.0;
      k.neg_step_size = static_cast<float>(-(lr / bias1));
      k.sqrt_bias2 = static_cast<float>(std::sqrt(bias2));
      break;
    }
    case OptimizerType::kAdagrad:
      k.l2 = o.weight_decay != 0;
      k.neg_step_size = static_cast<float>(-(lr / (1.0 + (step - 1.0) * o.lr_decay)));
      break;
    case OptimizerType::kLion:
      k.decay = static_cast<float>(1.0 - lr * o.weight_decay);
      k.neg_step_size = static_cast<float>(-lr);
      break;
  }

  const internal::KernelTable& table = internal::TableFor(isa_);
  const internal::StepRangeFn fn = table.step[internal::StepIndexFor(KindFor(o.type), span)];
  const internal::KernelBuffers b = internal::BuffersOf(span);
  internal::ParallelChunks(threads_, span.numel,
                           [&](size_t begin, size_t end) { fn(k, b, begin, end); });
  return Status::Ok();
}

Status CpuOptimizer::InitState(const FlatSpan& span) const {
  STRATA_RETURN_IF_ERROR(internal::CheckSpan(options_.type, span));
  const bool bf16 = span.moment_dtype == DType::kBFloat16;
  const size_t elem = bf16 ? 2 : 4;
  const float init_v = static_cast<float>(options_.initial_accumulator_value);
  internal::ParallelChunks(threads_, span.numel, [&](size_t begin, size_t end) {
    if (span.exp_avg != nullptr) {
      std::memset(static_cast<char*>(span.exp_avg) + begin * elem, 0, (end - begin) * elem);
    }
    if (span.exp_avg_sq != nullptr) {
      if (bf16) {
        const uint16_t bits = FloatToBf16(init_v);
        auto* v = static_cast<uint16_t*>(span.exp_avg_sq);
        for (size_t i = begin; i < end; ++i) v[i] = bits;
      } else {
        auto* v = static_cast<float*>(span.exp_avg_sq);
        for (size_t i = begin; i < end; ++i) v[i] = init_v;
      }
    }
  });
  return Status::Ok();
}

Result<bool> HasInfOrNan(const void* grads, DType dtype, size_t n, int threads, Isa isa) {
  if (n == 0) return false;
  if (grads == nullptr) return InvalidArgumentError("HasInfOrNan: grads is null");
  STRATA_ASSIGN_OR_RETURN(const Isa resolved, ResolveIsa(isa));
  const internal::NonFiniteFn fn =
      internal::TableFor(resolved).has_non_finite[static_cast<int>(dtype)];
  std::atomic<bool> found{false};
  internal::ParallelChunks(threads, n, [&](size_t begin, size_t end) {
    if (found.load(std::memory_order_relaxed)) return;
    if (fn(grads, begin, end)) found.store(true, std::memory_order_relaxed);
  });
  return found.load();
}

Result<double> SumOfSquares(const void* grads, DType dtype, size_t n, int threads, Isa isa) {
  if (n == 0) return 0.0;
  if (grads == nullptr) return InvalidArgumentError("SumOfSquares: grads is null");
  STRATA_ASSIGN_OR_RETURN(const Isa resolved, ResolveIsa(isa));
  const internal::SumSquaresFn fn =
      internal::TableFor(resolved).sum_squares[static_cast<int>(dtype)];
  std::vector<double> partial((n + internal::kChunkElements - 1) / internal::kChunkElements);
  internal::ParallelChunks(threads, n, [&](size_t begin, size_t end) {
    partial[begin / internal::kChunkElements] = fn(grads, begin, end);
  });
  double sum = 0.0;
  for (double p : partial) sum += p;
  return sum;
}

}  // namespace strata::cpu_optimizer
