// Option validation, refusal of unsupported options, span checks, ISA selection and byte counts.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "cpu_optimizer/optimizer.h"

namespace strata::cpu_optimizer {
namespace {

TEST(Options, DefaultsAreValidForEveryOptimizer) {
  for (OptimizerType t : {OptimizerType::kAdam, OptimizerType::kAdamW, OptimizerType::kAdagrad,
                          OptimizerType::kLion}) {
    EXPECT_TRUE(OptimizerOptions::Defaults(t).Validate().ok()) << OptimizerTypeName(t);
    EXPECT_TRUE(CpuOptimizer::Create(OptimizerOptions::Defaults(t)).ok());
  }
}

TEST(Options, AmsgradIsRefusedWithAClearError) {
  OptimizerOptions o = OptimizerOptions::Defaults(OptimizerType::kAdam);
  o.amsgrad = true;
  const Status s = o.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("amsgrad is not supported"), std::string::npos) << s.ToString();
  EXPECT_FALSE(CpuOptimizer::Create(o).ok());
}

TEST(Options, BadValuesAreRefused) {
  auto refused = [](auto mutate, const char* needle) {
    OptimizerOptions o = OptimizerOptions::Defaults(OptimizerType::kAdamW);
    mutate(o);
    const Status s = o.Validate();
    EXPECT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
  };
  refused([](OptimizerOptions& o) { o.lr = -1; }, "lr");
  refused([](OptimizerOptions& o) { o.lr = std::numeric_limits<double>::quiet_NaN(); }, "lr");
  refused([](OptimizerOptions& o) { o.eps = -1e-8; }, "eps");
  refused([](OptimizerOptions& o) { o.beta1 = 1.0; }, "beta1");
  refused([](OptimizerOptions& o) { o.beta2 = -0.1; }, "beta2");
  refused([](OptimizerOptions& o) { o.weight_decay = -0.1; }, "weight_decay");
  refused([](OptimizerOptions& o) { o.lr_decay = 0.1; }, "Adagrad");
  refused([](OptimizerOptions& o) { o.initial_accumulator_value = 0.1; }, "Adagrad");
  refused([](OptimizerOptions& o) { o.threads = -1; }, "threads");
}

TEST(Options, ParseNames) {
  EXPECT_EQ(*ParseOptimizerType("adamw"), OptimizerType::kAdamW);
  EXPECT_FALSE(ParseOptimizerType("sgd").ok());
  EXPECT_EQ(*ParseIsa("avx512"), Isa::kAvx512);
  EXPECT_FALSE(ParseIsa("neon").ok());
}

TEST(Span, MissingOrWrongBuffersAreRefusedBeforeWriting) {
  Result<CpuOptimizer> opt =
      CpuOptimizer::Create(OptimizerOptions::Defaults(OptimizerType::kAdamW));
  ASSERT_TRUE(opt.ok());
  std::vector<float> p(8, 1.0f), m(8), v(8), g(8, 1.0f);
  FlatSpan s;
  s.numel = 8;
  s.params = p.data();
  s.exp_avg = m.data();
  s.exp_avg_sq = v.data();
  s.grads = g.data();
  EXPECT_TRUE(opt->Step(s, StepArgs{}).ok());
  p.assign(8, 1.0f);

  auto refused = [&](FlatSpan bad, StepArgs args = {}) {
    const Status st = opt->Step(bad, args);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    for (float x : p) EXPECT_EQ(x, 1.0f);
  };
  FlatSpan bad = s;
  bad.exp_avg = nullptr;
  refused(bad);
  bad = s;
  bad.grads = nullptr;
  refused(bad);
  bad = s;
  bad.moment_dtype = DType::kFloat16;
  refused(bad);
  bad = s;
  bad.copy_out = m.data();
  bad.copy_out_dtype = DType::kFloat32;
  refused(bad);
  refused(s, StepArgs{.step = 0});
  refused(s, StepArgs{.step = 1, .grad_scale = std::numeric_limits<double>::infinity()});
  refused(s, StepArgs{.step = 1, .grad_scale = 1.0, .lr = -1.0});

  // Adagrad has no exp_avg, Lion no exp_avg_sq: passing one is a mistake, refused.
  Result<CpuOptimizer> adagrad =
      CpuOptimizer::Create(OptimizerOptions::Defaults(OptimizerType::kAdagrad));
  ASSERT_TRUE(adagrad.ok());
  EXPECT_FALSE(adagrad->Step(s, StepArgs{}).ok());
  bad = s;
  bad.exp_avg = nullptr;
  EXPECT_TRUE(adagrad->Step(bad, StepArgs{}).ok());
}

TEST(Span, InitStateFillsMomentsAndAccumulator) {
  OptimizerOptions o = OptimizerOptions::Defaults(OptimizerType::kAdagrad);
  o.initial_accumulator_value = 0.5;
  Result<CpuOptimizer> opt = CpuOptimizer::Create(o);
  ASSERT_TRUE(opt.ok());
  std::vector<float> p(300000), v(300000, 7.0f), g(300000);
  FlatSpan s;
  s.numel = p.size();
  s.params = p.data();
  s.exp_avg_sq = v.data();
  s.grads = g.data();
  ASSERT_TRUE(opt->InitState(s).ok());
  for (float x : v) ASSERT_EQ(x, 0.5f);
  std::vector<uint16_t> vb(300000, 0xffff);
  s.exp_avg_sq = vb.data();
  s.moment_dtype = DType::kBFloat16;
  ASSERT_TRUE(opt->InitState(s).ok());
  for (uint16_t x : vb) ASSERT_EQ(x, FloatToBf16(0.5f));
}

TEST(Isa, EnvironmentOverride) {
  const char* old = getenv("STRATA_CPU_ISA");
  const std::string saved = old ? old : "";
  setenv("STRATA_CPU_ISA", "scalar", 1);
  Result<Isa> isa = ResolveIsa();
  ASSERT_TRUE(isa.ok());
  EXPECT_EQ(*isa, Isa::kScalar);
  Result<CpuOptimizer> opt = CpuOptimizer::Create(OptimizerOptions::Defaults(OptimizerType::kAdam));
  ASSERT_TRUE(opt.ok());
  EXPECT_EQ(opt->isa(), Isa::kScalar);
  // An explicit ISA in the options wins over the environment.
  OptimizerOptions o = OptimizerOptions::Defaults(OptimizerType::kAdam);
  o.isa = BestIsa();
  EXPECT_EQ(CpuOptimizer::Create(o)->isa(), BestIsa());

  setenv("STRATA_CPU_ISA", "sse9", 1);
  Result<Isa> bad = ResolveIsa();
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("STRATA_CPU_ISA"), std::string::npos);
  EXPECT_FALSE(CpuOptimizer::Create(OptimizerOptions::Defaults(OptimizerType::kAdam)).ok());

  for (Isa i : {Isa::kAvx2, Isa::kAvx512}) {
    if (IsaSupported(i)) continue;
    setenv("STRATA_CPU_ISA", std::string(IsaName(i)).c_str(), 1);
    EXPECT_EQ(ResolveIsa().status().code(), StatusCode::kUnavailable) << IsaName(i);
  }
  if (saved.empty()) {
    unsetenv("STRATA_CPU_ISA");
  } else {
    setenv("STRATA_CPU_ISA", saved.c_str(), 1);
  }
}

TEST(Bytes, PerElementCountsEveryStream) {
  using T = OptimizerType;
  EXPECT_EQ(CpuOptimizer::BytesPerElement(T::kAdamW, DType::kFloat32, DType::kFloat32, {}), 28u);
  EXPECT_EQ(
      CpuOptimizer::BytesPerElement(T::kAdamW, DType::kFloat32, DType::kFloat32, DType::kBFloat16),
      30u);
  EXPECT_EQ(CpuOptimizer::BytesPerElement(T::kAdamW, DType::kFloat32, DType::kBFloat16, {}), 20u);
  EXPECT_EQ(CpuOptimizer::BytesPerElement(T::kAdam, DType::kBFloat16, DType::kBFloat16, {}), 18u);
  EXPECT_EQ(CpuOptimizer::BytesPerElement(T::kAdagrad, DType::kFloat32, DType::kFloat32, {}), 20u);
  EXPECT_EQ(CpuOptimizer::BytesPerElement(T::kLion, DType::kFloat32, DType::kFloat32, {}), 20u);
}

}  // namespace
}  // namespace strata::cpu_optimizer
