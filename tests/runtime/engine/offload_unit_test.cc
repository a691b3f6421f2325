// OffloadUnit and TorchBoundary (runtime/engine/offload_unit.h) with recording hooks instead of
// an engine: a pass-through without hooks, gather/run/release in forward, recompute and gradients
// handed to the hooks in backward, and Statuses that cross libtorch with their code.
#include "runtime/engine/offload_unit.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cerrno>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/runtime/engine/engine_parts.h"

namespace strata {
namespace {

using runtime::engine_testing::TinyNet;

// Records every hook call ("G0" tracked gather, "g0" untracked, "R0", "D0" gradients) and keeps
// the gradients; optionally fails a gather or a gradient hand-off through a TorchBoundary.
class RecordingHooks final : public UnitHooks {
 public:
  explicit RecordingHooks(TinyNet& model) {
    for (size_t i = 0; i < model->blocks->size(); ++i) {
      OffloadUnitImpl* u = model->unit(static_cast<int>(i));
      params.push_back({u->named_parameters()["weight"], u->named_parameters()["bias"]});
      u->Attach(this, static_cast<int>(i));
    }
  }
  void Gather(int unit, bool tracked) override {
    calls.push_back((tracked ? "G" : "g") + std::to_string(unit));
    if (unit == fail_gather) boundary.Throw(DataLossError("unit " + std::to_string(unit)));
  }
  void Release(int unit) override { calls.push_back("R" + std::to_string(unit)); }
  const std::vector<torch::Tensor>& GradParameters(int unit) override { return params[unit]; }
  void GradientsReady(int unit, std::vector<torch::Tensor> g) override {
    calls.push_back("D" + std::to_string(unit));
    if (unit == fail_ready) boundary.Throw(IoErrorFromErrno(EIO, "hand-off"));
    grads[unit] = std::move(g);
  }

  std::vector<std::vector<torch::Tensor>> params;
  std::vector<std::string> calls;
  std::map<int, std::vector<torch::Tensor>> grads;
  TorchBoundary boundary;
  int fail_gather = -1;
  int fail_ready = -1;
};

// Two models with the same initial values: one with hooks attached, one plain.
struct Pair {
  Pair() {
    torch::manual_seed(23);
    hooked = TinyNet(2, 8);
    torch::manual_seed(23);
    plain = TinyNet(2, 8);
    torch::manual_seed(24);
    x = torch::randn({5, 4});
    y = torch::randn({5, 1});
  }
  TinyNet hooked{nullptr}, plain{nullptr};
  torch::Tensor x, y;
};

TEST(OffloadUnitTest, WithoutHooksAUnitIsAPassThrough) {
  torch::nn::Linear inner(3, 2);
  OffloadUnit unit = Offload(inner);
  EXPECT_FALSE(unit->attached());
  EXPECT_EQ(unit->index(), -1);
  const torch::Tensor x = torch::randn({4, 3});
  EXPECT_TRUE(torch::equal(unit->forward(x), inner(x)));
  // The unit adopts the inner module's parameters under their own names.
  const auto params = unit->named_parameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_TRUE(params["weight"].is_same(inner->weight));
  EXPECT_TRUE(params["bias"].is_same(inner->bias));
  TinyNet model(2, 8);
  EXPECT_TRUE(model->named_parameters().contains("blocks.1.weight"));
}

TEST(OffloadUnitTest, ForwardGathersRunsAndReleasesEachUnit) {
  Pair p;
  RecordingHooks hooks(p.hooked);
  EXPECT_TRUE(p.hooked->unit(1)->attached());
  EXPECT_EQ(p.hooked->unit(1)->index(), 1);
  EXPECT_TRUE(torch::equal(p.hooked->forward(p.x), p.plain->forward(p.x)));
  EXPECT_EQ(hooks.calls, (std::vector<std::string>{"G0", "R0", "G1", "R1"}));
  hooks.calls.clear();
  {
    torch::NoGradGuard no_grad;  // evaluation: gathers that are not part of a training pass
    EXPECT_TRUE(torch::equal(p.hooked->forward(p.x), p.plain->forward(p.x)));
  }
  EXPECT_EQ(hooks.calls, (std::vector<std::string>{"g0", "R0", "g1", "R1"}));
}

TEST(OffloadUnitTest, BackwardRecomputesAndHandsGradientsToTheHooks) {
  Pair p;
  RecordingHooks hooks(p.hooked);
  torch::Tensor loss = p.hooked->Loss(p.x, p.y);
  hooks.calls.clear();
  loss.backward();
  EXPECT_EQ(hooks.calls, (std::vector<std::string>{"G1", "D1", "R1", "G0", "D0", "R0"}));
  p.plain->Loss(p.x, p.y).backward();
  for (int u = 0; u < 2; ++u) {
    ASSERT_EQ(hooks.grads[u].size(), 2u);
    const auto want = p.plain->unit(u)->named_parameters();
    EXPECT_TRUE(torch::allclose(hooks.grads[u][0], want["weight"].grad(), 1e-6, 1e-7)) << u;
    EXPECT_TRUE(torch::allclose(hooks.grads[u][1], want["bias"].grad(), 1e-6, 1e-7)) << u;
    // Unit parameters get no .grad: their gradients went to the hooks.
    EXPECT_FALSE(hooks.params[u][0].grad().defined()) << u;
  }
  // The input's gradient flows on through the units to the parameters before them.
  EXPECT_TRUE(
      torch::allclose(p.hooked->stem->weight.grad(), p.plain->stem->weight.grad(), 1e-6, 1e-7));
}

// A unit whose input needs no gradient still builds a graph for its parameters.
TEST(OffloadUnitTest, ParametersGetGradientsWhenTheInputNeedsNone) {
  Pair p;
  RecordingHooks hooks(p.hooked);
  const torch::Tensor h = torch::randn({5, 8});
  p.hooked->unit(0)->forward(h).sum().backward();
  p.plain->unit(0)->forward(h).sum().backward();
  ASSERT_EQ(hooks.grads.count(0), 1u);
  EXPECT_TRUE(
      torch::allclose(hooks.grads[0][0], p.plain->unit(0)->named_parameters()["weight"].grad()));
}

TEST(OffloadUnitTest, BoundaryGivesBackTheThrownStatus) {
  TorchBoundary b;
  try {
    b.Throw(IoErrorFromErrno(EIO, "read /nvme/params.swp"));
  } catch (const c10::Error& e) {
    Status s = b.Take(e);
    EXPECT_EQ(s.code(), StatusCode::kIoError);
    EXPECT_EQ(s.sys_errno(), EIO);
    EXPECT_EQ(s, IoErrorFromErrno(EIO, "read /nvme/params.swp"));
    // Taken once: the same exception again is only a libtorch error.
    Status again = b.Take(e);
    EXPECT_EQ(again.code(), StatusCode::kInternal);
    EXPECT_NE(again.ToString().find("read /nvme/params.swp"), std::string::npos);
  }
}

TEST(OffloadUnitTest, BoundaryMakesForeignExceptionsInternal) {
  TorchBoundary b;
  Status s = b.Take(std::runtime_error("shape mismatch"));
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_EQ(s.message(), "libtorch: shape mismatch");
}

TEST(OffloadUnitTest, HookErrorsCrossLibtorchWithTheirCode) {
  {
    Pair p;
    RecordingHooks hooks(p.hooked);
    hooks.fail_gather = 1;
    try {
      p.hooked->forward(p.x);
      FAIL() << "forward did not throw";
    } catch (const std::exception& e) {
      Status s = hooks.boundary.Take(e);
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
      EXPECT_EQ(s.message(), "unit 1");
    }
  }
  {
    Pair p;
    RecordingHooks hooks(p.hooked);
    hooks.fail_ready = 0;
    torch::Tensor loss = p.hooked->Loss(p.x, p.y);
    try {
      loss.backward();  // thrown on libtorch's autograd engine, rethrown here
      FAIL() << "backward did not throw";
    } catch (const std::exception& e) {
      Status s = hooks.boundary.Take(e);
      EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
      EXPECT_EQ(s.sys_errno(), EIO);
    }
  }
}

TEST(OffloadUnitTest, DetachingBeforeBackwardIsAnError) {
  Pair p;
  RecordingHooks hooks(p.hooked);
  torch::Tensor loss = p.hooked->Loss(p.x, p.y);
  p.hooked->unit(1)->Detach();
  EXPECT_FALSE(p.hooked->unit(1)->attached());
  try {
    loss.backward();
    FAIL() << "backward ran without hooks";
  } catch (const std::exception& e) {
    Status s = hooks.boundary.Take(e);
    EXPECT_EQ(s.code(), StatusCode::kInternal);
    EXPECT_NE(s.ToString().find("was detached before backward"), std::string::npos) << s.ToString();
  }
}

// An inner module whose output says whether it is training.
class ModeProbeImpl : public torch::nn::Module {
 public:
  torch::Tensor forward(torch::Tensor x) { return is_training() ? x : 2 * x; }
};
TORCH_MODULE(ModeProbe);

TEST(OffloadUnitTest, TrainModeReachesTheInnerModule) {
  OffloadUnit unit = Offload(ModeProbe());
  const torch::Tensor x = torch::ones({2});
  EXPECT_TRUE(torch::equal(unit->forward(x), x));
  unit->eval();
  EXPECT_FALSE(unit->is_training());
  EXPECT_TRUE(torch::equal(unit->forward(x), 2 * x));
  unit->train();
  EXPECT_TRUE(torch::equal(unit->forward(x), x));
}

}  // namespace
}  // namespace strata
