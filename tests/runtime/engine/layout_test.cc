// PartitionModel, BlockSizes, StateArrays and StateSpan (runtime/engine/engine_layout.h), on a tiny
// model without any other engine part: units in model order and attached, small parameters
// resident, sub-group boundaries, the errors, and the optimizer's view of a state block.
#include "runtime/plan/layout.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/engine/engine_layout.h"
#include "tests/runtime/engine/engine_parts.h"

namespace strata::runtime {
namespace {

using cpu_optimizer::OptimizerType;
using engine_testing::TinyNet;

// Hooks that are never called: PartitionModel only attaches the units to them.
class NoHooks final : public UnitHooks {
 public:
  void Gather(int, bool) override { ADD_FAILURE() << "Gather"; }
  void Release(int) override { ADD_FAILURE() << "Release"; }
  const std::vector<torch::Tensor>& GradParameters(int) override { return none_; }
  void GradientsReady(int, std::vector<torch::Tensor>) override { ADD_FAILURE(); }

 private:
  std::vector<torch::Tensor> none_;
};

constexpr uint64_t kHuge = 1'000'000'000;

TEST(LayoutTest, UnitsAreGroupsInModelOrderAndAttached) {
  TinyNet model(3, 8);
  NoHooks hooks;
  auto l = PartitionModel(*model, Home::kNvme, /*persistence_threshold=*/0, kHuge, &hooks);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->units(), 3);
  ASSERT_EQ(l->resident_group, 3);
  ASSERT_EQ(l->groups.size(), 4u);
  for (int u = 0; u < 3; ++u) {
    const ParamGroup& g = l->groups[u];
    EXPECT_EQ(g.name, "blocks." + std::to_string(u));
    EXPECT_TRUE(g.unit);
    EXPECT_EQ(g.home, Home::kNvme);
    ASSERT_EQ(g.params.size(), 2u);
    EXPECT_EQ(g.params[0].name, "blocks." + std::to_string(u) + ".weight");
    EXPECT_EQ(g.params[1].name, "blocks." + std::to_string(u) + ".bias");
    EXPECT_EQ(g.numel, 8u * 8 + 8);
    EXPECT_TRUE(model->unit(u)->attached());
    EXPECT_EQ(model->unit(u)->index(), u);
    EXPECT_EQ(model->unit(u)->hooks(), &hooks);
  }
  const ParamGroup& r = l->groups[3];
  EXPECT_EQ(r.name, "resident");
  EXPECT_FALSE(r.unit);
  EXPECT_EQ(r.home, Home::kDevice);  // parameters outside units never leave the device
  std::vector<std::string> names;
  for (const ParamSlot& s : r.params) names.push_back(s.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"stem.weight", "stem.bias", "head.weight", "head.bias"}));
  EXPECT_EQ(l->max_unit_numel, 72u);
}

TEST(LayoutTest, SlotsAreTheModelsTensorsBackToBack) {
  TinyNet model(2, 8);
  NoHooks hooks;
  auto l = PartitionModel(*model, Home::kCpu, 0, kHuge, &hooks);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  for (const ParamGroup& g : l->groups) {
    uint64_t offset = 0;
    for (const ParamSlot& s : g.params) {
      EXPECT_EQ(s.offset, offset) << s.name;
      EXPECT_EQ(s.numel, static_cast<uint64_t>(s.var.numel())) << s.name;
      EXPECT_EQ(s.shape, s.var.sizes().vec()) << s.name;
      offset += s.numel;
    }
    EXPECT_EQ(g.numel, offset) << g.name;
  }
  // var is the model's parameter itself (the engine repoints it with set_data).
  EXPECT_TRUE(l->groups[0].params[0].var.is_same(model->unit(0)->named_parameters()["weight"]));
  EXPECT_TRUE(l->groups[2].params[2].var.is_same(model->head->weight));
  // Gradient targets of a unit: its own group's slots, in GradParameters order.
  ASSERT_EQ(l->unit_grad_params[1].size(), 2u);
  EXPECT_TRUE(l->unit_grad_params[1][0].is_same(l->groups[1].params[0].var));
  EXPECT_FALSE(l->unit_grad_targets[1][1].resident);
  EXPECT_EQ(l->unit_grad_targets[1][1].slot, 1);
}

TEST(LayoutTest, UnitParametersUpToThePersistenceThresholdAreResident) {
  TinyNet model(3, 8);
  NoHooks hooks;
  // Biases (8 elements) stay on the device; weights (64) are offloaded.
  auto l = PartitionModel(*model, Home::kNvme, /*persistence_threshold=*/8, kHuge, &hooks);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  for (int u = 0; u < 3; ++u) {
    ASSERT_EQ(l->groups[u].params.size(), 1u);
    EXPECT_EQ(l->groups[u].params[0].name, "blocks." + std::to_string(u) + ".weight");
    EXPECT_EQ(l->groups[u].numel, 64u);
  }
  std::vector<std::string> names;
  for (const ParamSlot& s : l->groups[3].params) names.push_back(s.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"stem.weight", "stem.bias", "blocks.0.bias", "blocks.1.bias",
                                      "blocks.2.bias", "head.weight", "head.bias"}));
  // The unit still asks for the bias's gradient; it goes to the resident slot.
  const auto& targets = l->unit_grad_targets[1];
  ASSERT_EQ(targets.size(), 2u);
  EXPECT_FALSE(targets[0].resident);
  EXPECT_EQ(targets[0].slot, 0);
  EXPECT_TRUE(targets[1].resident);
  EXPECT_EQ(l->groups[3].params[targets[1].slot].name, "blocks.1.bias");
  EXPECT_TRUE(l->unit_grad_params[1][1].is_same(l->groups[3].params[targets[1].slot].var));

  // A threshold above every unit parameter empties the units: their groups get no sub-groups.
  TinyNet all_resident(2, 8);
  auto r = PartitionModel(*all_resident, Home::kNvme, 64, kHuge, &hooks);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->groups[0].numel, 0u);
  EXPECT_TRUE(r->groups[0].subgroups.empty());
  EXPECT_EQ(r->max_unit_numel, 0u);
  ASSERT_EQ(r->subgroups.size(), 1u);
  EXPECT_EQ(r->subgroups[0].group, 2);
}

TEST(LayoutTest, FrozenParametersAreLeftAlone) {
  TinyNet model(2, 8);
  model->head->bias.set_requires_grad(false);
  model->unit(0)->named_parameters()["bias"].set_requires_grad(false);
  NoHooks hooks;
  auto l = PartitionModel(*model, Home::kCpu, 0, kHuge, &hooks);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->groups[0].params.size(), 1u);
  EXPECT_EQ(l->groups[0].numel, 64u);
  EXPECT_EQ(l->unit_grad_params[0].size(), 1u);
  for (const ParamSlot& s : l->groups[2].params) EXPECT_NE(s.name, "head.bias");
}

// The sub-group split for a sub_group_size smaller than a unit, equal to it and larger.
TEST(LayoutTest, SubGroupsCutEachGroupAtSubGroupSize) {
  NoHooks hooks;
  struct Case {
    uint64_t sub_group_size;
    std::vector<SubGroupSpan> want;
  };
  // Units of 72 elements (3 of them), resident group of 4*8+8 + 8+1 = 49.
  const std::vector<Case> cases = {
      {50, {{0, 0, 50}, {0, 50, 22}, {1, 0, 50}, {1, 50, 22}, {2, 0, 49}}},
      {72, {{0, 0, 72}, {1, 0, 72}, {2, 0, 49}}},
      {1000, {{0, 0, 72}, {1, 0, 72}, {2, 0, 49}}},
      {30,
       {{0, 0, 30},
        {0, 30, 30},
        {0, 60, 12},
        {1, 0, 30},
        {1, 30, 30},
        {1, 60, 12},
        {2, 0, 30},
        {2, 30, 19}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("sub_group_size " + std::to_string(c.sub_group_size));
    TinyNet model(2, 8);
    auto l = PartitionModel(*model, Home::kCpu, 0, c.sub_group_size, &hooks);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l->subgroups, c.want);
    uint64_t largest = 0;
    for (int si = 0; si < static_cast<int>(l->subgroups.size()); ++si) {
      const SubGroupSpan& sg = l->subgroups[si];
      const auto& mine = l->groups[sg.group].subgroups;
      EXPECT_NE(std::find(mine.begin(), mine.end(), si), mine.end()) << si;
      largest = std::max(largest, sg.numel);
    }
    EXPECT_EQ(l->max_subgroup_numel, largest);
    // The plan's view is the same split (plan/layout.h).
    const ModelLayout plan = l->Plan();
    EXPECT_EQ(plan.unit_numel, (std::vector<uint64_t>{72, 72}));
    EXPECT_EQ(plan.resident_numel, 49u);
    EXPECT_EQ(plan.subgroups, l->subgroups);
    EXPECT_EQ(MakeModelLayout({72, 72}, 49, c.sub_group_size).subgroups, l->subgroups);
  }
}

TEST(LayoutTest, ModelWithoutUnitsIsOneResidentGroup) {
  torch::nn::Sequential model(torch::nn::Linear(4, 3), torch::nn::Linear(3, 2));
  NoHooks hooks;
  auto l = PartitionModel(*model.ptr(), Home::kNvme, 0, kHuge, &hooks);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->units(), 0);
  ASSERT_EQ(l->groups.size(), 1u);
  EXPECT_EQ(l->groups[0].name, "resident");
  EXPECT_EQ(l->groups[0].numel, 4u * 3 + 3 + 3 * 2 + 2);
}

// A module around a unit (to nest it in another unit).
class HolderImpl : public torch::nn::Module {
 public:
  explicit HolderImpl(OffloadUnit u) : inner(register_module("inner", u)) {}
  torch::Tensor forward(torch::Tensor x) { return inner->forward(x); }
  OffloadUnit inner;
};
TORCH_MODULE(Holder);

// Two units wrapping the same module, and a unit nested in another, share parameters.
class SharedImpl : public torch::nn::Module {
 public:
  explicit SharedImpl(bool nested) {
    torch::nn::Linear inner(4, 4);
    a = register_module("a", Offload(inner));
    if (nested) {
      b = register_module("b", Offload(Holder(a)));
    } else {
      b = register_module("b", Offload(inner));
    }
  }
  OffloadUnit a{nullptr}, b{nullptr};
};
TORCH_MODULE(Shared);

TEST(LayoutTest, UnitsSharingAParameterAreRefused) {
  NoHooks hooks;
  for (bool nested : {false, true}) {
    SCOPED_TRACE(nested ? "nested" : "shared");
    Shared model(nested);
    auto l = PartitionModel(*model, Home::kCpu, 0, kHuge, &hooks);
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(l.status().ToString().find("share a parameter"), std::string::npos)
        << l.status().ToString();
  }
}

TEST(LayoutTest, NonFp32ParametersAreRefused) {
  NoHooks hooks;
  TinyNet doubles(2, 8);
  doubles->to(torch::kFloat64);
  auto l = PartitionModel(*doubles, Home::kCpu, 0, kHuge, &hooks);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().ToString().find("must be fp32"), std::string::npos) << l.status().ToString();

  TinyNet halves(2, 8);
  halves->head->to(torch::kBFloat16);
  l = PartitionModel(*halves, Home::kCpu, 0, kHuge, &hooks);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().ToString().find("head.weight"), std::string::npos) << l.status().ToString();
}

TEST(LayoutTest, BlockSizesArePaddedToTheIoAlignment) {
  BlockSizes fp32;
  EXPECT_EQ(fp32.Param(1), 4096u);
  EXPECT_EQ(fp32.Param(1024), 4096u);
  EXPECT_EQ(fp32.Param(1025), 8192u);
  EXPECT_EQ(fp32.Grad(1024), 4096u);
  EXPECT_EQ(fp32.Grad(1025), 8192u);
  EXPECT_EQ(fp32.State(1024), 3u * 4096);  // master + m + v
  EXPECT_EQ(fp32.State(1), 4096u);
  BlockSizes bf16{2, 2};
  EXPECT_EQ(bf16.Param(2048), 4096u);
  EXPECT_EQ(bf16.Param(2049), 8192u);
  EXPECT_EQ(bf16.Grad(2048), 8192u);  // gradients accumulate in fp32 whatever the compute dtype
  EXPECT_EQ(bf16.State(1024), 2u * 4096);
  EXPECT_EQ(fp32.Param(0), 0u);
}

TEST(LayoutTest, StateArraysPerOptimizer) {
  EXPECT_EQ(StateArrays(OptimizerType::kAdam), 3);
  EXPECT_EQ(StateArrays(OptimizerType::kAdamW), 3);
  EXPECT_EQ(StateArrays(OptimizerType::kAdagrad), 2);
  EXPECT_EQ(StateArrays(OptimizerType::kLion), 2);
}

TEST(LayoutTest, StateSpanPointsAtMasterThenMoments) {
  constexpr uint64_t n = 10;
  std::vector<float> state(3 * n), grads(n);
  for (OptimizerType t : {OptimizerType::kAdam, OptimizerType::kAdamW}) {
    cpu_optimizer::FlatSpan s = StateSpan(t, n, state.data(), grads.data());
    EXPECT_EQ(s.numel, n);
    EXPECT_EQ(s.params, state.data());
    EXPECT_EQ(s.exp_avg, state.data() + n);
    EXPECT_EQ(s.exp_avg_sq, state.data() + 2 * n);
    EXPECT_EQ(s.grads, grads.data());
  }
  cpu_optimizer::FlatSpan lion = StateSpan(OptimizerType::kLion, n, state.data(), grads.data());
  EXPECT_EQ(lion.exp_avg, state.data() + n);
  EXPECT_EQ(lion.exp_avg_sq, nullptr);
  cpu_optimizer::FlatSpan ada = StateSpan(OptimizerType::kAdagrad, n, state.data(), grads.data());
  EXPECT_EQ(ada.exp_avg, nullptr);
  EXPECT_EQ(ada.exp_avg_sq, state.data() + n);
}

// The span is what the optimizer really uses: InitState through it fills exactly the moments.
TEST(LayoutTest, StateSpanDrivesTheCpuOptimizer) {
  constexpr uint64_t n = 7;
  cpu_optimizer::OptimizerOptions o =
      cpu_optimizer::OptimizerOptions::Defaults(OptimizerType::kAdagrad);
  o.initial_accumulator_value = 0.5;
  o.threads = 1;
  auto opt = cpu_optimizer::CpuOptimizer::Create(o);
  ASSERT_TRUE(opt.ok()) << opt.status().ToString();
  std::vector<float> state(2 * n + 1, 9.0f);  // one guard element past the block
  STRATA_ASSERT_OK(
      opt->InitState(StateSpan(OptimizerType::kAdagrad, n, state.data(), state.data())));
  for (uint64_t i = 0; i < n; ++i) EXPECT_EQ(state[i], 9.0f) << "master " << i;
  for (uint64_t i = n; i < 2 * n; ++i) EXPECT_EQ(state[i], 0.5f) << "sum " << i;
  EXPECT_EQ(state[2 * n], 9.0f);

  // One Adagrad step through the span: master moves against the gradient.
  std::vector<float> g(n, 1.0f);
  STRATA_ASSERT_OK(opt->Step(StateSpan(OptimizerType::kAdagrad, n, state.data(), g.data()), {}));
  for (uint64_t i = 0; i < n; ++i) EXPECT_LT(state[i], 9.0f) << i;
  for (uint64_t i = n; i < 2 * n; ++i) EXPECT_EQ(state[i], 1.5f) << i;
}

// Data-parallel slices: W equal padded parts, rank r owning [r*part, (r+1)*part) ∩ [0, numel).
TEST(LayoutTest, SlicesTileTheGroupOverRanks) {
  for (uint64_t numel : {0ull, 1ull, 63ull, 64ull, 1000ull, 4096ull, 123457ull}) {
    for (int world : {1, 2, 3, 4, 7}) {
      uint64_t covered = 0;
      const Slice first = SliceOf(numel, world, 0);
      if (world == 1) {
        EXPECT_EQ(first.part, numel);  // nothing padded with one rank
      } else {
        EXPECT_EQ(first.part % kPartitionAlign, 0u);
        EXPECT_GE(first.part * world, numel);
        EXPECT_LT(first.part * world, numel + world * kPartitionAlign);
      }
      for (int r = 0; r < world; ++r) {
        const Slice s = SliceOf(numel, world, r);
        EXPECT_EQ(s.part, first.part);
        EXPECT_EQ(s.begin, std::min(numel, s.part * r)) << numel << " " << world << " " << r;
        EXPECT_EQ(s.begin, covered);  // in order, no gap, no overlap
        covered += s.numel;
      }
      EXPECT_EQ(covered, numel) << numel << " over " << world;
    }
  }
}

TEST(LayoutTest, EveryRanksSubGroupsTogetherAreTheGroups) {
  const std::vector<uint64_t> groups = {1000, 0, 64, 5000};
  for (int world : {1, 2, 4}) {
    std::vector<std::vector<bool>> seen;
    for (uint64_t n : groups) seen.emplace_back(n, false);
    for (int r = 0; r < world; ++r) {
      for (const SubGroupSpan& sg : RankSubGroups(groups, 300, world, r)) {
        EXPECT_LE(sg.numel, 300u);
        const Slice s = SliceOf(groups[sg.group], world, r);
        EXPECT_GE(sg.begin, s.begin);  // inside the rank's own slice
        EXPECT_LE(sg.begin + sg.numel, s.begin + s.numel);
        for (uint64_t i = sg.begin; i < sg.begin + sg.numel; ++i) {
          EXPECT_FALSE(seen[sg.group][i]) << "element " << i << " twice";
          seen[sg.group][i] = true;
        }
      }
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      EXPECT_EQ(std::count(seen[g].begin(), seen[g].end(), false), 0) << "world " << world;
    }
  }
  // One rank: exactly the single-rank split.
  EXPECT_EQ(RankSubGroups(groups, 300, 1, 0), SplitSubGroups(groups, 300));
}

TEST(LayoutTest, PartitionModelGivesEachRankItsSlice) {
  TinyNet model(2, 8);
  NoHooks hooks;
  auto l = PartitionModel(*model, Home::kNvme, 0, 50, &hooks, /*world=*/2, /*rank=*/1);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->world, 2);
  EXPECT_EQ(l->rank, 1);
  const ParamGroup& g = l->groups[0];
  const Slice s = SliceOf(g.numel, 2, 1);
  EXPECT_EQ(g.part, s.part);
  EXPECT_EQ(g.own_begin, s.begin);
  EXPECT_EQ(g.own_numel, s.numel);
  EXPECT_EQ(g.gathered(), 2 * s.part);
  EXPECT_EQ(l->max_unit_part, s.part);
  EXPECT_EQ(l->max_unit_gathered, 2 * s.part);
  uint64_t owned = 0;
  for (int si : g.subgroups) owned += l->subgroups[si].numel;
  EXPECT_EQ(owned, s.numel);
  // The plan sees this rank's slices and the whole padded block a gather assembles.
  const ModelLayout plan = l->Plan();
  EXPECT_EQ(plan.unit_numel[0], s.part);
  EXPECT_EQ(plan.largest_gather(), 2 * s.part);
  EXPECT_FALSE(PartitionModel(*model, Home::kNvme, 0, 50, &hooks, 2, 2).ok());
}

}  // namespace
}  // namespace strata::runtime
