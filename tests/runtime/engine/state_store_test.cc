// StateStore (runtime/engine/state_store.h) over a tiny model's layout, without the pipelines:
// every block at its home with its initial values, parameters viewing the device copy or emptied,
// the arena and device-slot sizing, and the errors of impossible budgets.
#include "runtime/engine/state_store.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "tests/runtime/engine/engine_parts.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using engine_testing::FirstDifference;
using engine_testing::Floats;
using engine_testing::Parts;
using engine_testing::TinyNet;

class StateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }

  std::unique_ptr<Parts> Make(EngineOptions o, int units = 3, int64_t d = 8) {
    torch::manual_seed(7);
    model_ = TinyNet(units, d);
    auto p = Parts::Create(model_.ptr(), std::move(o), {.grads = false, .optimizer = false});
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(*p) : nullptr;
  }
  EngineOptions Options(Home params, Home optimizer) {
    return engine_testing::Options(params, optimizer, dir_.path());
  }
  // The initial values of sub-group si, then `fill` for each further state array.
  static std::vector<float> FreshState(const Parts& p, int si, float fill) {
    const SubGroupSpan& sg = p.layout.subgroups[si];
    const std::vector<float>& g = p.initial[sg.group];
    std::vector<float> want(g.begin() + sg.begin, g.begin() + sg.begin + sg.numel);
    want.resize(sg.numel * p.sizes.state_arrays, fill);
    return want;
  }

  testing::TempDir dir_{"strata-state-store-test"};
  TinyNet model_{nullptr};
};

TEST_F(StateStoreTest, DeviceHomeParametersViewTheirDeviceCopy) {
  auto p = Make(Options(Home::kDevice, Home::kCpu));
  ASSERT_NE(p, nullptr);
  for (int g = 0; g < static_cast<int>(p->layout.groups.size()); ++g) {
    const ParamGroup& group = p->layout.groups[g];
    SCOPED_TRACE(group.name);
    const StateStore::GroupBlock& b = p->store->group(g);
    ASSERT_TRUE(b.home_pin.valid());
    EXPECT_EQ(b.home_pin.tier(), Tier::kDevice);
    EXPECT_TRUE(p->store->tm().IsValid(b.block, Tier::kDevice));
    for (const ParamSlot& s : group.params) {
      EXPECT_EQ(s.var.data_ptr(), static_cast<std::byte*>(b.home_pin.data()) + s.offset * 4)
          << s.name;
      EXPECT_EQ(s.var.sizes().vec(), s.shape);
    }
    EXPECT_EQ(FirstDifference(p->GroupParams(g), p->initial[g]), -1);
  }
  EXPECT_EQ(p->store->device_slots(), 0u);
}

TEST_F(StateStoreTest, OffloadedParametersAreEmptiedAndLiveAtTheirHome) {
  for (Home home : {Home::kCpu, Home::kNvme}) {
    SCOPED_TRACE(std::string(HomeName(home)));
    auto p = Make(Options(home, home));
    ASSERT_NE(p, nullptr);
    TierManager& tm = p->store->tm();
    for (int u = 0; u < p->layout.units(); ++u) {
      const StateStore::GroupBlock& b = p->store->group(u);
      for (const ParamSlot& s : p->layout.groups[u].params) EXPECT_EQ(s.var.numel(), 0) << s.name;
      if (home == Home::kCpu) {
        ASSERT_TRUE(b.home_pin.valid());  // a permanent pinned copy
        EXPECT_EQ(b.home_pin.tier(), Tier::kPinned);
      } else {
        EXPECT_FALSE(b.home_pin.valid());
        EXPECT_TRUE(tm.IsValid(b.block, Tier::kNvme));  // written through to its home
      }
      EXPECT_FALSE(tm.IsValid(b.block, Tier::kDevice));
      EXPECT_EQ(FirstDifference(p->GroupParams(u), p->initial[u]), -1) << "unit " << u;
    }
    // Parameters outside units stay on the device whatever the home.
    const int r = p->layout.resident_group;
    EXPECT_EQ(p->layout.groups[r].params[0].var.numel(), 4 * 8);
    EXPECT_EQ(FirstDifference(p->GroupParams(r), p->initial[r]), -1);
    EXPECT_EQ(tm.telemetry().pinned_to_nvme > 0, home == Home::kNvme);
  }
}

TEST_F(StateStoreTest, StateBlocksHoldTheMasterAndFreshMoments) {
  for (Home home : {Home::kCpu, Home::kNvme}) {
    SCOPED_TRACE(std::string(HomeName(home)));
    EngineOptions o = Options(Home::kDevice, home);
    o.sub_group_size = 30;  // sub-groups cut across parameters
    auto p = Make(o);
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(p->layout.subgroups.size(), 3u * 3 + 2);
    for (int si = 0; si < static_cast<int>(p->layout.subgroups.size()); ++si) {
      SCOPED_TRACE("sub-group " + std::to_string(si));
      const StateStore::SubGroupBlocks& b = p->store->subgroup(si);
      EXPECT_EQ(p->store->tm().BlockSize(b.state), p->layout.subgroups[si].numel * 12);
      EXPECT_EQ(p->store->tm().BlockSize(b.grad), p->layout.subgroups[si].numel * 4);
      EXPECT_EQ(FirstDifference(p->State(si), FreshState(*p, si, 0.0f)), -1);
      if (home == Home::kCpu) {
        EXPECT_TRUE(b.state_home_pin.valid());
        EXPECT_TRUE(b.grad_home_pin.valid());
        EXPECT_EQ(
            FirstDifference(p->Grad(si), std::vector<float>(p->layout.subgroups[si].numel, 0.0f)),
            -1);
      } else {
        EXPECT_TRUE(p->store->tm().IsValid(b.state, Tier::kNvme));
        EXPECT_FALSE(b.state_home_pin.valid());
      }
    }
  }
}

// fp32 with parameters offloaded to the optimizer's home (or the CPU): a unit's flat parameter
// block is its sub-groups' master, the state blocks hold the moments only (8 B, not 12), and the
// swap files hold one copy of the unit parameters. The resident group (on the device), bf16 runs
// and units on NVMe with the optimizer on the CPU keep the master in the state block.
TEST_F(StateStoreTest, Fp32OffloadedUnitsKeepTheirMasterInTheParameterBlock) {
  struct Case {
    Home params, optimizer;
    DType precision;
    bool one_copy;
  };
  for (const Case c : {Case{Home::kNvme, Home::kNvme, DType::kFloat32, true},
                       Case{Home::kCpu, Home::kCpu, DType::kFloat32, true},
                       Case{Home::kCpu, Home::kNvme, DType::kFloat32, true},
                       Case{Home::kNvme, Home::kCpu, DType::kFloat32, false},
                       Case{Home::kNvme, Home::kNvme, DType::kBFloat16, false}}) {
    SCOPED_TRACE(std::string(HomeName(c.params)) + "/" + std::string(HomeName(c.optimizer)) + " " +
                 std::string(DTypeName(c.precision)));
    EngineOptions o = Options(c.params, c.optimizer);
    o.precision = c.precision;
    o.sub_group_size = 30;  // several sub-groups per unit
    auto p = Make(o);
    ASSERT_NE(p, nullptr);
    for (int si = 0; si < static_cast<int>(p->layout.subgroups.size()); ++si) {
      const SubGroupSpan& sg = p->layout.subgroups[si];
      const bool unit = sg.group != p->layout.resident_group;
      SCOPED_TRACE("sub-group " + std::to_string(si) + (unit ? " (unit)" : " (resident)"));
      const bool one_copy = c.one_copy && unit;
      EXPECT_EQ(p->layout.groups[sg.group].master_in_params, one_copy);
      EXPECT_EQ(p->store->tm().BlockSize(p->store->subgroup(si).state),
                sg.numel * (one_copy ? 8 : 12));
      // The logical state (master, moments) is the initial values and fresh moments either way.
      EXPECT_EQ(FirstDifference(p->State(si), FreshState(*p, si, 0.0f)), -1);
    }
  }
}

TEST_F(StateStoreTest, AdagradStateStartsAtTheInitialAccumulator) {
  EngineOptions o = Options(Home::kDevice, Home::kCpu);
  o.optimizer_options =
      cpu_optimizer::OptimizerOptions::Defaults(cpu_optimizer::OptimizerType::kAdagrad);
  o.optimizer_options.initial_accumulator_value = 0.25;
  o.optimizer_options.threads = 1;
  auto p = Make(o);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(p->sizes.state_arrays, 2);
  for (int si = 0; si < static_cast<int>(p->layout.subgroups.size()); ++si) {
    EXPECT_EQ(FirstDifference(p->State(si), FreshState(*p, si, 0.25f)), -1) << si;
  }
}

TEST_F(StateStoreTest, Bf16ParametersAreRoundedCopiesOfFp32Masters) {
  EngineOptions o = Options(Home::kDevice, Home::kCpu);
  o.precision = DType::kBFloat16;
  auto p = Make(o);
  ASSERT_NE(p, nullptr);
  StateStore& s = *p->store;
  for (int g = 0; g < static_cast<int>(p->layout.groups.size()); ++g) {
    const uint64_t n = p->layout.groups[g].numel;
    torch::Tensor dev = torch::empty({static_cast<int64_t>(n)}, torch::kBFloat16);
    STRATA_ASSERT_OK(s.device().CopyAsync(dev.data_ptr(), s.group(g).home_pin.data(), n * 2,
                                          CopyKind::kDeviceToHost, s.d2h()));
    STRATA_ASSERT_OK(s.device().Synchronize(s.d2h()));
    torch::Tensor want = torch::tensor(p->initial[g]).to(torch::kBFloat16);
    EXPECT_TRUE(torch::equal(dev, want)) << p->layout.groups[g].name;
    for (const ParamSlot& slot : p->layout.groups[g].params) {
      EXPECT_EQ(slot.var.scalar_type(), torch::kBFloat16);
    }
  }
  for (int si = 0; si < static_cast<int>(p->layout.subgroups.size()); ++si) {
    EXPECT_EQ(FirstDifference(p->State(si), FreshState(*p, si, 0.0f)), -1) << si;
  }
}

// fp16 on the host-emulated device: the device copy holds the fp16-rounded initial values, the
// parameter tensors are fp32 tensors holding exactly those values (libtorch's CPU backend cannot
// compute in fp16), and the fp32 masters start from them too (DeepSpeed builds its masters from
// the fp16 parameters). RefreshDeviceHomeTensors follows a change of the device copy.
TEST_F(StateStoreTest, Fp16ParametersMastersAndTensorsHoldTheRoundedValues) {
  EngineOptions o = Options(Home::kDevice, Home::kCpu);
  o.precision = DType::kFloat16;
  auto p = Make(o);
  ASSERT_NE(p, nullptr);
  StateStore& s = *p->store;
  EXPECT_EQ(s.storage_dtype(), torch::kHalf);
  EXPECT_EQ(s.tensor_dtype(), torch::kFloat32);
  bool some_rounded = false;  // the check below could not fail if rounding changed nothing
  for (int g = 0; g < static_cast<int>(p->layout.groups.size()); ++g) {
    const ParamGroup& group = p->layout.groups[g];
    SCOPED_TRACE(group.name);
    const uint64_t n = group.numel;
    torch::Tensor dev = torch::empty({static_cast<int64_t>(n)}, torch::kHalf);
    STRATA_ASSERT_OK(s.device().CopyAsync(dev.data_ptr(), s.group(g).home_pin.data(), n * 2,
                                          CopyKind::kDeviceToHost, s.d2h()));
    STRATA_ASSERT_OK(s.device().Synchronize(s.d2h()));
    const torch::Tensor initial = torch::tensor(p->initial[g]);
    const torch::Tensor rounded = initial.to(torch::kHalf).to(torch::kFloat32);
    some_rounded = some_rounded || !torch::equal(rounded, initial);
    EXPECT_TRUE(torch::equal(dev, initial.to(torch::kHalf)));
    for (const ParamSlot& slot : group.params) {
      EXPECT_EQ(slot.var.scalar_type(), torch::kFloat32);
      EXPECT_TRUE(
          torch::equal(slot.var.detach().reshape({-1}), rounded.narrow(0, slot.offset, slot.numel)))
          << slot.name;
    }
    for (int si : group.subgroups) {
      const SubGroupSpan& sg = p->layout.subgroups[si];
      const std::vector<float> state = p->State(si);
      const std::vector<float> master(state.begin(), state.begin() + sg.numel);
      EXPECT_EQ(FirstDifference(master, Floats(rounded.narrow(0, sg.begin, sg.numel))), -1);
    }
  }
  EXPECT_TRUE(some_rounded);

  // The device copy changes (as an optimizer step changes it): the tensors follow on refresh.
  const ParamSlot& slot = p->layout.groups[0].params[0];
  std::vector<uint16_t> ones(slot.numel, 0x3c00);  // fp16 1.0
  auto* dst = static_cast<std::byte*>(s.group(0).home_pin.data()) + slot.offset * 2;
  STRATA_ASSERT_OK(
      s.device().CopyAsync(dst, ones.data(), slot.numel * 2, CopyKind::kHostToDevice, s.h2d()));
  STRATA_ASSERT_OK(s.device().Synchronize(s.h2d()));
  EXPECT_FALSE(torch::equal(slot.var.detach(), torch::ones(slot.shape)));
  s.RefreshDeviceHomeTensors();
  EXPECT_TRUE(torch::equal(slot.var.detach(), torch::ones(slot.shape)));
}

TEST_F(StateStoreTest, InitializeUnitRunsBeforeEachUnitIsRead) {
  EngineOptions o = Options(Home::kNvme, Home::kNvme);
  std::vector<int> calls;
  o.initialize_unit = [&](int u) {
    calls.push_back(u);
    EXPECT_FALSE(torch::GradMode::is_enabled());
    model_->unit(u)->named_parameters()["weight"].fill_(static_cast<float>(u + 1));
    return Status::Ok();
  };
  auto p = Make(o);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(calls, (std::vector<int>{0, 1, 2}));
  for (int u = 0; u < 3; ++u) {
    const std::vector<float> got = p->GroupParams(u);
    for (int i = 0; i < 64; ++i) ASSERT_EQ(got[i], u + 1.0f) << "unit " << u << " at " << i;
    // The master starts from the initialized values too.
    EXPECT_EQ(p->State(p->layout.groups[u].subgroups[0])[0], u + 1.0f);
  }
}

TEST_F(StateStoreTest, ArenaIsThePlanOrExactlyWhatIsAsked) {
  EngineOptions o = Options(Home::kNvme, Home::kNvme);
  auto p = Make(o);
  ASSERT_NE(p, nullptr);
  const PlanInput in = PlanInputFor(p->options, p->layout, p->sizes);
  EXPECT_EQ(in.layout.unit_numel, (std::vector<uint64_t>{72, 72, 72}));
  EXPECT_EQ(in.layout.resident_numel, 49u);
  EXPECT_EQ(in.layout.subgroups, p->layout.subgroups);  // the engine's own cut
  EXPECT_EQ(in.compute_bytes, 4);
  EXPECT_EQ(in.state_bytes, 12);
  EXPECT_EQ(in.params, Home::kNvme);
  EXPECT_EQ(in.optimizer, Home::kNvme);
  EXPECT_EQ(in.param_buffer_count, o.param_buffer_count);
  EXPECT_EQ(in.io_align, kIoAlign);
  EXPECT_EQ(p->store->arena().capacity(), PlanMemory(in).pinned_arena_bytes);

  o.pinned_bytes = 40 * 4096;
  auto q = Make(o);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->store->arena().capacity(), 40u * 4096);
}

TEST_F(StateStoreTest, DeviceSlotsAreWhatTheBudgetHoldsBesidesResidentParameters) {
  EngineOptions o = Options(Home::kCpu, Home::kCpu);
  // Resident block: 1 page; each unit block: 1 page (72 fp32).
  o.device_budget = 4096 + 2 * 4096 + 2048;
  auto p = Make(o);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->store->device_slots(), 2u);
  EXPECT_EQ(p->store->device().info().budget_bytes, o.device_budget);
}

// Every unit parameter at most stage3_param_persistence_threshold elements (DeepSpeed's default
// 100000 on a small model): the units' blocks are empty, and no unit needs a device slot.
TEST_F(StateStoreTest, EveryUnitParameterPersistentNeedsNoDeviceSlot) {
  for (Home home : {Home::kCpu, Home::kNvme}) {
    SCOPED_TRACE(std::string(HomeName(home)));
    EngineOptions o = Options(home, home);
    o.persistence_threshold = 100'000;
    // Exactly the resident block (3 units x 72 + 49 elements, fp32: one page).
    o.device_budget = 4096;
    auto p = Make(o);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->layout.max_unit_numel, 0u);
    for (int u = 0; u < p->layout.units(); ++u) EXPECT_EQ(p->layout.groups[u].numel, 0u) << u;
    const int r = p->layout.resident_group;
    EXPECT_EQ(p->layout.groups[r].numel, 3u * 72 + 49);
    EXPECT_EQ(p->store->device_slots(), 0u);
    EXPECT_EQ(p->store->param_pool(), nullptr);
    EXPECT_EQ(FirstDifference(p->GroupParams(r), p->initial[r]), -1);
  }
}

TEST_F(StateStoreTest, ImpossibleBudgetsAreRefusedWithTheirKey) {
  EngineOptions o = Options(Home::kDevice, Home::kCpu);
  o.device_budget = 3 * 4096;  // resident + 3 units need 4 pages
  auto s = Parts::Create(TinyNet(3, 8).ptr(), o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.status().ToString().find("offload_param.device"), std::string::npos)
      << s.status().ToString();

  o = Options(Home::kCpu, Home::kCpu);
  o.device_budget = 4096 + 4095;  // resident + not quite one unit
  s = Parts::Create(TinyNet(3, 8).ptr(), o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.status().ToString().find("largest offload unit"), std::string::npos)
      << s.status().ToString();
}

TEST_F(StateStoreTest, NvmeHomesNeedAPath) {
  EngineOptions o = Options(Home::kNvme, Home::kNvme);
  o.param_nvme_path.clear();
  auto s = Parts::Create(TinyNet(2, 8).ptr(), o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().ToString().find("offload_param.nvme_path"), std::string::npos)
      << s.status().ToString();
}

TEST_F(StateStoreTest, ViewOfAndEmptyUseTheComputeDtype) {
  for (DType precision : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(precision));
    EngineOptions o = Options(Home::kDevice, Home::kCpu);
    o.precision = precision;
    auto p = Make(o);
    ASSERT_NE(p, nullptr);
    std::vector<std::byte> base(4096);
    const ParamSlot& slot = p->layout.groups[0].params[1];  // the bias, after the weight
    torch::Tensor v = p->store->ViewOf(slot, base.data());
    const bool bf16 = precision == DType::kBFloat16;
    EXPECT_EQ(v.scalar_type(), bf16 ? torch::kBFloat16 : torch::kFloat32);
    EXPECT_EQ(v.sizes().vec(), slot.shape);
    EXPECT_EQ(v.data_ptr(), base.data() + slot.offset * (bf16 ? 2 : 4));
    EXPECT_EQ(p->store->Empty().numel(), 0);
    EXPECT_EQ(p->store->Empty().scalar_type(), v.scalar_type());
  }
}

// fp16 on the host-emulated device: ViewOf reads fp16 at 2 bytes per element and returns an fp32
// copy (not a view: the CPU backend computes in fp32).
TEST_F(StateStoreTest, Fp16ViewOfOnTheHostIsAnFp32Copy) {
  EngineOptions o = Options(Home::kDevice, Home::kCpu);
  o.precision = DType::kFloat16;
  auto p = Make(o);
  ASSERT_NE(p, nullptr);
  const ParamSlot& slot = p->layout.groups[0].params[1];
  std::vector<uint16_t> base(2048, 0);
  for (uint64_t i = 0; i < slot.numel; ++i) base[slot.offset + i] = 0x3800;  // fp16 0.5
  base[slot.offset + slot.numel] = 0x7c00;  // inf just past the slot: must not be read
  torch::Tensor v = p->store->ViewOf(slot, base.data());
  EXPECT_EQ(v.scalar_type(), torch::kFloat32);
  EXPECT_EQ(v.sizes().vec(), slot.shape);
  EXPECT_TRUE(torch::equal(v, torch::full(slot.shape, 0.5f)));
  EXPECT_NE(v.data_ptr(), static_cast<void*>(base.data() + slot.offset));
  EXPECT_EQ(p->store->Empty().scalar_type(), torch::kFloat32);
}

}  // namespace
}  // namespace strata::runtime
