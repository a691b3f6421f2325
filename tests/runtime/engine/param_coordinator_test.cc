// ParamCoordinator (runtime/engine/param_coordinator.h) driven directly (Gather/Release/EndPass
// as the units would call them) over a real StateStore: gathers point the parameters at device
// memory and releases empty them, nested gathers, the order recorded on the first pass and
// prefetched along on the next (seen in the TierManager before the gather), a changed order
// re-recorded with a warning, conditional units kept out of the order and fetched when announced
// (Expect), by replay or by the history rule, and failures thrown through the TorchBoundary.
#include "runtime/engine/param_coordinator.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "base/logging.h"
#include "tests/runtime/engine/engine_parts.h"
#include "tests/testing/temp_dir.h"
#include "tiers/host_device.h"

namespace strata::runtime {
namespace {

using engine_testing::FirstDifference;
using engine_testing::Floats;
using engine_testing::Parts;
using engine_testing::TinyNet;

constexpr int64_t kD = 32;  // a unit's weight: 1024 fp32 = exactly one 4 KiB page
constexpr uint64_t kPage = 4096;
const std::vector<int> kOrder = {0, 1, 2, 2, 1, 0};  // forward, then backward

class ParamCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    SetLogLevel(LogLevel::kInfo);
  }

  // Units hold only their 32x32 weight (biases stay resident); the resident group is one page.
  EngineOptions Options(Home params) {
    EngineOptions o =
        engine_testing::Options(params, params == Home::kDevice ? Home::kCpu : params, dir_.path());
    o.persistence_threshold = kD;
    o.sub_group_size = 256;  // state blocks of one page
    return o;
  }
  // `units` units, those in `conditional` marked so (as SparseMoe marks its experts).
  std::unique_ptr<Parts> Make(EngineOptions o, bool grads = false, int units = 3,
                              const std::vector<int>& conditional = {}) {
    torch::manual_seed(3);
    model_ = TinyNet(units, kD);
    for (int u : conditional) model_->unit(u)->set_conditional(true);
    auto p = Parts::Create(model_.ptr(), std::move(o), {.grads = grads, .optimizer = grads});
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(*p) : nullptr;
  }
  torch::Tensor Weight(int u) { return model_->unit(u)->named_parameters()["weight"]; }
  // Gathers along `order` (each gather released at once), checking the values each time.
  void Pass(Parts& p, const std::vector<int>& order) {
    for (int u : order) {
      p.coordinator->Gather(u, /*tracked=*/true);
      ASSERT_EQ(Weight(u).numel(), kD * kD) << "unit " << u;
      ASSERT_EQ(FirstDifference(Floats(Weight(u)), p.initial[u]), -1) << "unit " << u;
      p.coordinator->Release(u);
    }
    p.coordinator->EndPass();
  }
  static bool Fetched(Parts& p, int u) {
    const BlockId b = p.store->group(u).block;
    return p.store->tm().IsValid(b, Tier::kPinned) || p.store->tm().IsValid(b, Tier::kDevice);
  }

  testing::TempDir dir_{"strata-coordinator-test"};
  TinyNet model_{nullptr};
};

TEST_F(ParamCoordinatorTest, GatherPointsParametersAtDeviceMemoryAndReleaseEmptiesThem) {
  auto p = Make(Options(Home::kCpu));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(Weight(1).numel(), 0);
  const torch::Tensor bias = model_->unit(1)->named_parameters()["bias"];
  const void* bias_at = bias.data_ptr();  // resident: on the device all along

  p->coordinator->Gather(1, /*tracked=*/false);
  ASSERT_EQ(Weight(1).sizes().vec(), (std::vector<int64_t>{kD, kD}));
  EXPECT_EQ(FirstDifference(Floats(Weight(1)), p->initial[1]), -1);
  {
    auto pin = p->store->tm().Acquire(p->store->group(1).block, Tier::kDevice);
    ASSERT_TRUE(pin.ok());
    ASSERT_TRUE(pin->Wait().ok());
    EXPECT_EQ(Weight(1).data_ptr(), pin->data());  // the device copy itself, not a host copy
  }
  EXPECT_EQ(Weight(0).numel(), 0);  // only the gathered unit
  p->coordinator->Release(1);
  EXPECT_EQ(Weight(1).numel(), 0);
  EXPECT_EQ(bias.data_ptr(), bias_at);
  EXPECT_EQ(bias.numel(), kD);
}

TEST_F(ParamCoordinatorTest, NestedGathersReleaseAtTheOutermost) {
  auto p = Make(Options(Home::kNvme));
  ASSERT_NE(p, nullptr);
  p->coordinator->Gather(2, false);
  p->coordinator->Gather(2, false);
  p->coordinator->Release(2);
  ASSERT_EQ(Weight(2).numel(), kD * kD);  // still held by the outer gather
  EXPECT_EQ(FirstDifference(Floats(Weight(2)), p->initial[2]), -1);
  p->coordinator->Release(2);
  EXPECT_EQ(Weight(2).numel(), 0);
}

TEST_F(ParamCoordinatorTest, DeviceHomesAreAlwaysGathered) {
  auto p = Make(Options(Home::kDevice));
  ASSERT_NE(p, nullptr);
  const void* at = Weight(0).data_ptr();
  ASSERT_EQ(Weight(0).numel(), kD * kD);
  p->coordinator->Gather(0, true);
  p->coordinator->Release(0);
  EXPECT_EQ(Weight(0).data_ptr(), at);
  EXPECT_EQ(Weight(0).numel(), kD * kD);
  p->coordinator->EndPass();
  EXPECT_EQ(p->coordinator->trace(), (std::vector<int>{0}));  // recorded all the same
}

// Device budget: the resident page plus two unit pages (3 units do not fit). The first pass copies
// each unit to the device inside its gather; the second, following the recorded order, has unit 2
// on the device before anything asks for it, and gathering it then moves nothing.
TEST_F(ParamCoordinatorTest, TraceIsRecordedOnTheFirstPassAndPrefetchedOnTheNext) {
  EngineOptions o = Options(Home::kCpu);
  o.device_budget = 3 * kPage;
  auto p = Make(o);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(p->store->device_slots(), 2u);
  ParamCoordinator& c = *p->coordinator;
  TierManager& tm = p->store->tm();
  auto on_device = [&](int u) { return tm.IsValid(p->store->group(u).block, Tier::kDevice); };
  EXPECT_FALSE(c.has_trace());
  ASSERT_EQ(tm.telemetry().pinned_to_device, 0u);

  // Pass 1 (recording): nothing moves ahead of the gathers.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(tm.telemetry().pinned_to_device, i * kPage) << "before gathering unit " << i;
    EXPECT_FALSE(on_device(i));
    c.Gather(kOrder[i], true);
    c.Release(kOrder[i]);
  }
  for (int i = 3; i < 6; ++i) {
    c.Gather(kOrder[i], true);
    c.Release(kOrder[i]);
  }
  c.EndPass();
  ASSERT_TRUE(c.has_trace());
  EXPECT_EQ(c.trace(), kOrder);

  // Pass 2: gathering unit 1 starts unit 2's copy (evicted at the end of pass 1).
  ASSERT_FALSE(on_device(2));
  c.Gather(0, true);
  c.Release(0);
  const uint64_t before = tm.telemetry().pinned_to_device;
  c.Gather(1, true);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!on_device(2) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(on_device(2)) << "unit 2 was not prefetched";
  EXPECT_EQ(tm.telemetry().pinned_to_device, before + kPage);
  c.Release(1);
  c.Gather(2, true);  // already there: no copy
  EXPECT_EQ(tm.telemetry().pinned_to_device, before + kPage);
  EXPECT_EQ(FirstDifference(Floats(Weight(2)), p->initial[2]), -1);
  c.Release(2);
  for (int i = 3; i < 6; ++i) {  // the rest of the pass computes with the right values
    c.Gather(kOrder[i], true);
    ASSERT_EQ(FirstDifference(Floats(Weight(kOrder[i])), p->initial[kOrder[i]]), -1) << i;
    c.Release(kOrder[i]);
  }
  c.EndPass();
  EXPECT_EQ(c.trace(), kOrder);
}

TEST_F(ParamCoordinatorTest, ChangedOrderIsReRecordedWithAWarning) {
  EngineOptions o = Options(Home::kNvme);
  o.device_budget = 3 * kPage;
  auto p = Make(o);
  ASSERT_NE(p, nullptr);
  ParamCoordinator& c = *p->coordinator;
  Pass(*p, kOrder);
  ASSERT_EQ(c.trace(), kOrder);

  const std::vector<int> changed = {2, 0, 1, 1, 0, 2};
  ::testing::internal::CaptureStderr();
  Pass(*p, changed);
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("offload units ran in a new order (position 0: expected blocks.0, got "
                     "blocks.2)"),
            std::string::npos)
      << log;
  EXPECT_EQ(c.trace(), changed);

  ::testing::internal::CaptureStderr();
  Pass(*p, changed);  // the new order is followed without complaint
  log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(log.find("new order"), std::string::npos) << log;
  EXPECT_EQ(c.trace(), changed);

  ::testing::internal::CaptureStderr();
  Pass(*p, {2, 0});  // a pass that ends early
  log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("the pass gathered 2 units, the recorded one 6; re-recording"),
            std::string::npos)
      << log;
  EXPECT_EQ(c.trace(), (std::vector<int>{2, 0}));
}

TEST_F(ParamCoordinatorTest, UntrackedGathersRecordNothingAndInvalidateForgets) {
  auto p = Make(Options(Home::kCpu));
  ASSERT_NE(p, nullptr);
  ParamCoordinator& c = *p->coordinator;
  for (int u : {0, 1, 2}) {
    c.Gather(u, /*tracked=*/false);
    c.Release(u);
  }
  c.EndPass();
  EXPECT_FALSE(c.has_trace());
  Pass(*p, {0, 1});
  EXPECT_TRUE(c.has_trace());
  c.Invalidate();
  EXPECT_FALSE(c.has_trace());
  Pass(*p, {1, 0});
  EXPECT_EQ(c.trace(), (std::vector<int>{1, 0}));
}

// Through the model: a forward and backward gather in the order the model runs its units.
TEST_F(ParamCoordinatorTest, ModelPassesRecordForwardThenBackwardOrder) {
  auto p = Make(Options(Home::kNvme), /*grads=*/true);
  ASSERT_NE(p, nullptr);
  torch::manual_seed(3);
  TinyNet plain(3, kD);  // the same initial values, no engine
  torch::manual_seed(11);
  const torch::Tensor x = torch::randn({5, 4}), y = torch::randn({5, 1});
  for (int pass = 0; pass < 2; ++pass) {
    torch::Tensor loss = model_->Loss(x, y);
    EXPECT_EQ(loss.item<float>(), plain->Loss(x, y).item<float>()) << "pass " << pass;
    loss.backward();
    STRATA_ASSERT_OK(p->grads->Drain());
    p->coordinator->EndPass();
    EXPECT_EQ(p->coordinator->trace(), kOrder);
    for (int u = 0; u < 3; ++u) EXPECT_EQ(Weight(u).numel(), 0);  // all released
  }
  EXPECT_EQ(p->ready, (std::vector<int>{2, 1, 0, 2, 1, 0}));
}

TEST_F(ParamCoordinatorTest, GatherWaitIsTimedAndTaken) {
  HostDeviceOptions ho;
  ho.budget_bytes = 64 * kPage;
  ho.copy_delay_us = 3000;
  HostDevice slow(ho);
  EngineOptions o = Options(Home::kCpu);
  o.device = &slow;
  auto p = Make(o);
  ASSERT_NE(p, nullptr);
  (void)p->coordinator->TakeGatherWaitSeconds();
  p->coordinator->Gather(0, false);
  p->coordinator->Release(0);
  EXPECT_GE(p->coordinator->TakeGatherWaitSeconds(), 0.002);
  EXPECT_EQ(p->coordinator->TakeGatherWaitSeconds(), 0.0);
}

// Conditional units (experts under --page-experts) are gathered in a different set every pass:
// they stay out of the recorded order, so the order of the others is followed without a
// divergence and without re-recording.
TEST_F(ParamCoordinatorTest, ConditionalUnitsStayOutOfTheRecordedOrder) {
  EngineOptions o = Options(Home::kNvme);
  o.device_budget = 3 * kPage;
  auto p = Make(o, false, 4, {1, 2});
  ASSERT_NE(p, nullptr);
  ParamCoordinator& c = *p->coordinator;
  Pass(*p, {0, 1, 3, 3, 1, 0});
  EXPECT_EQ(c.trace(), (std::vector<int>{0, 3, 3, 0}));
  ::testing::internal::CaptureStderr();
  Pass(*p, {0, 2, 3, 3, 2, 0});  // other experts routed: the same order
  Pass(*p, {0, 3, 3, 0});        // none routed
  Pass(*p, {0, 1, 2, 3, 3, 2, 1, 0});
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(log.find("new order"), std::string::npos) << log;
  EXPECT_EQ(log.find("re-recording"), std::string::npos) << log;
  EXPECT_EQ(c.trace(), (std::vector<int>{0, 3, 3, 0}));
  // Without conditional units the same gathers are an order of their own, re-recorded.
  auto plain = Make(o, false, 4);
  ASSERT_NE(plain, nullptr);
  Pass(*plain, {0, 1, 3, 3, 1, 0});
  EXPECT_EQ(plain->coordinator->trace(), (std::vector<int>{0, 1, 3, 3, 1, 0}));
}

// Expect fetches exactly the announced units, ahead of their gathers, and nothing else: on NVMe
// homes, after the announcement of unit 2 only unit 2's page is read, before anything gathers it;
// its gather then reads nothing more.
TEST_F(ParamCoordinatorTest, ExpectFetchesExactlyTheAnnouncedUnitsAhead) {
  EngineOptions o = Options(Home::kNvme);
  o.param_buffer_count = 2;  // two pinned slots: units 0..3 do not all stay in pinned memory
  o.device_budget = 3 * kPage;
  o.speculation_passes = 0;  // no history here
  auto p = Make(o, false, 4, {1, 2, 3});
  ASSERT_NE(p, nullptr);
  ParamCoordinator& c = *p->coordinator;
  TierManager& tm = p->store->tm();
  auto fetched = [&](int u) { return Fetched(*p, u); };
  // Push unit 2 out of both tiers: gather the others.
  for (int u : {3, 1, 0, 3, 1, 0}) {
    c.Gather(u, false);
    c.Release(u);
  }
  ASSERT_FALSE(fetched(2));
  c.Gather(0, true);
  c.Release(0);
  const uint64_t before = tm.telemetry().nvme_to_pinned;
  c.Expect({2});
  EXPECT_EQ(c.expected(), (std::vector<int>{2}));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!tm.IsValid(p->store->group(2).block, Tier::kDevice) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(tm.IsValid(p->store->group(2).block, Tier::kDevice)) << "unit 2 was not fetched";
  EXPECT_EQ(tm.telemetry().nvme_to_pinned, before + kPage);  // unit 2's page, nothing else
  c.Gather(2, true);
  EXPECT_TRUE(c.expected().empty());
  EXPECT_EQ(tm.telemetry().nvme_to_pinned, before + kPage);
  EXPECT_EQ(FirstDifference(Floats(Weight(2)), p->initial[2]), -1);
  c.Release(2);
  c.EndPass();
  EXPECT_EQ(c.trace(), (std::vector<int>{0}));
}

// The history rule (param_coordinator.h): a unit announced at the same place in each of the last
// N passes is read into pinned memory at that place's anchor (here after unit 0's gather), before
// its announcement; when the routing then does not use it, the read is counted wasted and the
// unit's streak starts over, so the next pass reads nothing ahead.
TEST_F(ParamCoordinatorTest, HistoryReadsAheadOnlyUnitsAnnouncedInEachOfTheLastPasses) {
  EngineOptions o = Options(Home::kNvme);
  o.param_buffer_count = 2;
  o.device_budget = 3 * kPage;
  o.speculation_passes = 2;
  auto p = Make(o, false, 4, {2, 3});
  ASSERT_NE(p, nullptr);
  // One pass: unit 0, the announcement of `routed`, its gather, unit 1. Then (outside the pass)
  // copies of the other units push `routed` out of the two pinned slots and the two device slots.
  // Returns the speculation counters as they were right after unit 0's gather.
  auto pass = [&](int routed) {
    ParamCoordinator& c = *p->coordinator;
    c.Gather(0, true);
    c.Release(0);
    const ParamCoordinator::Speculation at_anchor = c.speculation();
    c.Expect({routed});
    c.Gather(routed, true);
    EXPECT_EQ(FirstDifference(Floats(Weight(routed)), p->initial[routed]), -1);
    c.Release(routed);
    c.Gather(1, true);
    c.Release(1);
    c.EndPass();
    const int other = routed == 2 ? 3 : 2;
    for (int round = 0; round < 4 && Fetched(*p, routed); ++round) {
      for (Tier tier : {Tier::kPinned, Tier::kDevice}) {
        for (int u : {other, 1, 0}) {
          auto pin = p->store->tm().Acquire(p->store->group(u).block, tier);
          EXPECT_TRUE(pin.ok() && pin->Wait().ok());
        }
      }
    }
    EXPECT_FALSE(Fetched(*p, routed));
    return at_anchor;
  };
  EXPECT_EQ(pass(2).units, 0u);               // recording
  EXPECT_EQ(pass(2).units, 0u);               // announced once before: not yet
  ParamCoordinator::Speculation s = pass(2);  // twice in a row: read at the anchor
  EXPECT_EQ(s.units, 1u);
  EXPECT_EQ(s.bytes, kPage);
  EXPECT_EQ(p->coordinator->speculation().wasted_units, 0u);  // and used
  s = pass(3);  // read ahead again, but the routing changed
  EXPECT_EQ(s.units, 2u);
  EXPECT_EQ(p->coordinator->speculation().wasted_units, 1u);
  EXPECT_EQ(p->coordinator->speculation().wasted_bytes, kPage);
  EXPECT_EQ(pass(3).units, 2u);  // unit 3 has one pass, unit 2 none: nothing read ahead
  EXPECT_EQ(pass(3).units, 3u);  // unit 3 twice in a row
  EXPECT_EQ(p->coordinator->speculation().wasted_units, 1u);
  EXPECT_EQ(p->coordinator->trace(), (std::vector<int>{0, 1}));
  // Off: nothing ahead of the announcement, whatever the history.
  p.reset();
  o.speculation_passes = 0;
  p = Make(o, false, 4, {2, 3});
  ASSERT_NE(p, nullptr);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(pass(2).units, 0u);
}

// An announcement that repeats an earlier one of the pass (backward's experts are forward's) is
// made again at its anchor, from this pass's units: exact, before the model announces it.
TEST_F(ParamCoordinatorTest, RepeatedAnnouncementsAreReplayedAtTheirAnchor) {
  EngineOptions o = Options(Home::kNvme);
  o.speculation_passes = 0;
  auto p = Make(o, false, 5, {2, 3, 4});
  ASSERT_NE(p, nullptr);
  ParamCoordinator& c = *p->coordinator;
  auto run = [&](int u) {
    c.Gather(u, true);
    c.Release(u);
  };
  // Forward: 0, routed {2, 3}; backward: 1, then the same units reversed.
  run(0);
  c.Expect({2, 3});
  run(2);
  run(3);
  run(1);
  EXPECT_TRUE(c.expected().empty());
  c.Expect({3, 2});
  run(3);
  run(2);
  c.EndPass();
  // Next pass routes {2, 4}: at unit 1's gather (the backward announcement's anchor) the
  // coordinator expects {4, 2} already.
  run(0);
  c.Expect({2, 4});
  run(2);
  run(4);
  EXPECT_TRUE(c.expected().empty());
  run(1);
  EXPECT_EQ(c.expected(), (std::vector<int>{4, 2}));
  c.Expect({4, 2});
  run(4);
  run(2);
  c.EndPass();
  EXPECT_EQ(c.trace(), (std::vector<int>{0, 1}));
  EXPECT_EQ(c.speculation().units, 0u);
}

// NVMe homes whose parameter file cannot be read: a gather fails with the read's code, thrown
// through the boundary (as it would be out of a unit's forward) and recovered there with the unit
// named. Two pinned unit slots hold units 1 and 2 after initialization, so gathering unit 0 must
// read.
class ParamCoordinatorFaultTest : public ParamCoordinatorTest {
 protected:
  std::unique_ptr<Parts> MakeUnreadable() {
    EngineOptions o = Options(Home::kNvme);
    o.param_buffer_count = 2;  // two pinned unit slots: after initialization they hold units 1, 2
    return Make(o);
  }
};

TEST_F(ParamCoordinatorFaultTest, ReadErrorIsThrownThroughTheBoundary) {
  auto p = MakeUnreadable();
  ASSERT_NE(p, nullptr);
  ParamCoordinator& c = *p->coordinator;
  engine_testing::SwapFileFault fault(dir_.path(), "params", O_WRONLY);
  ASSERT_TRUE(fault.ok());
  try {
    c.Gather(0, true);
    FAIL() << "gathered from an unreadable file";
  } catch (const std::exception& e) {
    Status s = p->boundary.Take(e);
    EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
    EXPECT_EQ(s.sys_errno(), EBADF) << s.ToString();
    EXPECT_NE(s.ToString().find("gathering blocks.0"), std::string::npos) << s.ToString();
  }
  EXPECT_EQ(Weight(0).numel(), 0);
}

// After a failed gather (the unit's forward threw out of Gather, so its Release never ran) the
// unit can be gathered again once the file reads (a failed gather must not count as a nested
// one, or every later Gather would return early and the unit run with empty parameters).
TEST_F(ParamCoordinatorFaultTest, UnitCanBeGatheredAgainAfterAFailedGather) {
  auto p = MakeUnreadable();
  ASSERT_NE(p, nullptr);
  ParamCoordinator& c = *p->coordinator;
  {
    engine_testing::SwapFileFault fault(dir_.path(), "params", O_WRONLY);
    ASSERT_TRUE(fault.ok());
    try {
      c.Gather(0, true);
    } catch (const std::exception& e) {
      EXPECT_EQ(p->boundary.Take(e).code(), StatusCode::kIoError);
    }
  }
  c.Gather(0, true);  // the file reads again
  ASSERT_EQ(Weight(0).numel(), kD * kD);
  EXPECT_EQ(FirstDifference(Floats(Weight(0)), p->initial[0]), -1);
  c.Release(0);
}

}  // namespace
}  // namespace strata::runtime
