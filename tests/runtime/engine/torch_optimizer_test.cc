// TorchOptimizer (runtime/engine/torch_optimizer.h), the no-offload mode's optimizer, against
// torch::optim with DeepSpeed's clipping done by hand: the same parameters bitwise, the norm, the
// learning rate per step, the communicator's reduction, and Save/Load.
#include "runtime/engine/torch_optimizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tests/runtime/engine/engine_parts.h"

namespace strata::runtime {
namespace {

using cpu_optimizer::OptimizerType;
using engine_testing::TinyNet;

// Two copies of one model: the one TorchOptimizer steps and the reference.
struct Twins {
  Twins() {
    torch::manual_seed(17);
    mine = TinyNet(2, 8);
    torch::manual_seed(17);
    ref = TinyNet(2, 8);
  }
  // One micro-batch of seeded data through both.
  void Backward(int seed) {
    torch::manual_seed(seed);
    const torch::Tensor x = torch::randn({6, 4}), y = torch::randn({6, 1});
    mine->Loss(x, y).backward();
    ref->Loss(x, y).backward();
  }
  TinyNet mine{nullptr}, ref{nullptr};
};

// The reference clipping: global norm in double over every gradient, DeepSpeed's coefficient.
double ClipByHand(torch::nn::Module& m, double max_norm) {
  double total = 0;
  for (const auto& p : m.parameters()) {
    if (p.grad().defined()) total += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  }
  const double norm = std::sqrt(total);
  const double c = (norm + 1e-6) / max_norm;
  torch::NoGradGuard no_grad;
  if (max_norm > 0 && c > 1) {
    for (auto& p : m.parameters()) {
      if (p.grad().defined()) p.mutable_grad().mul_(1.0 / c);
    }
  }
  return norm;
}

void ExpectSameParameters(torch::nn::Module& a, torch::nn::Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa[i].value(), pb[i].value()))
        << pa[i].key() << " max diff " << (pa[i].value() - pb[i].value()).abs().max().item<float>();
  }
}

// `to`'s parameters set to `from`'s values (same architecture).
void CopyParameters(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  const auto src = from.parameters();
  auto dst = to.parameters();
  for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
}

EngineOptions Options(OptimizerType type, double clip) {
  EngineOptions o;
  o.optimizer_options = cpu_optimizer::OptimizerOptions::Defaults(type);
  o.optimizer_options.weight_decay = 0.01;
  o.gradient_clipping = clip;
  o.communicator = MakeSingleRankCommunicator();
  return o;
}

TEST(TorchOptimizerTest, AdamWStepsEqualTorchOptimWithClipping) {
  for (double clip : {0.0, 0.05, 1e6}) {
    SCOPED_TRACE("clip " + std::to_string(clip));
    Twins t;
    const EngineOptions o = Options(OptimizerType::kAdamW, clip);
    TorchOptimizer mine(*t.mine, o);
    torch::optim::AdamW ref(t.ref->parameters(),
                            torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
    for (int step = 0; step < 3; ++step) {
      const double lr = 1e-2 / (step + 1);  // the engine's schedule sets it per step
      t.Backward(step);
      const double want_norm = ClipByHand(*t.ref, clip);
      for (auto& g : ref.param_groups()) g.options().set_lr(lr);
      ref.step();
      for (auto& p : t.ref->parameters()) p.mutable_grad() = torch::Tensor();
      double norm = -1;
      STRATA_ASSERT_OK(mine.Step(lr, &norm));
      EXPECT_EQ(norm, want_norm);
      for (const auto& p : t.mine->parameters()) EXPECT_FALSE(p.grad().defined());
    }
    ExpectSameParameters(*t.mine, *t.ref);
  }
}

TEST(TorchOptimizerTest, AdamAndAdagradStepsEqualTorchOptim) {
  for (OptimizerType type : {OptimizerType::kAdam, OptimizerType::kAdagrad}) {
    SCOPED_TRACE(std::string(cpu_optimizer::OptimizerTypeName(type)));
    Twins t;
    EngineOptions o = Options(type, 0.0);
    o.optimizer_options.lr_decay = type == OptimizerType::kAdagrad ? 0.1 : 0.0;
    o.optimizer_options.initial_accumulator_value = type == OptimizerType::kAdagrad ? 0.2 : 0.0;
    TorchOptimizer mine(*t.mine, o);
    std::unique_ptr<torch::optim::Optimizer> ref;
    if (type == OptimizerType::kAdam) {
      ref = std::make_unique<torch::optim::Adam>(
          t.ref->parameters(), torch::optim::AdamOptions(0.05).weight_decay(0.01));
    } else {
      ref = std::make_unique<torch::optim::Adagrad>(t.ref->parameters(),
                                                    torch::optim::AdagradOptions(0.05)
                                                        .weight_decay(0.01)
                                                        .lr_decay(0.1)
                                                        .initial_accumulator_value(0.2)
                                                        .eps(o.optimizer_options.eps));
    }
    for (int step = 0; step < 3; ++step) {
      t.Backward(10 + step);
      ref->step();
      for (auto& p : t.ref->parameters()) p.mutable_grad() = torch::Tensor();
      double norm = 0;
      STRATA_ASSERT_OK(mine.Step(0.05, &norm));
    }
    ExpectSameParameters(*t.mine, *t.ref);
  }
}

// Parameters without a gradient (or frozen) are neither counted in the norm nor stepped (no
// weight decay either).
TEST(TorchOptimizerTest, ParametersWithoutGradientsAreLeftAlone) {
  Twins t;
  t.mine->head->bias.set_requires_grad(false);
  const torch::Tensor frozen = t.mine->head->bias.clone();
  const EngineOptions o = Options(OptimizerType::kAdamW, 0.0);  // outlives the optimizer
  TorchOptimizer mine(*t.mine, o);
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({6, 4}), y = torch::randn({6, 1});
  t.mine->Loss(x, y).backward();
  t.mine->stem->weight.mutable_grad() = torch::Tensor();  // no gradient this step
  const torch::Tensor untouched = t.mine->stem->weight.clone();
  double total = 0;
  for (const auto& p : t.mine->parameters()) {
    if (p.grad().defined()) total += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  }
  double norm = 0;
  STRATA_ASSERT_OK(mine.Step(1e-2, &norm));
  EXPECT_EQ(norm, std::sqrt(total));
  EXPECT_TRUE(torch::equal(t.mine->stem->weight, untouched));
  EXPECT_TRUE(torch::equal(t.mine->head->bias, frozen));
  EXPECT_FALSE(torch::equal(t.mine->stem->bias, t.ref->stem->bias));  // stepped
}

// A communicator of four identical ranks: a reduced sum is four times the local one.
class FourRanks final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 4; }
  Status AllReduceSum(double* values, size_t count) override {
    ++calls;
    for (size_t i = 0; i < count; ++i) values[i] *= 4;
    return Status::Ok();
  }
  std::string backend() const override { return "fake"; }
  Status AllReduceSumFloat(float* values, size_t count) override {
    ++calls;
    for (size_t i = 0; i < count; ++i) values[i] *= 4;
    return Status::Ok();
  }
  Status AllGather(const void*, void*, size_t) override { return Status::Ok(); }
  Status ReduceScatterSum(const float*, float*, size_t) override { return Status::Ok(); }
  Status Broadcast(void*, size_t, int) override { return Status::Ok(); }
  Status Barrier() override { return Status::Ok(); }
  int calls = 0;
};

TEST(TorchOptimizerTest, GradientsAreSummedAcrossRanksBeforeTheNorm) {
  Twins t;
  EngineOptions o = Options(OptimizerType::kAdamW, 0.0);
  auto ranks = std::make_shared<FourRanks>();
  o.communicator = ranks;
  TorchOptimizer mine(*t.mine, o);
  t.Backward(3);
  const double local = ClipByHand(*t.ref, 0.0);
  double norm = 0;
  STRATA_ASSERT_OK(mine.Step(1e-2, &norm));
  // The gradients are all-reduced once (one flat buffer) and divided by the world size: four
  // identical ranks give the local gradients, and the local norm.
  EXPECT_EQ(ranks->calls, 1);
  EXPECT_NEAR(norm, local, 1e-6 * local);
}

TEST(TorchOptimizerTest, SaveAndLoadResumeTheSameSteps) {
  Twins t;
  const EngineOptions o = Options(OptimizerType::kAdamW, 0.0);
  TorchOptimizer a(*t.mine, o);
  auto empty = a.Save();
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, "");  // nothing before the first step
  double norm = 0;
  for (int step = 0; step < 2; ++step) {
    t.Backward(20 + step);
    STRATA_ASSERT_OK(a.Step(1e-2, &norm));
  }
  auto saved = a.Save();
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  ASSERT_FALSE(saved->empty());

  // A second model with a's parameters and the loaded state steps exactly as a does.
  CopyParameters(*t.mine, *t.ref);
  for (auto& p : t.ref->parameters()) p.mutable_grad() = torch::Tensor();
  TorchOptimizer b(*t.ref, o);
  STRATA_ASSERT_OK(b.Load(*saved, 1e-2));
  t.Backward(30);
  STRATA_ASSERT_OK(a.Step(1e-2, &norm));
  STRATA_ASSERT_OK(b.Step(1e-2, &norm));
  ExpectSameParameters(*t.mine, *t.ref);

  // A fresh optimizer (moments zero, step 1) would not.
  Twins u;
  TorchOptimizer fresh(*u.ref, o);
  CopyParameters(*t.mine, *u.ref);
  t.Backward(31);
  u.Backward(31);
  STRATA_ASSERT_OK(a.Step(1e-2, &norm));
  STRATA_ASSERT_OK(fresh.Step(1e-2, &norm));
  EXPECT_FALSE(torch::equal(t.mine->stem->weight, u.ref->stem->weight));
}

TEST(TorchOptimizerTest, AdamAndAdagradStateRoundTripsBitwise) {
  for (OptimizerType type : {OptimizerType::kAdam, OptimizerType::kAdagrad}) {
    SCOPED_TRACE(static_cast<int>(type));
    Twins t;
    const EngineOptions o = Options(type, 0.0);
    TorchOptimizer a(*t.mine, o);
    double norm = 0;
    t.Backward(40);
    STRATA_ASSERT_OK(a.Step(1e-2, &norm));
    auto saved = a.Save();
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    CopyParameters(*t.mine, *t.ref);
    for (auto& p : t.ref->parameters()) p.mutable_grad() = torch::Tensor();
    TorchOptimizer b(*t.ref, o);
    STRATA_ASSERT_OK(b.Load(*saved, 1e-2));
    t.Backward(41);
    STRATA_ASSERT_OK(a.Step(1e-2, &norm));
    STRATA_ASSERT_OK(b.Step(1e-2, &norm));
    ExpectSameParameters(*t.mine, *t.ref);
  }
}

TEST(TorchOptimizerTest, GarbageStateIsRefused) {
  Twins t;
  const EngineOptions o = Options(OptimizerType::kAdamW, 0.0);
  TorchOptimizer a(*t.mine, o);
  Status s = a.Load("not an archive", 1e-2);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.ToString().find("torch_optimizer.bin"), std::string::npos) << s.ToString();
}

// torch::optim's own serialization (what strata wrote before) is a TorchScript archive, whose
// loading runs the code it carries: never loaded.
TEST(TorchOptimizerTest, ATorchScriptArchiveIsNotLoaded) {
  Twins t;
  const EngineOptions o = Options(OptimizerType::kAdamW, 0.0);
  TorchOptimizer a(*t.mine, o);
  torch::optim::AdamW reference(t.ref->parameters(), torch::optim::AdamWOptions(1e-2));
  t.Backward(5);
  reference.step();
  std::ostringstream os;
  torch::serialize::OutputArchive archive;
  reference.save(archive);
  archive.save_to(os);
  const Status s = a.Load(os.str(), 1e-2);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.ToString().find("TorchScript archive"), std::string::npos) << s.ToString();
}

// Whatever the bytes, Load returns a Status: every truncation is refused, and flipped bytes
// anywhere are refused or give a state of the right shapes (never a crash or an exception).
TEST(TorchOptimizerTest, DamagedStateIsRefusedWithoutACrash) {
  Twins t;
  const EngineOptions o = Options(OptimizerType::kAdamW, 0.0);
  TorchOptimizer a(*t.mine, o);
  double norm = 0;
  t.Backward(7);
  STRATA_ASSERT_OK(a.Step(1e-2, &norm));
  auto saved = a.Save();
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  for (size_t n = 0; n < saved->size(); n += 1 + n / 16) {
    TorchOptimizer b(*t.ref, o);
    const Status s = b.Load(saved->substr(0, n), 1e-2);
    EXPECT_FALSE(s.ok()) << "truncated to " << n << " of " << saved->size();
  }
  for (size_t i = 0; i < saved->size(); i += 1 + i / 64) {
    std::string bad = *saved;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    TorchOptimizer b(*t.ref, o);
    const Status s = b.Load(bad, 1e-2);
    if (s.ok()) {  // only the tensors' values, or a field that stays valid, changed
      t.Backward(8);
      STRATA_EXPECT_OK(b.Step(1e-2, &norm));
    }
  }
}

TEST(TorchOptimizerTest, LionIsRefused) {
  Twins t;
  const EngineOptions o = Options(OptimizerType::kLion, 0.0);
  TorchOptimizer a(*t.mine, o);
  t.Backward(1);
  double norm = 0;
  Status s = a.Step(1e-4, &norm);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.ToString().find("Lion"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace strata::runtime
