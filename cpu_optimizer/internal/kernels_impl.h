// Internal: the optimizer kernels, written once over a small per-ISA vector type V and compiled in
// kernels_scalar.cc, kernels_avx2.cc and kernels_avx512.cc (each with its own -m flags).
//
// Algorithm. One pass over [begin, end): for each vector of V::kWidth elements, load g (converting
// fp16/bf16 to fp32), multiply by grad_scale, load p, m, v (bf16 moments are widened), apply the
// update in fp32, store p, m, v back in place and, optionally, the rounded fp16/bf16 copy of p into
// the copy-out buffer. The last partial vector uses masked (or buffered) loads and stores, so any
// length and any alignment work. The copy-out buffer is write-only: where its pointer allows, the
// loop first peels elements up to its 64-byte boundary and then writes it with non-temporal stores,
// which skip the read-for-ownership a normal store would pay (2 B/element of extra DRAM reads for a
// 16-bit copy); a store fence ends every range that streamed.
//
// Exactness. Every step is an IEEE-rounded operation (add, mul, div, sqrt, fma) applied in the same
// order for every V, so the three ISAs produce identical bits. The order follows libtorch 1.13's
// Adam/AdamW/Adagrad as measured against it: add_ with alpha and addcmul_ are one fma each
// (fma(g, 1-b1, m*b1), fma((1-b2)*g, g, v*b2)); sqrt, then divide by sqrt(bias2), then + eps;
// addcdiv is p + (-step*m)/denom. So results match torch::optim's vector path bit for bit.
//
// ODR safety. Everything here is a template over V, and each TU's V lives in an anonymous
// namespace, so no instantiation (compiled with that TU's -m flags) can be merged by the linker
// with another TU's copy. Do not add non-template inline functions here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "cpu_optimizer/internal/kernel_table.h"

namespace strata::cpu_optimizer::internal {

template <class V, int kDtype, bool kPartial>
inline typename V::F LoadAs(const void* base, size_t i, size_t n) {
  if constexpr (kDtype == 0) {
    const float* p = static_cast<const float*>(base) + i;
    if constexpr (kPartial)
      return V::LoadN(p, n);
    else
      return V::Load(p);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(base) + i;
    typename V::H h;
    if constexpr (kPartial)
      h = V::LoadHN(p, n);
    else
      h = V::LoadH(p);
    if constexpr (kDtype == 1)
      return V::HalfToFloat(h);
    else
      return V::Bf16ToFloat(h);
  }
}

// kDtype: 0 fp32, 1 fp16, 2 bf16. kStream: non-temporal (REQUIRES: aligned, full vector).
template <class V, int kDtype, bool kPartial, bool kStream = false>
inline void StoreAs(void* base, size_t i, size_t n, typename V::F x) {
  if constexpr (kDtype == 0) {
    float* p = static_cast<float*>(base) + i;
    if constexpr (kPartial)
      V::StoreN(p, x, n);
    else
      V::Store(p, x);
  } else {
    uint16_t* p = static_cast<uint16_t*>(base) + i;
    typename V::H h;
    if constexpr (kDtype == 1)
      h = V::FloatToHalf(x);
    else
      h = V::FloatToBf16(x);
    if constexpr (kPartial)
      V::StoreHN(p, h, n);
    else if constexpr (kStream)
      V::StreamH(p, h);
    else
      V::StoreH(p, h);
  }
}

// Broadcast constants, built once per range.
template <class V>
struct Consts {
  typename V::F grad_scale, beta1, beta2, omb1, omb2, eps, wd, decay, neg_step, sqrt_bias2, zero;
  explicit Consts(const KernelParams& k)
      : grad_scale(V::Set1(k.grad_scale)),
        beta1(V::Set1(k.beta1)),
        beta2(V::Set1(k.beta2)),
        omb1(V::Set1(k.one_minus_beta1)),
        omb2(V::Set1(k.one_minus_beta2)),
        eps(V::Set1(k.eps)),
        wd(V::Set1(k.weight_decay)),
        decay(V::Set1(k.decay)),
        neg_step(V::Set1(k.neg_step_size)),
        sqrt_bias2(V::Set1(k.sqrt_bias2)),
        zero(V::Set1(0.0f)) {}
};

// Moment types: kM = 0 fp32, 1 bf16 -> dtype code 0 or 2. Copy-out kC: 0 none, 1 fp16, 2 bf16.
template <class V, int kKind, int kG, int kM, int kC, bool kPartial, bool kStream>
inline void UpdateVector(const Consts<V>& c, bool l2, const KernelBuffers& b, size_t i, size_t n) {
  using F = typename V::F;
  constexpr int kMomDtype = kM == 0 ? 0 : 2;
  constexpr auto kAdam = static_cast<int>(KernelKind::kAdam);
  constexpr auto kAdagrad = static_cast<int>(KernelKind::kAdagrad);
  constexpr auto kLion = static_cast<int>(KernelKind::kLion);
  constexpr bool kPattern = kKind >= static_cast<int>(KernelKind::kPatternAdam);
  constexpr bool kUsesM = kKind == kAdam || kKind == kLion ||
                          kKind == static_cast<int>(KernelKind::kPatternAdam) ||
                          kKind == static_cast<int>(KernelKind::kPatternLion);
  constexpr bool kUsesV = kKind == kAdam || kKind == kAdagrad ||
                          kKind == static_cast<int>(KernelKind::kPatternAdam) ||
                          kKind == static_cast<int>(KernelKind::kPatternAdagrad);

  F g = LoadAs<V, kG, kPartial>(b.g, i, n);
  F p = LoadAs<V, 0, kPartial>(b.p, i, n);
  F m, v;
  if constexpr (kUsesM) m = LoadAs<V, kMomDtype, kPartial>(b.m, i, n);
  if constexpr (kUsesV) v = LoadAs<V, kMomDtype, kPartial>(b.v, i, n);

  if constexpr (kPattern) {
    // Trivial arithmetic on the same streams (x = g*0 + x: every input is used, finite data is
    // left unchanged so the ceiling can be timed between optimizer steps on the same buffers).
    p = V::Fma(g, c.zero, p);
    if constexpr (kUsesM) m = V::Fma(g, c.zero, m);
    if constexpr (kUsesV) v = V::Fma(g, c.zero, v);
  } else if constexpr (kKind == kAdam) {
    g = V::Mul(g, c.grad_scale);
    if (l2) g = V::Fma(p, c.wd, g);                        // grad.add(p, alpha=wd)
    m = V::Fma(g, c.omb1, V::Mul(m, c.beta1));             // m.mul_(b1).add_(g, 1-b1)
    v = V::Fma(V::Mul(c.omb2, g), g, V::Mul(v, c.beta2));  // v.mul_(b2).addcmul_(g, g, 1-b2)
    const F denom = V::Add(V::Div(V::Sqrt(v), c.sqrt_bias2), c.eps);
    p = V::Add(V::Mul(p, c.decay), V::Div(V::Mul(c.neg_step, m), denom));  // p.addcdiv_(m, d, -ss)
  } else if constexpr (kKind == kAdagrad) {
    g = V::Mul(g, c.grad_scale);
    if (l2) g = V::Fma(p, c.wd, g);
    v = V::Fma(g, g, v);  // state_sum.addcmul_(g, g, 1)
    const F std_dev = V::Add(V::Sqrt(v), c.eps);
    p = V::Add(p, V::Div(V::Mul(c.neg_step, g), std_dev));  // p.addcdiv_(g, std, -clr)
  } else if constexpr (kKind == kLion) {
    g = V::Mul(g, c.grad_scale);
    p = V::Mul(p, c.decay);                                           // p.mul_(1 - lr*wd)
    const F update = V::Sign(V::Fma(g, c.omb1, V::Mul(m, c.beta1)));  // sign(b1*m + (1-b1)*g)
    p = V::Fma(update, c.neg_step, p);                                // p.add_(update, alpha=-lr)
    m = V::Fma(g, c.omb2, V::Mul(m, c.beta2));                        // m.mul_(b2).add_(g, 1-b2)
  }

  StoreAs<V, 0, kPartial>(b.p, i, n, p);
  if constexpr (kUsesM) StoreAs<V, kMomDtype, kPartial>(b.m, i, n, m);
  if constexpr (kUsesV) StoreAs<V, kMomDtype, kPartial>(b.v, i, n, v);
  if constexpr (kC != 0) StoreAs<V, kC, kPartial, kStream>(b.out, i, n, p);
}

template <class V, int kKind, int kG, int kM, int kC>
void StepRange(const KernelParams& k, const KernelBuffers& b, size_t begin, size_t end) {
  constexpr size_t kW = V::kWidth;
  const Consts<V> c(k);
  const bool l2 = k.l2;
  size_t i = begin;
  // Partial vectors [i, i+count) of at most kW elements.
  auto partial = [&](size_t count) {
    while (count > 0) {
      const size_t n = count < kW ? count : kW;
      UpdateVector<V, kKind, kG, kM, kC, true, false>(c, l2, b, i, n);
      i += n;
      count -= n;
    }
  };
  if constexpr (kC != 0 && V::kCanStream) {
    const uintptr_t out_addr = reinterpret_cast<uintptr_t>(static_cast<uint16_t*>(b.out) + i);
    if ((out_addr & 1) == 0 && end - begin >= 4 * kW) {
      partial(((64 - (out_addr & 63)) & 63) / 2);  // up to the copy-out's 64-byte boundary
      for (; i + kW <= end; i += kW) {
        UpdateVector<V, kKind, kG, kM, kC, false, true>(c, l2, b, i, kW);
      }
      partial(end - i);
      V::StoreFence();
      return;
    }
  }
  for (; i + kW <= end; i += kW) UpdateVector<V, kKind, kG, kM, kC, false, false>(c, l2, b, i, kW);
  partial(end - i);
}

template <class V, int kG>
double SumSquaresRange(const void* g, size_t begin, size_t end) {
  constexpr size_t kW = V::kWidth;
  typename V::D acc = V::DZero();
  size_t i = begin;
  for (; i + kW <= end; i += kW) acc = V::AccumulateSquares(acc, LoadAs<V, kG, false>(g, i, kW));
  if (i < end) acc = V::AccumulateSquares(acc, LoadAs<V, kG, true>(g, i, end - i));
  return V::DSum(acc);
}

// x * 0 is 0 for finite x and NaN for inf/NaN, so the accumulator turns NaN at the first non-finite
// element and stays NaN. Checked every 4096 elements so a bad buffer is found early.
template <class V, int kG>
bool NonFiniteRange(const void* g, size_t begin, size_t end) {
  constexpr size_t kW = V::kWidth;
  const typename V::F zero = V::Set1(0.0f);
  size_t i = begin;
  while (i < end) {
    const size_t block_end = end - i > 4096 ? i + 4096 : end;
    typename V::F acc = zero;
    for (; i + kW <= block_end; i += kW) acc = V::Fma(LoadAs<V, kG, false>(g, i, kW), zero, acc);
    if (i < block_end) {
      acc = V::Fma(LoadAs<V, kG, true>(g, i, block_end - i), zero, acc);
      i = block_end;
    }
    if (V::AnyNan(acc)) return true;
  }
  return false;
}

// STREAM triad a = b + s*c (separate multiply and add, as STREAM writes it; normal stores).
template <class V>
void TriadRange(float* a, const float* b, const float* c, float s, size_t begin, size_t end) {
  constexpr size_t kW = V::kWidth;
  const typename V::F scalar = V::Set1(s);
  size_t i = begin;
  for (; i + kW <= end; i += kW)
    V::Store(a + i, V::Add(V::Load(b + i), V::Mul(scalar, V::Load(c + i))));
  if (i < end) {
    const size_t n = end - i;
    V::StoreN(a + i, V::Add(V::LoadN(b + i, n), V::Mul(scalar, V::LoadN(c + i, n))), n);
  }
}

template <class V, int kFrom, int kTo>
void ConvertRange(const void* src, void* dst, size_t n) {
  constexpr size_t kW = V::kWidth;
  size_t i = 0;
  for (; i + kW <= n; i += kW)
    StoreAs<V, kTo, false>(dst, i, kW, LoadAs<V, kFrom, false>(src, i, kW));
  if (i < n) StoreAs<V, kTo, true>(dst, i, n - i, LoadAs<V, kFrom, true>(src, i, n - i));
}

template <class V>
KernelTable MakeKernelTable(Isa isa) {
  KernelTable t;
  t.isa = isa;
  [&]<size_t... I>(std::index_sequence<I...>) {
    ((t.step[I] =
          &StepRange<V, static_cast<int>(I) / (kNumGradTypes * kNumMomentTypes * kNumCopyOuts),
                     static_cast<int>(I) / (kNumMomentTypes * kNumCopyOuts) % kNumGradTypes,
                     static_cast<int>(I) / kNumCopyOuts % kNumMomentTypes,
                     static_cast<int>(I) % kNumCopyOuts>),
     ...);
  }
  (std::make_index_sequence<kNumStepFns>{});
  t.sum_squares[0] = &SumSquaresRange<V, 0>;
  t.sum_squares[1] = &SumSquaresRange<V, 1>;
  t.sum_squares[2] = &SumSquaresRange<V, 2>;
  t.has_non_finite[0] = &NonFiniteRange<V, 0>;
  t.has_non_finite[1] = &NonFiniteRange<V, 1>;
  t.has_non_finite[2] = &NonFiniteRange<V, 2>;
  t.triad = &TriadRange<V>;
  t.f32_to_f16 = &ConvertRange<V, 0, 1>;
  t.f16_to_f32 = &ConvertRange<V, 1, 0>;
  t.f32_to_bf16 = &ConvertRange<V, 0, 2>;
  t.bf16_to_f32 = &ConvertRange<V, 2, 0>;
  return t;
}

}  // namespace strata::cpu_optimizer::internal
