// CheckFit and SuggestChanges against a synthetic machine (host memory and GPU set by the test;
// NVMe paths on the real /tmp, with plans far smaller than any free space).
#include "runtime/plan/plan_fit.h"

#include <gtest/gtest.h>

#include <string>

namespace strata::runtime {
namespace {

constexpr uint64_t kSubGroup = 50000;
constexpr uint64_t kDefaultSubGroup = 1'000'000'000;  // DeepSpeed's

PlanInput Input(Home params, Home optimizer) {
  PlanInput in;
  // State of 10 units outweighs NVMe buffers of 1 sub-group (of kSubGroup elements).
  in.layout = MakeModelLayout(std::vector<uint64_t>(10, 100000), 50000, kSubGroup);
  in.compute_bytes = 2;
  in.params = params;
  in.optimizer = optimizer;
  return in;
}

MachineCapacity Host(uint64_t available) {
  MachineCapacity m;
  m.memory = HostMemory{available * 2, available};
  m.gpu_reason = "test: no GPU";
  return m;
}

const NvmePaths kTmp{"/tmp", "/tmp"};

TEST(PlanFitTest, WithoutGpuTheDeviceCountsAsHostMemory) {
  const MemoryPlan plan = PlanMemory(Input(Home::kCpu, Home::kCpu));
  const uint64_t need = plan.total.device + plan.total.pinned + plan.total.host;
  Fit fit = CheckFit(plan, Host(need), kTmp);
  EXPECT_TRUE(fit.fits);
  EXPECT_EQ(fit.host_need, need);
  EXPECT_TRUE(fit.problems.empty());
  EXPECT_EQ(Shortfall(fit, Host(need)), 0u);

  fit = CheckFit(plan, Host(need - 1), kTmp);
  EXPECT_FALSE(fit.fits);
  ASSERT_EQ(fit.problems.size(), 1u);
  EXPECT_NE(fit.problems[0].find("host memory"), std::string::npos);
  EXPECT_EQ(Shortfall(fit, Host(need - 1)), 1u);
}

TEST(PlanFitTest, GpuMemoryIsCheckedOnItsOwn) {
  const MemoryPlan plan = PlanMemory(Input(Home::kDevice, Home::kDevice));
  MachineCapacity m = Host(plan.total.pinned + 1);
  m.has_gpu = true;
  m.gpu_name = "test GPU";
  m.gpu_bytes = plan.total.device - 4096;
  const Fit fit = CheckFit(plan, m, kTmp);
  EXPECT_FALSE(fit.fits);
  EXPECT_EQ(fit.host_need, plan.total.pinned + plan.total.host);
  ASSERT_EQ(fit.problems.size(), 1u);
  EXPECT_NE(fit.problems[0].find("GPU"), std::string::npos);
  EXPECT_EQ(Shortfall(fit, m), 4096u);
}

TEST(PlanFitTest, NvmeBytesAreCheckedOnOneFilesystem) {
  const MemoryPlan plan = PlanMemory(Input(Home::kNvme, Home::kNvme));
  const Fit fit = CheckFit(plan, Host(1ull << 40), kTmp);
  ASSERT_EQ(fit.disks.size(), 1u);
  EXPECT_EQ(fit.disks[0].need, plan.total.nvme);
  EXPECT_TRUE(fit.fits) << (fit.problems.empty() ? "" : fit.problems[0]);
}

TEST(PlanFitTest, SuggestsTheOptimizerToNvmeFirst) {
  const PlanInput in = Input(Home::kCpu, Home::kCpu);
  PlanInput target = in;
  target.optimizer = Home::kNvme;
  const MemoryPlan fits = PlanMemory(target);
  const MachineCapacity m = Host(fits.total.device + fits.total.pinned);
  ASSERT_FALSE(CheckFit(PlanMemory(in), m, kTmp).fits);
  std::optional<FitSuggestion> s = SuggestChanges(in, kSubGroup, std::nullopt, 1, m, kTmp);
  ASSERT_TRUE(s.has_value());
  ASSERT_EQ(s->changes.size(), 1u);
  EXPECT_EQ(s->changes[0], "offload_optimizer.device: cpu -> nvme");
  EXPECT_TRUE(s->fit.fits);
}

TEST(PlanFitTest, GreedySearchCombinesChanges) {
  // Deep and narrow: optimizer state (40 blocks) dwarfs the NVMe buffers (one block), and
  // activations at micro-batch 64 dwarf both.
  const GptShape deep{"deep", 40, 64, 4, 64};
  PlanInput in = GptPlanInput(deep, /*micro_batch=*/64, /*compute_bytes=*/4, kDefaultSubGroup);
  in.params = in.optimizer = Home::kCpu;
  // Room for everything on NVMe at micro-batch 1 only: no single change is enough.
  PlanInput target = GptPlanInput(deep, 1, 4, kDefaultSubGroup);
  target.params = target.optimizer = Home::kNvme;
  const MemoryPlan small = PlanMemory(target);
  const MachineCapacity m = Host(small.total.device + small.total.pinned);
  for (PlanInput single : {in, target}) {  // neither fewer activations nor NVMe alone fits
    single.params = single.optimizer = Home::kCpu;
    EXPECT_FALSE(CheckFit(PlanMemory(single), m, kTmp).fits);
  }
  PlanInput nvme_only = in;
  nvme_only.params = nvme_only.optimizer = Home::kNvme;
  EXPECT_FALSE(CheckFit(PlanMemory(nvme_only), m, kTmp).fits);
  std::optional<FitSuggestion> s = SuggestChanges(in, kDefaultSubGroup, deep, 64, m, kTmp);
  ASSERT_TRUE(s.has_value());
  EXPECT_GE(s->changes.size(), 2u);
  EXPECT_TRUE(s->fit.fits);
  EXPECT_LE(s->fit.host_need, small.total.device + small.total.pinned);
  bool micro_batch = false;
  for (const std::string& c : s->changes) {
    micro_batch |= c.find("train_micro_batch_size_per_gpu") != std::string::npos;
  }
  EXPECT_TRUE(micro_batch);
}

TEST(PlanFitTest, NothingFitsAMachineWithoutMemory) {
  const PlanInput in = Input(Home::kCpu, Home::kCpu);
  EXPECT_FALSE(SuggestChanges(in, kSubGroup, std::nullopt, 1, Host(4096), kTmp).has_value());
}

TEST(PlanFitTest, SuggestionsSpellHomesAsTheConfigDoes) {
  // On the device is "none" in a DeepSpeed config (HomeName), never TierName's "device".
  const PlanInput in = Input(Home::kDevice, Home::kDevice);
  PlanInput target = in;
  target.optimizer = Home::kCpu;
  MachineCapacity m = Host(1ull << 40);
  m.has_gpu = true;
  m.gpu_name = "test GPU";
  m.gpu_bytes = PlanMemory(target).total.device;
  ASSERT_FALSE(CheckFit(PlanMemory(in), m, kTmp).fits);
  std::optional<FitSuggestion> s = SuggestChanges(in, kSubGroup, std::nullopt, 1, m, kTmp);
  ASSERT_TRUE(s.has_value());
  ASSERT_EQ(s->changes.size(), 1u);
  EXPECT_EQ(s->changes[0], "offload_optimizer.device: none -> cpu");
}

}  // namespace
}  // namespace strata::runtime
