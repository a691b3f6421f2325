// Every vector ISA against the scalar oracle, for every (optimizer, grad dtype, moment dtype,
// copy-out) kernel, odd sizes and unaligned pointers.
//
// Bitwise equality is required (NaN matches NaN): every kernel performs the same sequence of
// IEEE-754 operations (add, mul, div, sqrt and fused multiply-add, each correctly rounded), in the
// same order, in every ISA (kernels_impl.h; -ffp-contract=off stops the compiler from fusing on its
// own), and the fp16/bf16 conversions are exact or round-to-nearest-even in both. So no 1-ulp
// allowance is needed here. Only SumOfSquares differs (summation order), see reductions_test.cc.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cpu_optimizer/optimizer.h"
#include "tests/cpu_optimizer/test_util.h"

namespace strata::cpu_optimizer {
namespace {

using testing::FirstMismatch;
using testing::Slab;
using testing::StoreAs;

struct Config {
  OptimizerType type;
  DType grad;
  DType moments;
  std::optional<DType> copy_out;
  size_t n;
  size_t offset;  // elements past a 64-byte boundary, for every buffer (staggered by buffer)
};

std::string Describe(const Config& c) {
  return std::string(OptimizerTypeName(c.type)) + " grad=" + std::string(DTypeName(c.grad)) +
         " moments=" + std::string(DTypeName(c.moments)) +
         " copy=" + (c.copy_out ? std::string(DTypeName(*c.copy_out)) : "none") +
         " n=" + std::to_string(c.n) + " offset=" + std::to_string(c.offset);
}

OptimizerOptions OptionsFor(OptimizerType type) {
  OptimizerOptions o = OptimizerOptions::Defaults(type);
  switch (type) {
    case OptimizerType::kAdam:
      o.weight_decay = 0.1;  // L2 path
      break;
    case OptimizerType::kAdamW:
      o.weight_decay = 0.01;
      break;
    case OptimizerType::kAdagrad:
      o.weight_decay = 0.01;
      o.lr_decay = 0.01;
      o.initial_accumulator_value = 0.1;
      break;
    case OptimizerType::kLion:
      o.weight_decay = 0.1;
      break;
  }
  return o;
}

constexpr int kSteps = 3;

// Inputs shared by every ISA's run of one config.
struct Inputs {
  std::vector<float> p, m, v;
  std::vector<std::vector<float>> g;  // one per step
};

Inputs MakeInputs(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  Inputs in;
  in.p.resize(n);
  in.m.resize(n);
  in.v.resize(n);
  for (size_t i = 0; i < n; ++i) {
    in.p[i] = normal(rng);
    in.m[i] = 0.01f * normal(rng);
    in.v[i] = 1e-4f * unit(rng);
  }
  in.g.resize(kSteps);
  for (auto& g : in.g) {
    g.resize(n);
    for (size_t i = 0; i < n; ++i) g[i] = (i % 97 == 5) ? 0.0f : 0.1f * normal(rng);
  }
  return in;
}

struct KernelRun {
  Slab p, m, v, g, out;
  Config c;
  KernelRun(const Config& config)
      : p(config.n, 4, config.offset),
        m(config.n, DTypeBytes(config.moments), (config.offset + 1) % 4),
        v(config.n, DTypeBytes(config.moments), (config.offset + 2) % 4),
        g(config.n, DTypeBytes(config.grad), (config.offset + 3) % 4),
        out(config.n, 2, config.offset),
        c(config) {}
  FlatSpan Span() {
    FlatSpan s;
    s.numel = c.n;
    s.params = p.f32();
    if (c.type != OptimizerType::kAdagrad) s.exp_avg = m.data();
    if (c.type != OptimizerType::kLion) s.exp_avg_sq = v.data();
    s.moment_dtype = c.moments;
    s.grads = g.data();
    s.grad_dtype = c.grad;
    if (c.copy_out) {
      s.copy_out = out.data();
      s.copy_out_dtype = *c.copy_out;
    }
    return s;
  }
};

void RunSteps(Isa isa, int threads, const Inputs& in, KernelRun& run) {
  const Config& c = run.c;
  for (size_t i = 0; i < c.n; ++i) {
    run.p.f32()[i] = in.p[i];
    StoreAs(run.m.data(), c.moments, i, in.m[i]);
    StoreAs(run.v.data(), c.moments, i, in.v[i]);
  }
  OptimizerOptions o = OptionsFor(c.type);
  o.isa = isa;
  o.threads = threads;
  Result<CpuOptimizer> opt = CpuOptimizer::Create(o);
  ASSERT_TRUE(opt.ok()) << opt.status().ToString();
  const double scales[kSteps] = {1.0, 0.5, 1.0 / 1024};
  for (int step = 1; step <= kSteps; ++step) {
    for (size_t i = 0; i < c.n; ++i) {
      StoreAs(run.g.data(), c.grad, i, in.g[step - 1][i] / static_cast<float>(scales[step - 1]));
    }
    StepArgs args;
    args.step = step;
    args.grad_scale = scales[step - 1];
    if (step == 3) args.lr = o.lr * 0.5;
    ASSERT_TRUE(opt->Step(run.Span(), args).ok());
  }
}

void ExpectSame(KernelRun& want, KernelRun& got, const std::string& what) {
  const Config& c = want.c;
  long i = FirstMismatch(want.p.data(), got.p.data(), DType::kFloat32, c.n);
  EXPECT_EQ(i, -1) << what << ": params differ at " << i << ": " << want.p.f32()[i] << " vs "
                   << got.p.f32()[i];
  if (c.type != OptimizerType::kAdagrad) {
    i = FirstMismatch(want.m.data(), got.m.data(), c.moments, c.n);
    EXPECT_EQ(i, -1) << what << ": exp_avg differs at " << i;
  }
  if (c.type != OptimizerType::kLion) {
    i = FirstMismatch(want.v.data(), got.v.data(), c.moments, c.n);
    EXPECT_EQ(i, -1) << what << ": exp_avg_sq differs at " << i;
  }
  if (c.copy_out) {
    i = FirstMismatch(want.out.data(), got.out.data(), *c.copy_out, c.n);
    EXPECT_EQ(i, -1) << what << ": copy-out differs at " << i;
    // The copy-out is the rounded params.
    for (size_t k = 0; k < c.n; ++k) {
      const uint16_t expect = *c.copy_out == DType::kFloat16 ? FloatToHalf(want.p.f32()[k])
                                                             : FloatToBf16(want.p.f32()[k]);
      if (want.out.u16()[k] != expect) {
        ADD_FAILURE() << what << ": copy-out[" << k << "] is not the rounded param";
        break;
      }
    }
  }
}

class KernelOracleTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!IsaSupported(GetParam())) {
      GTEST_SKIP() << "this CPU (or build) lacks " << IsaName(GetParam());
    }
  }
  void CheckConfigs(const std::vector<Config>& configs) {
    for (const Config& c : configs) {
      const Inputs in = MakeInputs(c.n, static_cast<uint32_t>(c.n * 7 + c.offset));
      KernelRun want(c), got(c);
      RunSteps(Isa::kScalar, 1, in, want);
      RunSteps(GetParam(), 2, in, got);
      ExpectSame(want, got, std::string(IsaName(GetParam())) + " " + Describe(c));
      if (HasFailure()) return;
    }
  }
};

std::vector<Config> AllKernels(size_t n, size_t offset) {
  std::vector<Config> out;
  for (OptimizerType t : {OptimizerType::kAdam, OptimizerType::kAdamW, OptimizerType::kAdagrad,
                          OptimizerType::kLion}) {
    for (DType g : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (DType m : {DType::kFloat32, DType::kBFloat16}) {
        for (std::optional<DType> o :
             {std::optional<DType>(), std::optional<DType>(DType::kFloat16),
              std::optional<DType>(DType::kBFloat16)}) {
          out.push_back({t, g, m, o, n, offset});
        }
      }
    }
  }
  return out;
}

TEST_P(KernelOracleTest, OddSizesAndUnalignedPointersMatchScalarBitwise) {
  for (size_t n : {size_t{1}, size_t{15}, size_t{17}, size_t{4099}}) {
    for (size_t offset : {0, 1, 2, 3}) CheckConfigs(AllKernels(n, offset));
  }
}

TEST_P(KernelOracleTest, MillionPlusThreeMatchesScalarBitwise) {
  // Large enough to take the multi-threaded path (chunks of 64K elements on 2 threads). Every
  // optimizer with three dtype mixes that together cover each grad, moment and copy-out kernel
  // path (all 72 combinations run above at smaller sizes).
  std::vector<Config> configs;
  for (const Config& c : AllKernels(1000003, 1)) {
    const bool plain = c.grad == DType::kFloat32 && c.moments == DType::kFloat32 && !c.copy_out;
    const bool mixed16 = c.grad == DType::kBFloat16 && c.moments == DType::kBFloat16 &&
                         c.copy_out == DType::kFloat16;
    const bool mixed32 =
        c.grad == DType::kFloat16 && c.moments == DType::kFloat32 && c.copy_out == DType::kBFloat16;
    if (plain || mixed16 || mixed32) configs.push_back(c);
  }
  CheckConfigs(configs);
}

TEST_P(KernelOracleTest, NoBiasCorrectionAndMaximizeMatchScalar) {
  const Config c{OptimizerType::kAdamW, DType::kFloat32, DType::kFloat32, DType::kBFloat16, 333, 2};
  const Inputs in = MakeInputs(c.n, 99);
  KernelRun want(c), got(c);
  for (Isa isa : {Isa::kScalar, GetParam()}) {
    KernelRun& run = isa == Isa::kScalar ? want : got;
    for (size_t i = 0; i < c.n; ++i) {
      run.p.f32()[i] = in.p[i];
      run.m.f32()[i] = in.m[i];
      run.v.f32()[i] = in.v[i];
      run.g.f32()[i] = in.g[0][i];
    }
    OptimizerOptions o = OptimizerOptions::Defaults(OptimizerType::kAdamW);
    o.bias_correction = false;
    o.maximize = true;
    o.isa = isa;
    Result<CpuOptimizer> opt = CpuOptimizer::Create(o);
    ASSERT_TRUE(opt.ok());
    ASSERT_TRUE(opt->Step(run.Span(), StepArgs{.step = 4}).ok());
  }
  ExpectSame(want, got, "no bias correction, maximize");
}

TEST_P(KernelOracleTest, SpecialValuesMatchScalar) {
  // inf, NaN, zeros of both signs, subnormals and huge values in grads, params and moments.
  const float specials[] = {0.0f,
                            -0.0f,
                            1e-40f,
                            -1e-45f,
                            1e30f,
                            -3e38f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            65504.0f,
                            65520.0f,
                            6e-8f,
                            1.0f,
                            -2.5f};
  const size_t ns = sizeof(specials) / sizeof(specials[0]);
  for (const Config& base : AllKernels(ns * ns + 5, 1)) {
    Config c = base;
    Inputs in = MakeInputs(c.n, 5);
    for (size_t i = 0; i < ns * ns; ++i) {
      in.p[i] = specials[i % ns];
      in.g[0][i] = specials[i / ns];
      in.g[1][i] = specials[(i + 3) % ns];
      in.m[i] = i % 2 ? specials[(i / ns + 1) % ns] : 0.0f;
      in.v[i] = std::fabs(specials[(i + 5) % ns]);
    }
    KernelRun want(c), got(c);
    RunSteps(Isa::kScalar, 1, in, want);
    RunSteps(GetParam(), 1, in, got);
    ExpectSame(want, got, std::string("specials ") + Describe(c));
    if (HasFailure()) return;
  }
}

TEST(KernelThreads, ResultDoesNotDependOnThreadCount) {
  const Config c{OptimizerType::kAdamW, DType::kBFloat16, DType::kBFloat16,
                 DType::kFloat16,       600001,           3};
  const Inputs in = MakeInputs(c.n, 3);
  KernelRun one(c), two(c);
  RunSteps(Isa::kAuto, 1, in, one);
  RunSteps(Isa::kAuto, 2, in, two);
  ExpectSame(one, two, "1 vs 2 threads");
}

TEST(KernelLion, ZeroDirectionLeavesParamsToDecayOnly) {
  // sign(0) = 0 as torch.sign: with m = g = 0 only the decoupled decay moves p.
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    std::vector<float> p(37, 2.0f), m(37, 0.0f), g(37, 0.0f);
    OptimizerOptions o = OptimizerOptions::Defaults(OptimizerType::kLion);
    o.weight_decay = 0.5;
    o.lr = 0.1;
    o.isa = isa;
    Result<CpuOptimizer> opt = CpuOptimizer::Create(o);
    ASSERT_TRUE(opt.ok());
    FlatSpan s;
    s.numel = p.size();
    s.params = p.data();
    s.exp_avg = m.data();
    s.grads = g.data();
    ASSERT_TRUE(opt->Step(s, StepArgs{}).ok());
    for (float x : p) EXPECT_EQ(x, 2.0f * static_cast<float>(1.0 - 0.1 * 0.5)) << IsaName(isa);
    g.assign(37, -3.0f);
    ASSERT_TRUE(opt->Step(s, StepArgs{.step = 2}).ok());
    const float decayed = 2.0f * static_cast<float>(1.0 - 0.1 * 0.5);
    for (float x : p) {
      EXPECT_EQ(x, std::fma(1.0f, 0.1f, decayed * static_cast<float>(1.0 - 0.1 * 0.5)))
          << IsaName(isa);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, KernelOracleTest, ::testing::ValuesIn(testing::VectorIsas()),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(IsaName(info.param));
                         });

}  // namespace
}  // namespace strata::cpu_optimizer
