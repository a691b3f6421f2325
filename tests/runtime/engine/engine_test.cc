// The Engine facade (runtime/engine/engine.h) on a tiny model: what Create refuses, the layouts it
// moves the optimizer to the CPU for, the accumulation window, Backward's argument check,
// reporting (telemetry, occupancy, learning rate) and errors raised inside a unit's forward coming
// back with their code. Numbers against plain libtorch are engine_exactness_test.cc's.
#include "runtime/engine/engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cerrno>
#include <string>
#include <vector>

#include "runtime/engine/host_tensor_cache.h"
#include "tests/runtime/engine/engine_parts.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using engine_testing::TinyNet;

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    torch::manual_seed(29);
    x_ = torch::randn({6, 4});
    y_ = torch::randn({6, 1});
  }
  EngineOptions Options(Home params, Home optimizer) {
    return engine_testing::Options(params, optimizer, dir_.path());
  }
  Status Create(EngineOptions o) {
    auto e = Engine::Create(TinyNet(2, 8).ptr(), std::move(o));
    return e.ok() ? Status::Ok() : e.status();
  }

  testing::TempDir dir_{"strata-engine-test"};
  torch::Tensor x_, y_;
};

TEST_F(EngineTest, CreateRefusesWhatCannotRun) {
  struct Case {
    std::string name;
    EngineOptions options;
    std::string says;
  };
  std::vector<Case> cases;
  cases.push_back({"accumulation", Options(Home::kDevice, Home::kCpu), "gradient_accumulation"});
  cases.back().options.gradient_accumulation_steps = 0;
  cases.push_back({"fp16 loss scaler", Options(Home::kDevice, Home::kCpu), "fp16.hysteresis"});
  cases.back().options.precision = DType::kFloat16;
  cases.back().options.fp16.hysteresis = 0;
  cases.push_back({"Lion without offload", Options(Home::kDevice, Home::kDevice), "Lion"});
  cases.back().options.optimizer_options.type = cpu_optimizer::OptimizerType::kLion;
  cases.push_back({"bad optimizer options", Options(Home::kDevice, Home::kCpu), "lr"});
  cases.back().options.optimizer_options.lr = -1;
  for (const Case& c : cases) {
    Status s = Create(c.options);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.name << ": " << s.ToString();
    EXPECT_NE(s.ToString().find(c.says), std::string::npos) << c.name << ": " << s.ToString();
  }
  auto none = Engine::Create(nullptr, Options(Home::kDevice, Home::kCpu));
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
}

// Layouts DeepSpeed runs with the optimizer on the device, which strata has no device optimizer
// for, run the CPU optimizer with pinned host state and say so (plan/placement.h); plain fp32
// without offload keeps torch::optim. (bf16, whose tensors TinyNet's fp32 input cannot meet, is
// engine_exactness_test.cc's Bf16ModesAgreeAndTrackFp32.)
TEST_F(EngineTest, OptimizerLeftOnTheDeviceRunsOnTheCpuWhereNeeded) {
  struct Case {
    Home params;
    DType precision;
    bool moved;
  };
  for (const Case& c :
       {Case{Home::kCpu, DType::kFloat32, true}, Case{Home::kNvme, DType::kFloat32, true},
        Case{Home::kDevice, DType::kFloat16, true}, Case{Home::kDevice, DType::kFloat32, false}}) {
    SCOPED_TRACE(std::string(HomeName(c.params)) + " " + std::string(DTypeName(c.precision)));
    EngineOptions o = Options(c.params, Home::kDevice);
    o.precision = c.precision;
    o.fp16.initial_scale_power = 8;  // TinyNet's gradients overflow fp16 at DeepSpeed's 2^16
    TinyNet model(2, 8);
    auto e = Engine::Create(model.ptr(), o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    Engine& engine = **e;
    EXPECT_EQ(engine.offloaded(), c.moved);
    EXPECT_EQ(engine.options().optimizer, c.moved ? Home::kCpu : Home::kDevice);
    ASSERT_EQ(engine.options().warnings.size(), c.moved ? 1u : 0u);
    if (c.moved) {
      EXPECT_NE(engine.options().warnings[0].find("pinned host memory"), std::string::npos)
          << engine.options().warnings[0];
    }
    auto before = engine.ParameterValues();
    ASSERT_TRUE(before.ok());
    STRATA_ASSERT_OK(engine.Backward(model->Loss(x_, y_)));
    STRATA_ASSERT_OK(engine.Step());
    auto after = engine.ParameterValues();
    ASSERT_TRUE(after.ok());
    EXPECT_FALSE(torch::equal((*before)[0].second, (*after)[0].second));
  }
}

TEST_F(EngineTest, StepActsOnlyAtTheAccumulationBoundary) {
  for (Home home : {Home::kDevice, Home::kNvme}) {
    SCOPED_TRACE(std::string(HomeName(home)));
    EngineOptions o = Options(home, home);
    o.gradient_accumulation_steps = 3;
    TinyNet model(2, 8);
    auto e = Engine::Create(model.ptr(), o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    Engine& engine = **e;
    EXPECT_EQ(engine.offloaded(), home != Home::kDevice);
    STRATA_ASSERT_OK(engine.Step());  // nothing accumulated yet: a no-op
    EXPECT_EQ(engine.global_steps(), 0);
    auto before = engine.ParameterValues();
    ASSERT_TRUE(before.ok());
    for (int m = 1; m <= 3; ++m) {
      STRATA_ASSERT_OK(engine.Backward(model->Loss(x_, y_)));
      EXPECT_EQ(engine.micro_steps(), m);
      EXPECT_EQ(engine.IsAccumulationBoundary(), m == 3);
      STRATA_ASSERT_OK(engine.Step());
      EXPECT_EQ(engine.global_steps(), m == 3 ? 1 : 0);
      auto now = engine.ParameterValues();
      ASSERT_TRUE(now.ok());
      EXPECT_EQ(torch::equal((*before)[0].second, (*now)[0].second), m < 3) << "micro-step " << m;
    }
    EXPECT_GT(engine.last_grad_norm(), 0);
  }
}

// The process-wide allocator is the engine's to install only when asked (EngineOptions::
// host_tensor_cache_bytes): an embedder that passes 0 keeps libtorch's. Each ctest test is its own
// process, so nothing installed it before.
TEST_F(EngineTest, TheHostTensorCacheIsInstalledOnlyWhenAskedFor) {
  ASSERT_FALSE(HostTensorCache::installed());
  EngineOptions embedder = Options(Home::kCpu, Home::kCpu);
  embedder.host_tensor_cache_bytes = 0;
  ASSERT_TRUE(Create(embedder).ok());
  EXPECT_FALSE(HostTensorCache::installed());
  ASSERT_TRUE(Create(Options(Home::kCpu, Home::kCpu)).ok());  // the default: 1 GiB
  EXPECT_TRUE(HostTensorCache::installed());
}

TEST_F(EngineTest, BackwardNeedsAScalarLoss) {
  TinyNet model(2, 8);
  auto e = Engine::Create(model.ptr(), Options(Home::kCpu, Home::kCpu));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ((*e)->Backward(model->forward(x_)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*e)->Backward(torch::Tensor()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*e)->micro_steps(), 0);
}

TEST_F(EngineTest, ReportsComeFromTheParts) {
  EngineOptions o = Options(Home::kNvme, Home::kNvme);
  o.lr_at = [](int64_t steps) { return 0.1 / (steps + 1); };
  TinyNet model(2, 8);
  auto e = Engine::Create(model.ptr(), o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  Engine& engine = **e;
  EXPECT_DOUBLE_EQ(engine.learning_rate(), 0.1);
  STRATA_ASSERT_OK(engine.Backward(model->Loss(x_, y_)));
  STRATA_ASSERT_OK(engine.Step());
  EXPECT_DOUBLE_EQ(engine.learning_rate(), 0.05);
  const Engine::Occupancy occ = engine.occupancy();
  EXPECT_EQ(occ.pinned_capacity, engine.pinned_arena_bytes());
  EXPECT_GT(occ.pinned_peak, 0u);
  EXPECT_GT(occ.device_used, 0u);  // the resident parameters
  EXPECT_LE(occ.device_used, occ.device_budget);
  EXPECT_GT(engine.telemetry().pinned_to_nvme, 0u);

  TinyNet plain(2, 8);
  auto n = Engine::Create(plain.ptr(), Options(Home::kDevice, Home::kDevice));
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE((*n)->offloaded());
  EXPECT_EQ((*n)->pinned_arena_bytes(), 0u);
  EXPECT_EQ((*n)->telemetry().pinned_to_nvme, 0u);
  EXPECT_EQ((*n)->occupancy().device_budget, 0u);
}

// An NVMe read error inside a unit's forward (the model's code, not the engine's, catches it)
// comes back from ErrorFromException as kIoError, not as a generic libtorch error.
TEST_F(EngineTest, ErrorsInAUnitsForwardComeBackWithTheirCode) {
  EngineOptions o = Options(Home::kNvme, Home::kNvme);
  o.param_buffer_count = 2;  // two pinned unit slots: after initialization they hold units 2 and 3
  TinyNet model(4, 8);
  auto e = Engine::Create(model.ptr(), o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  engine_testing::SwapFileFault fault(dir_.path(), "params", O_WRONLY);
  ASSERT_TRUE(fault.ok());
  try {
    model->Loss(x_, y_);
    FAIL() << "forward read an unreadable file";
  } catch (const std::exception& ex) {
    Status s = (*e)->ErrorFromException(ex);
    EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
    EXPECT_EQ(s.sys_errno(), EBADF) << s.ToString();
    EXPECT_NE(s.ToString().find("gathering blocks."), std::string::npos) << s.ToString();
  }
}

}  // namespace
}  // namespace strata::runtime
