// The I/O replays of `strata bench step` (runtime/engine/io_replay.h), through an Engine: refused
// without offload or before a pass, a pass replayed along the recorded order (gathers and
// gradient hand-offs, seen in the TierManager and the gradient pipeline), an optimizer step's
// reads and writes, and the element counts.
#include "runtime/engine/io_replay.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "runtime/engine/engine_impl.h"
#include "tests/runtime/engine/engine_parts.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using engine_testing::TinyNet;

constexpr uint64_t kPage = 4096;

class IoReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    torch::manual_seed(41);
    x_ = torch::randn({6, 4});
    y_ = torch::randn({6, 1});
  }
  // Three units of one page (32x32 weights; biases resident); the device holds two of them.
  std::unique_ptr<Engine> Make(TinyNet& model, Home home) {
    EngineOptions o = engine_testing::Options(home, home, dir_.path());
    o.persistence_threshold = 32;
    o.sub_group_size = 512;
    if (home != Home::kDevice) o.device_budget = 3 * kPage;
    auto e = Engine::Create(model.ptr(), o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(*e) : nullptr;
  }

  testing::TempDir dir_{"strata-io-replay-test"};
  torch::Tensor x_, y_;
};

TEST_F(IoReplayTest, RefusedWithoutOffloadOrBeforeAPass) {
  TinyNet plain(3, 32);
  auto none = Make(plain, Home::kDevice);
  ASSERT_NE(none, nullptr);
  EXPECT_EQ(ReplayPassIo(*none).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReplayOptimizerIo(*none).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(OptimizerElements(*none), 0u);
  EXPECT_EQ(LargestSubGroupElements(*none), 0u);

  TinyNet model(3, 32);
  auto e = Make(model, Home::kNvme);
  ASSERT_NE(e, nullptr);
  Status s = ReplayPassIo(*e);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.ToString().find("no recorded pass"), std::string::npos) << s.ToString();
}

TEST_F(IoReplayTest, PassReplayGathersAlongTheTraceAndHandsOffGradients) {
  TinyNet model(3, 32);
  auto e = Make(model, Home::kNvme);
  ASSERT_NE(e, nullptr);
  STRATA_ASSERT_OK(e->Backward(model->Loss(x_, y_)));
  STRATA_ASSERT_OK(e->Step());
  STRATA_ASSERT_OK(e->FinishStep());
  Engine::Impl& m = *e->impl();
  const std::vector<int> trace = m.coordinator->trace();
  ASSERT_EQ(trace, (std::vector<int>{0, 1, 2, 2, 1, 0}));
  for (size_t si = 0; si < m.layout.subgroups.size(); ++si) {
    ASSERT_EQ(m.grads->micro_batches(static_cast<int>(si)), 0);
  }
  const TierTelemetry before = e->telemetry();
  STRATA_ASSERT_OK(ReplayPassIo(*e));
  const TierTelemetry after = e->telemetry();
  // Two of three units fit on the device: a pass copies at least two unit blocks there again.
  EXPECT_GE(after.pinned_to_device - before.pinned_to_device, 2 * kPage);
  // Every sub-group got (zero) gradients, once, where backward would hand them off.
  for (size_t si = 0; si < m.layout.subgroups.size(); ++si) {
    EXPECT_EQ(m.grads->micro_batches(static_cast<int>(si)), 1) << si;
  }
  EXPECT_EQ(m.coordinator->trace(), trace);
  for (int u = 0; u < 3; ++u) {
    EXPECT_EQ(model->unit(u)->named_parameters()["weight"].numel(), 0) << "released " << u;
  }
}

TEST_F(IoReplayTest, OptimizerReplayReadsAndWritesTheState) {
  TinyNet model(3, 32);
  auto e = Make(model, Home::kNvme);
  ASSERT_NE(e, nullptr);
  STRATA_ASSERT_OK(e->Backward(model->Loss(x_, y_)));
  STRATA_ASSERT_OK(e->Step());
  STRATA_ASSERT_OK(ReplayPassIo(*e));
  const TierTelemetry before = e->telemetry();
  STRATA_ASSERT_OK(ReplayOptimizerIo(*e));
  const TierTelemetry after = e->telemetry();
  // Every state block (12 bytes per element) and every NVMe-homed parameter block is written.
  const uint64_t elements = OptimizerElements(*e);
  EXPECT_GE(after.pinned_to_nvme - before.pinned_to_nvme, elements * 12);
  EXPECT_EQ(e->global_steps(), 1);  // a replay is not a step
  for (size_t si = 0; si < e->impl()->layout.subgroups.size(); ++si) {
    EXPECT_EQ(e->impl()->grads->micro_batches(static_cast<int>(si)), 0) << si;
  }
  // Training goes on after the replays.
  STRATA_ASSERT_OK(e->Backward(model->Loss(x_, y_)));
  STRATA_ASSERT_OK(e->Step());
  EXPECT_EQ(e->global_steps(), 2);
}

TEST_F(IoReplayTest, ElementCounts) {
  TinyNet model(3, 32);
  uint64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  auto e = Make(model, Home::kCpu);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(OptimizerElements(*e), n);
  EXPECT_EQ(LargestSubGroupElements(*e), 512u);
}

}  // namespace
}  // namespace strata::runtime
