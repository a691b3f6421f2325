// PlanMemory, the GPT presets and the Llama-family plan input, against numbers computed by hand in
// the comments.
#include "runtime/plan/memory_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/plan/llama_shape.h"
#include "runtime/plan/model_presets.h"
#include "runtime/plan/step_traffic.h"

namespace strata::runtime {
namespace {

// Two units of 1000 and 3000 elements, a resident group of 500, bf16 compute, Adam (12 B), and
// sub-groups of at most 2000 elements: sub-groups 1000 | 2000, 1000 | 500 (four, largest 2000).
PlanInput SmallInput(Home params, Home optimizer) {
  PlanInput in;
  in.layout = MakeModelLayout({1000, 3000}, 500, 2000);
  in.compute_bytes = 2;
  in.state_bytes = 12;
  in.params = params;
  in.optimizer = optimizer;
  in.param_buffer_count = 5;
  in.pipeline = true;
  in.activation_checkpoint_bytes = 10000;  // padded: 12288
  in.activation_working_bytes = 5000;      // padded: 8192
  in.io_align = 4096;
  return in;
}

TierBytes Item(const MemoryPlan& plan, const std::string& name) {
  for (const auto& [n, bytes] : plan.items) {
    if (n == name) return bytes;
  }
  ADD_FAILURE() << "no item " << name;
  return {};
}

bool HasItem(const MemoryPlan& plan, const std::string& name) {
  for (const auto& [n, bytes] : plan.items) {
    if (n == name) return true;
  }
  return false;
}

constexpr Home kAll[] = {Home::kDevice, Home::kCpu, Home::kNvme};

TEST(MemoryPlanTest, ItemsSumToTotalsForEveryHome) {
  for (Home p : kAll) {
    for (Home o : kAll) {
      const MemoryPlan plan = PlanMemory(SmallInput(p, o));
      TierBytes sum;
      for (const auto& [name, bytes] : plan.items) {
        sum += bytes;
        EXPECT_EQ(bytes.device % 4096, 0u) << name;
        EXPECT_EQ(bytes.pinned % 4096, 0u) << name;
        EXPECT_EQ(bytes.nvme % 4096, 0u) << name;
      }
      EXPECT_EQ(sum, plan.total) << HomeName(p) << "/" << HomeName(o);
      EXPECT_EQ(plan.pinned_arena_bytes, plan.total.pinned);
      EXPECT_EQ(plan.device_min_bytes, plan.total.device);
      EXPECT_EQ(plan.total.host, 0u);
      EXPECT_TRUE(HasItem(plan, "host.model_structure"));
      EXPECT_EQ(plan.sub_groups, 4u);
      EXPECT_EQ(plan.largest_sub_group, 2000u);
      EXPECT_EQ(plan.largest_unit, 3000u);
    }
  }
}

TEST(MemoryPlanTest, EverythingOnNvmeByHand) {
  const MemoryPlan plan = PlanMemory(SmallInput(Home::kNvme, Home::kNvme));
  // Parameters, 2 B: units 2000 and 6000 B -> extents 4096 + 8192.
  EXPECT_EQ(Item(plan, "params.resident").device, 4096u);  // 1000 B
  EXPECT_EQ(Item(plan, "params.units").nvme, 12288u);
  EXPECT_EQ(Item(plan, "params.units").device, 0u);
  EXPECT_EQ(Item(plan, "params.pinned_buffers").pinned, 5u * 8192);
  EXPECT_EQ(Item(plan, "params.device_window").device, 2u * 8192);
  // State 12 B: 12000, 24000, 12000, 6000 B -> 12288 + 24576 + 12288 + 8192.
  EXPECT_EQ(Item(plan, "optimizer.state").nvme, 57344u);
  // fp32 gradients: 4000, 8000, 4000, 2000 B -> 4096 + 8192 + 4096 + 4096.
  EXPECT_EQ(Item(plan, "optimizer.grads_fp32").nvme, 20480u);
  // Three buffers of the largest sub-group: 3 * (24576 + 8192).
  EXPECT_EQ(Item(plan, "optimizer.pinned_buffers").pinned, 98304u);
  EXPECT_EQ(Item(plan, "staging.grads_d2h").pinned, 2u * 8192);      // 3000 * 2 B
  EXPECT_EQ(Item(plan, "staging.param_copyout").pinned, 2u * 4096);  // 2000 * 2 B
  EXPECT_EQ(Item(plan, "device.grads").device, 8192u + 4096u);
  EXPECT_EQ(Item(plan, "activations.checkpoints").device, 12288u);
  EXPECT_EQ(Item(plan, "activations.working").device, 8192u);

  EXPECT_EQ(plan.total.device, 4096u + 16384 + 12288 + 12288 + 8192);
  EXPECT_EQ(plan.total.pinned, 40960u + 98304 + 16384 + 8192);
  EXPECT_EQ(plan.total.nvme, 12288u + 57344 + 20480);
  EXPECT_EQ(plan.pinned_arena_bytes, 163840u);
}

// The host-RAM tier on the same layout (arena 163840 without it): gradients first (4096, 8192,
// 4096, 4096 = 20480), then leading units (4096, 8192), then state blocks that fit what is left
// (12288, 24576, 12288, 8192). 45056 = 20480 + 12288 (both units) + 12288 (sub-group 0's state;
// nothing is left for the others).
TEST(MemoryPlanTest, HostCacheKeepsGradientsThenUnitsThenStateByHand) {
  PlanInput in = SmallInput(Home::kNvme, Home::kNvme);
  in.host_cache_bytes = 36864;  // gradients and both units; 4096 left holds no state block
  HostCacheSplit split = SplitHostCache(in);
  EXPECT_EQ(split.grad_bytes, 20480u);
  EXPECT_EQ(split.units, 2u);
  EXPECT_EQ(split.unit_bytes, 12288u);
  EXPECT_EQ(split.state_bytes, 0u);
  in.host_cache_bytes = 20480 + 4096 + 4096;  // unit 1 does not fit: the units stop at unit 0
  split = SplitHostCache(in);
  EXPECT_EQ(split.units, 1u);
  EXPECT_EQ(split.state_bytes, 0u);
  EXPECT_EQ(UnitsInCpu(in), 1u);
  const MemoryPlan one_unit = PlanMemory(in);
  EXPECT_EQ(Item(one_unit, "params.units").pinned, 4096u);
  EXPECT_EQ(Item(one_unit, "params.units").nvme, 8192u);
  EXPECT_EQ(Item(one_unit, "params.pinned_buffers").pinned, 5u * 8192);  // unit 1's slots stay

  in.host_cache_bytes = 45056;
  split = SplitHostCache(in);
  EXPECT_EQ(split.grads, (std::vector<uint8_t>{1, 1, 1, 1}));
  EXPECT_EQ(split.state, (std::vector<uint8_t>{1, 0, 0, 0}));
  EXPECT_EQ(split.units, 2u);
  EXPECT_EQ(split.grad_bytes, 20480u);
  EXPECT_EQ(split.state_bytes, 12288u);
  EXPECT_EQ(split.unit_bytes, 12288u);
  EXPECT_EQ(UnitsInCpu(in), 2u);
  const MemoryPlan plan = PlanMemory(in);
  EXPECT_EQ(Item(plan, "optimizer.grads_fp32").pinned, 20480u);
  EXPECT_EQ(Item(plan, "optimizer.grads_fp32").nvme, 0u);
  EXPECT_EQ(Item(plan, "optimizer.state").pinned, 12288u);
  EXPECT_EQ(Item(plan, "optimizer.state").nvme, 45056u);
  EXPECT_EQ(Item(plan, "params.units").pinned, 12288u);
  EXPECT_EQ(Item(plan, "params.units").nvme, 0u);
  // No gradient and no unit left on NVMe: no gradient pool, no parameter slots; the state pool
  // stays.
  EXPECT_EQ(Item(plan, "optimizer.pinned_buffers").pinned, 3u * 24576);
  EXPECT_FALSE(HasItem(plan, "params.pinned_buffers") &&
               Item(plan, "params.pinned_buffers").pinned != 0);
  EXPECT_EQ(plan.pinned_arena_bytes, 163840u - 3 * 8192 - 5 * 8192 + 45056);
  // Two micro-batches per step: no gradient or parameter bytes; the state blocks left on NVMe
  // read and written once (45056 each way).
  const StepTraffic t = NvmeTrafficPerStep(in, 2);
  EXPECT_EQ(t.grads_written, 0);
  EXPECT_EQ(t.grads_read, 0);
  EXPECT_EQ(t.optimizer_read, 45056);
  EXPECT_EQ(t.optimizer_written, 45056);
  EXPECT_EQ(t.params_read, 0);
  in.host_cache_bytes = 36864;
  // What the budget leaves beyond the arena without the tier, and beyond the process and the
  // host-emulated device too where the budget holds them.
  EXPECT_EQ(HostCacheBytesFor(in, 163840 + 36864, {}), 36864u);
  EXPECT_EQ(HostCacheBytesFor(in, 163839, {}), 0u);
  const HostBeside beside{.process = 1000, .emulated_device = 20000};
  EXPECT_EQ(HostCacheBytesFor(in, 163840 + 21000 + 36864, beside), 36864u);
  EXPECT_EQ(HostCacheBytesFor(in, 163840 + 21000, beside), 0u);
  EXPECT_EQ(HostCacheBytesFor(in, 163840 + 20999, beside), 0u);
  // The refusal names the need and each of its parts.
  const Status refused = HostBudgetError(PlanMemory(SmallInput(Home::kNvme, Home::kNvme)), 163840,
                                         beside, 100000, "--host-memory");
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("needs 180.51 KiB of host memory"), std::string::npos)
      << refused.message();
  EXPECT_NE(refused.message().find("host-emulated device's memory 19.53 KiB"), std::string::npos)
      << refused.message();
  EXPECT_NE(refused.message().find("process's own 1000 B"), std::string::npos) << refused.message();
  // A budget that holds everything: no pools for the optimizer, no parameter slots.
  in.host_cache_bytes = 20480 + 57344 + 12288;
  const MemoryPlan all = PlanMemory(in);
  EXPECT_EQ(all.total.nvme, 0u);
  EXPECT_FALSE(HasItem(all, "optimizer.pinned_buffers"));
  EXPECT_FALSE(HasItem(all, "params.pinned_buffers"));
  // The optimizer on the CPU: only units can move (their state is pinned already).
  in = SmallInput(Home::kNvme, Home::kCpu);
  in.host_cache_bytes = 8192;
  EXPECT_TRUE(SplitHostCache(in).grads.empty());
  EXPECT_EQ(SplitHostCache(in).units, 1u);  // unit 0 (4096); unit 1 (8192) does not fit then
}

// NvmeTrafficPerStep counts what a step finds still in memory (step_traffic.h). Six units of
// 1000 fp32 elements (blocks 4096 B; the master in the parameter block), a resident group of 500,
// one sub-group each: state blocks 8000 B -> 8192 (moments only), the resident's 6000 -> 8192;
// gradient blocks 4000 / 2000 B -> 4096. Parameter pool 3 slots, gradient and state pools 3
// (OptimizerSubGroupBuffers), a device window of 4 units.
TEST(MemoryPlanTest, StepTrafficCountsTheBlocksStillInMemoryByHand) {
  PlanInput in;
  in.layout = MakeModelLayout({1000, 1000, 1000, 1000, 1000, 1000}, 500, 2000);
  in.compute_bytes = 4;
  in.state_bytes = 12;
  in.params = Home::kNvme;
  in.optimizer = Home::kNvme;
  in.param_buffer_count = 3;
  in.optimizer_buffer_count = 4;
  in.pipeline = true;
  in.io_align = 4096;
  in.device_unit_slots = 4;
  const StepTraffic t = NvmeTrafficPerStep(in, 1);
  // Forward: every unit from the pinned block its deferred update left. Backward: units 2-5 are
  // still on the device; 0 and 1 read. Master reads: 0-3 are on the device after the backward;
  // 4 and 5 read.
  EXPECT_EQ(t.params_read, 2 * 4096);
  // The gradient pool keeps the hand-off's last three (units 1, 0, the resident). The optimizer
  // steps the resident, then 0, 1 (found), then prefetches 2 (evicting the resident's), 3, 4, 5.
  // Every state block read (two read ahead, the resident's beside them: no re-read).
  EXPECT_EQ(t.optimizer_read, 2 * 4096 + 4 * 4096 + 7 * 8192);
  EXPECT_EQ(t.grads_written, 7 * 4096);
  EXPECT_EQ(t.grads_read, 0);
  EXPECT_EQ(t.optimizer_written, 6 * 4096 + 7 * 8192);

  // Two micro-batches: the second forward reads the units the first backward did not leave on
  // the device (4, 5), the second backward 0 and 1 again; the second hand-off reads back all 7
  // gradient blocks (the pool keeps 3).
  const StepTraffic two = NvmeTrafficPerStep(in, 2);
  EXPECT_EQ(two.params_read, (2 + 2 + 2) * 4096);
  EXPECT_EQ(two.grads_read, 7 * 4096);
  EXPECT_EQ(two.optimizer_read, t.optimizer_read);

  // Without the device window (estimate): the pool's 3 units are held. Backward reads 0-2,
  // masters 3-5.
  in.device_unit_slots = 0;
  EXPECT_EQ(NvmeTrafficPerStep(in, 1).params_read, 3 * 4096);
  EXPECT_EQ(NvmeTrafficPerStep(in, 1).optimizer_read, 3 * 4096 + 4 * 4096 + 7 * 8192);
  // A window of every unit: no parameter read at all.
  in.device_unit_slots = 6;
  EXPECT_EQ(NvmeTrafficPerStep(in, 1).params_read, 0);
  EXPECT_EQ(NvmeTrafficPerStep(in, 1).optimizer_read, 4 * 4096 + 7 * 8192);
  // Gradient and state pools of 10 (buffer_count 30 / 3 swap tensors): every gradient block
  // stays pinned from its hand-off to the step.
  in.optimizer_buffer_count = 30;
  EXPECT_EQ(NvmeTrafficPerStep(in, 2).grads_read, 0);
  EXPECT_EQ(NvmeTrafficPerStep(in, 2).optimizer_read - NvmeTrafficPerStep(in, 2).grads_read,
            7 * 8192);
  // The optimizer in pinned memory: no master in the parameter blocks, and its updates run
  // ahead of the forward (no NVMe to wait for), so the forward is counted as reading every unit;
  // the backward reads 0 and 1.
  in.optimizer = Home::kCpu;
  in.optimizer_buffer_count = 4;
  in.device_unit_slots = 4;
  EXPECT_EQ(NvmeTrafficPerStep(in, 1).params_read, (6 + 2) * 4096);
  EXPECT_EQ(NvmeTrafficPerStep(in, 1).optimizer_read, 0);
  // ... unless the device horizon holds units 1-5 (a slot each beside the one gathered: 6 slots;
  // 5000 elements within device_prefetch_elements): each update goes on to the device as it
  // finishes, and with every unit on the device after the forward the backward reads none either.
  in.device_unit_slots = 6;
  EXPECT_EQ(NvmeTrafficPerStep(in, 1).params_read, 0);
  // One slot fewer (the backward reads unit 0), or a prefetch bucket of 4999 elements: the
  // forward is counted as reading every unit again.
  in.device_unit_slots = 5;
  EXPECT_EQ(NvmeTrafficPerStep(in, 1).params_read, (6 + 1) * 4096);
  in.device_unit_slots = 6;
  in.device_prefetch_elements = 4999;
  EXPECT_EQ(NvmeTrafficPerStep(in, 1).params_read, 6 * 4096);
  in.device_prefetch_elements = 5000;
  EXPECT_EQ(NvmeTrafficPerStep(in, 1).params_read, 0);
}

// Routed experts (a unit use per unit) keep one read per use whatever the windows hold.
TEST(MemoryPlanTest, StepTrafficOfUnitUsesCountsEveryUse) {
  PlanInput in;
  in.layout = MakeModelLayout({1000, 1000}, 500, 2000);
  in.compute_bytes = 4;
  in.params = Home::kNvme;
  in.optimizer = Home::kNvme;
  in.io_align = 4096;
  in.device_unit_slots = 2;
  // The second unit runs in half the steps; skipped without a gradient (a Python model's rule).
  const std::vector<UnitUse> skipped = {{1, 1, 1}, {0.5, 0.5, 0.5}};
  const StepTraffic t = NvmeTrafficPerStep(in, 1, skipped);
  EXPECT_EQ(t.params_read, 2 * 1.5 * 4096);
  // Masters 1.5 blocks; state 8192 each for 1.5 units and the resident (6000 B); gradients 1.5
  // and the resident's.
  EXPECT_EQ(t.optimizer_read, 1.5 * 4096 + 2.5 * 8192 + 2.5 * 4096);
  // Stepped on a zero gradient (strata's models): masters and state of both units, gradients
  // only where there was one; the passes read the same.
  const std::vector<UnitUse> stepped = {{1, 1, 1}, {0.5, 0.5, 1}};
  const StepTraffic z = NvmeTrafficPerStep(in, 1, stepped);
  EXPECT_EQ(z.params_read, t.params_read);
  EXPECT_EQ(z.optimizer_read, 2 * 4096 + 3 * 8192 + 2.5 * 4096);
  EXPECT_EQ(z.grads_written, t.grads_written);
}

TEST(MemoryPlanTest, DefaultHostBudgetLeavesAQuarterAndAtLeast2GiB) {
  constexpr uint64_t kGiB = 1ull << 30;
  EXPECT_EQ(DefaultHostBudget(24 * kGiB), 18 * kGiB);
  EXPECT_EQ(DefaultHostBudget(4 * kGiB), 2 * kGiB);
  EXPECT_EQ(DefaultHostBudget(2 * kGiB), 0u);
  EXPECT_EQ(DefaultHostBudget(0), 0u);
}

// Inference (eval, generate): the parameters' items of the same layout and one unit's forward
// activations, nothing of an optimizer, whatever the configured optimizer home; generation adds its
// KV cache on the device.
TEST(MemoryPlanTest, InferenceHoldsTheWeightsOnly) {
  for (Home o : kAll) {
    PlanInput in = SmallInput(Home::kNvme, o);
    in.inference = true;
    in.kv_cache_bytes = 6000;  // padded: 8192
    const MemoryPlan plan = PlanMemory(in);
    EXPECT_EQ(Item(plan, "params.resident").device, 4096u);
    EXPECT_EQ(Item(plan, "params.units").nvme, 12288u);
    EXPECT_EQ(Item(plan, "params.pinned_buffers").pinned, 5u * 8192);
    EXPECT_EQ(Item(plan, "params.device_window").device, 2u * 8192);
    EXPECT_EQ(Item(plan, "activations.working").device, 8192u);
    EXPECT_EQ(Item(plan, "kv_cache").device, 8192u);
    for (const char* none : {"optimizer.state", "optimizer.grads_fp32", "optimizer.pinned_buffers",
                             "staging.grads_d2h", "staging.param_copyout", "device.grads",
                             "activations.checkpoints"}) {
      EXPECT_FALSE(HasItem(plan, none)) << none;
    }
    EXPECT_EQ(plan.pinned_arena_bytes, 5u * 8192);  // the parameter slots alone
    EXPECT_EQ(plan.total.nvme, 12288u);
    EXPECT_EQ(plan.total.device, 4096u + 16384 + 8192 + 8192);
  }
  // fp32: no master exists, so no group keeps one in its parameter block.
  PlanInput in = SmallInput(Home::kNvme, Home::kNvme);
  in.compute_bytes = 4;
  in.inference = true;
  EXPECT_FALSE(MasterInParams(in, 0));
  // A buffer_count too small for the optimizer's swaps does not matter without an optimizer.
  in.optimizer_buffer_count = 1;
  EXPECT_TRUE(CheckOffloadBuffers(in).ok());
}

// fp32 keeps one copy of an offloaded unit's parameters: its block is the master, so the unit's
// state blocks hold the moments only (8 B per element, not 12); the resident group (device) keeps
// its master in its state. Units on NVMe with the optimizer on the CPU keep the master pinned.
TEST(MemoryPlanTest, Fp32OffloadedUnitsKeepOneParameterCopy) {
  // Sub-groups: unit 0 [1000], unit 1 [2000, 1000], resident [500].
  PlanInput in = SmallInput(Home::kNvme, Home::kNvme);
  in.compute_bytes = 4;
  EXPECT_TRUE(MasterInParams(in, 0));
  EXPECT_TRUE(MasterInParams(in, 1));
  EXPECT_FALSE(MasterInParams(in, 2));  // the resident group
  MemoryPlan plan = PlanMemory(in);
  // 8000, 16000, 8000 B (units) and 6000 B (resident) -> 8192 + 16384 + 8192 + 8192.
  EXPECT_EQ(Item(plan, "optimizer.state").nvme, 40960u);
  EXPECT_EQ(Item(plan, "optimizer.pinned_buffers").pinned, 3u * (16384 + 8192));
  EXPECT_EQ(LargestStateBlockBytes(in), 16000u);

  in.optimizer = Home::kCpu;  // units on NVMe, masters pinned: two copies, as before
  EXPECT_FALSE(MasterInParams(in, 0));
  EXPECT_EQ(Item(PlanMemory(in), "optimizer.state").pinned, 57344u);
  in.max_in_cpu = 1000;  // unit 0 pinned: its block is its master again
  EXPECT_TRUE(MasterInParams(in, 0));
  EXPECT_FALSE(MasterInParams(in, 1));
  EXPECT_EQ(Item(PlanMemory(in), "optimizer.state").pinned, 8192u + 24576 + 12288 + 8192);

  in = SmallInput(Home::kCpu, Home::kNvme);
  in.compute_bytes = 4;
  EXPECT_TRUE(MasterInParams(in, 1));
  EXPECT_EQ(Item(PlanMemory(in), "optimizer.state").nvme, 40960u);
  in.compute_bytes = 2;  // bf16: the 16-bit copy and the fp32 master are two copies
  EXPECT_FALSE(MasterInParams(in, 1));
  EXPECT_EQ(Item(PlanMemory(in), "optimizer.state").nvme, 57344u);
  in = SmallInput(Home::kDevice, Home::kNvme);
  in.compute_bytes = 4;  // parameters on the device
  EXPECT_FALSE(MasterInParams(in, 0));
}

TEST(MemoryPlanTest, NoOffloadHasNoPinnedArena) {
  const MemoryPlan plan = PlanMemory(SmallInput(Home::kDevice, Home::kDevice));
  EXPECT_EQ(plan.pinned_arena_bytes, 0u);
  EXPECT_EQ(plan.total.nvme, 0u);
  EXPECT_FALSE(HasItem(plan, "params.device_window"));
  EXPECT_FALSE(HasItem(plan, "staging.grads_d2h"));
  // resident + units + state + fp32 grads + unit/resident grads + activations.
  EXPECT_EQ(plan.total.device, 4096u + 12288 + 57344 + 20480 + 12288 + 12288 + 8192);
}

TEST(MemoryPlanTest, CpuOffloadKeepsEverythingPinned) {
  const MemoryPlan plan = PlanMemory(SmallInput(Home::kCpu, Home::kCpu));
  EXPECT_EQ(plan.total.nvme, 0u);
  EXPECT_EQ(Item(plan, "params.units").pinned, 12288u);
  EXPECT_FALSE(HasItem(plan, "params.pinned_buffers"));
  EXPECT_FALSE(HasItem(plan, "optimizer.pinned_buffers"));
  EXPECT_EQ(plan.total.pinned, 12288u + 57344 + 20480 + 16384 + 8192);
  EXPECT_EQ(plan.total.device, 4096u + 16384 + 12288 + 12288 + 8192);
}

TEST(MemoryPlanTest, OptimizerOffloadOnlyStagesGradientsAndCopyOut) {
  const MemoryPlan plan = PlanMemory(SmallInput(Home::kDevice, Home::kCpu));
  EXPECT_EQ(Item(plan, "params.units").device, 12288u);
  EXPECT_EQ(plan.total.pinned, 57344u + 20480 + 16384 + 8192);
  EXPECT_FALSE(HasItem(plan, "params.device_window"));
}

TEST(MemoryPlanTest, ParamOffloadWithOptimizerOnDeviceHasCopyOutButNoGradStaging) {
  const MemoryPlan plan = PlanMemory(SmallInput(Home::kNvme, Home::kDevice));
  EXPECT_FALSE(HasItem(plan, "staging.grads_d2h"));
  EXPECT_EQ(plan.total.pinned, 5u * 8192 + 2 * 4096);
  EXPECT_EQ(plan.total.nvme, 12288u);
}

TEST(MemoryPlanTest, PipelineAndBufferCount) {
  PlanInput in = SmallInput(Home::kNvme, Home::kNvme);
  in.pipeline = false;
  in.param_buffer_count = 1;  // at least 2 slots
  const MemoryPlan plan = PlanMemory(in);
  EXPECT_EQ(Item(plan, "optimizer.pinned_buffers").pinned, 24576u + 8192);
  EXPECT_EQ(Item(plan, "params.pinned_buffers").pinned, 2u * 8192);
}

TEST(MemoryPlanTest, PaddingIsTheDifferenceFromUnalignedPlan) {
  for (Home p : kAll) {
    for (Home o : kAll) {
      PlanInput in = SmallInput(p, o);
      const MemoryPlan padded = PlanMemory(in);
      in.io_align = 1;
      const MemoryPlan raw = PlanMemory(in);
      EXPECT_EQ(raw.padding, TierBytes{});
      EXPECT_EQ(padded.total.device - padded.padding.device, raw.total.device);
      EXPECT_EQ(padded.total.pinned - padded.padding.pinned, raw.total.pinned);
      EXPECT_EQ(padded.total.nvme - padded.padding.nvme, raw.total.nvme);
    }
  }
  // Unaligned: state of the nvme/nvme plan is 12 B * (1000 + 3000 + 500) exactly.
  PlanInput in = SmallInput(Home::kNvme, Home::kNvme);
  in.io_align = 1;
  EXPECT_EQ(Item(PlanMemory(in), "optimizer.state").nvme, 12u * 4500);
}

TEST(MemoryPlanTest, SubGroupSplitting) {
  PlanInput in = SmallInput(Home::kCpu, Home::kNvme);
  in.io_align = 1;
  in.layout = MakeModelLayout({1000, 3000}, 500, 1000);  // 1000 | 1000, 1000, 1000 | 500
  MemoryPlan plan = PlanMemory(in);
  EXPECT_EQ(plan.sub_groups, 5u);
  EXPECT_EQ(plan.largest_sub_group, 1000u);
  EXPECT_EQ(Item(plan, "optimizer.pinned_buffers").pinned, 3u * 1000 * (12 + 4));
  EXPECT_EQ(Item(plan, "staging.param_copyout").pinned, 2u * 1000 * 2);

  in.layout = MakeModelLayout({1000, 3000}, 500, 1000000);  // one per unit, one for the resident
  plan = PlanMemory(in);
  EXPECT_EQ(plan.sub_groups, 3u);
  EXPECT_EQ(plan.largest_sub_group, 3000u);
  EXPECT_EQ(Item(plan, "optimizer.pinned_buffers").pinned, 3u * 3000 * 16);

  in.layout = MakeModelLayout({1000, 3000}, 7000, 1000000);  // the resident group can be largest
  plan = PlanMemory(in);
  EXPECT_EQ(plan.largest_sub_group, 7000u);
  EXPECT_EQ(Item(plan, "staging.grads_d2h").pinned, 2u * 7000 * 2);
}

TEST(ModelPresetsTest, TinyCountsByHand) {
  Result<GptShape> tiny = FindGptPreset("tiny");
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  // d = 64: 2 LayerNorms 4d, qkv 3d^2 + 3d, out d^2 + d, MLP 4d^2 + 4d and 4d^2 + d.
  const uint64_t d = 64;
  const uint64_t block =
      4 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d);
  EXPECT_EQ(BlockParams(*tiny), block);
  EXPECT_EQ(BlockParams(*tiny), 49984u);
  // Token embedding 256 x 64, position embedding 64 x 64, final LayerNorm, head 64 x 256.
  EXPECT_EQ(ResidentParams(*tiny), 256u * 64 + 64 * 64 + 2 * 64 + 64 * 256);
  EXPECT_EQ(TotalParams(*tiny), 2 * 49984u + 36992u);
}

TEST(ModelPresetsTest, LookupIsCaseInsensitiveAndErrorsListPresets) {
  Result<GptShape> s = FindGptPreset("1.3b");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->n_layers, 24);
  EXPECT_EQ(s->d_model, 2048);
  EXPECT_EQ(s->seq_len, 2048);
  Result<GptShape> missing = FindGptPreset("gpt5");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  for (const GptShape& p : GptPresets()) {
    EXPECT_NE(missing.status().message().find(p.name), std::string::npos) << p.name;
  }
}

TEST(ModelPresetsTest, PresetsGrowAndHeadsDivideWidth) {
  uint64_t previous = 0;
  for (const GptShape& p : GptPresets()) {
    EXPECT_EQ(p.d_model % p.n_heads, 0) << p.name;
    EXPECT_GT(TotalParams(p), previous) << p.name;
    previous = TotalParams(p);
  }
  // 13B: 40 blocks of 12 * 5120^2 + 13 * 5120 dominate.
  Result<GptShape> big = FindGptPreset("13B");
  ASSERT_TRUE(big.ok());
  EXPECT_GT(TotalParams(*big), 12'500'000'000u);
  EXPECT_LT(TotalParams(*big), 13'000'000'000u);
}

TEST(ActivationTest, GptFormula) {
  Result<GptShape> tiny = FindGptPreset("tiny");
  ASSERT_TRUE(tiny.ok());
  const ActivationBytes a = GptActivationBytes(*tiny, /*micro_batch=*/2, /*compute_bytes=*/4);
  EXPECT_EQ(a.checkpoint, 2u * 2 * 64 * 64 * 4);               // layers * mb * seq * d * bytes
  EXPECT_EQ(a.working, 2u * 64 * (16 * 64 + 2 * 4 * 64) * 4);  // mb * seq * (16d + 2 h seq) * b
  const PlanInput in = GptPlanInput(*tiny, 2, 4, 1'000'000'000);
  EXPECT_EQ(in.layout.unit_numel.size(), 2u);
  EXPECT_EQ(in.layout.unit_numel[0], BlockParams(*tiny));
  EXPECT_EQ(in.layout.resident_numel, ResidentParams(*tiny));
  EXPECT_EQ(in.layout.subgroups.size(), 3u);  // one per block and the resident group
  EXPECT_EQ(in.activation_checkpoint_bytes, a.checkpoint);
  EXPECT_EQ(in.activation_working_bytes, a.working);
}

// llama-tiny: vocab 256, hidden 64, intermediate 160, 2 layers, 4 heads of 16, 2 kv heads, untied.
TEST(LlamaPlanTest, TinyLayoutByHand) {
  Result<LlamaShape> tiny = FindLlamaPreset("llama-tiny");
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  // q 64x64, k and v 32x64, o 64x64, gate and up 160x64, down 64x160, two RMSNorms of 64.
  const uint64_t layer = 4096 + 2 * 2048 + 4096 + 3 * 160 * 64 + 2 * 64;
  EXPECT_EQ(layer, 43136u);
  // Embedding 256x64, final norm 64, lm_head 256x64.
  const uint64_t resident = 256 * 64 + 64 + 256 * 64;
  EXPECT_EQ(resident, 32832u);

  // Sub-groups of 20000: each layer 20000 | 20000 | 3136, the resident group 20000 | 12832.
  const PlanInput in = LlamaPlanInput(*tiny, /*micro_batch=*/2, /*seq_len=*/8,
                                      /*compute_bytes=*/2, /*sub_group_size=*/20000);
  EXPECT_EQ(in.layout.unit_numel, (std::vector<uint64_t>{layer, layer}));
  EXPECT_EQ(in.layout.resident_numel, resident);
  EXPECT_EQ(in.compute_bytes, 2);
  ASSERT_EQ(in.layout.subgroups.size(), 8u);
  EXPECT_EQ(in.layout.subgroups[2], (SubGroupSpan{0, 40000, 3136}));
  EXPECT_EQ(in.layout.subgroups[7], (SubGroupSpan{2, 20000, 12832}));
  EXPECT_EQ(in.layout.largest_sub_group(), 20000u);

  // B 2, T 8, bf16: checkpoints 2 layers x 2 x 8 x 64 x 2 = 4096. Working, per token
  // 4h + 2q + 2kv + 4i = 256 + 128 + 64 + 640 = 1088 values of 2 B, x 16 tokens = 34816; scores
  // 2 x 4 heads x 8 x 8 x (4 + 2) = 3072; fp32 logits 16 x 256 x 4 = 16384.
  EXPECT_EQ(in.activation_checkpoint_bytes, 4096u);
  EXPECT_EQ(in.activation_working_bytes, 34816u + 3072 + 16384);
  const ActivationBytes a = LlamaActivationBytes(*tiny, 2, 8, 2);
  EXPECT_EQ(a.checkpoint, in.activation_checkpoint_bytes);
  EXPECT_EQ(a.working, in.activation_working_bytes);

  // The plan carries them onto the device (padded to io_align).
  const MemoryPlan plan = PlanMemory(in);
  EXPECT_EQ(Item(plan, "activations.checkpoints").device, 4096u);
  EXPECT_EQ(Item(plan, "activations.working").device, 57344u);  // 54272 rounded up to 4096
  EXPECT_EQ(plan.largest_unit, layer);
}

// A Qwen2-like shape with tied embeddings, q/k/v biases and head_dim != hidden / heads.
TEST(LlamaPlanTest, TiedBiasedShapeByHand) {
  LlamaShape s;
  s.name = "hand";
  s.vocab_size = 100;
  s.hidden_size = 32;
  s.intermediate_size = 48;
  s.num_hidden_layers = 3;
  s.num_attention_heads = 4;
  s.num_key_value_heads = 2;
  s.head_dim = 16;  // q 64 wide, k and v 32
  s.tie_word_embeddings = true;
  s.qkv_bias = true;
  // q 64x32, k and v 32x32, o 32x64, MLP 3 x 48x32, norms 2 x 32, biases 64 + 32 + 32.
  const uint64_t layer = 2048 + 2 * 1024 + 2048 + 3 * 1536 + 64 + 128;
  EXPECT_EQ(layer, 10944u);
  const PlanInput in = LlamaPlanInput(s, /*micro_batch=*/1, /*seq_len=*/4, /*compute_bytes=*/4,
                                      /*sub_group_size=*/5000);
  EXPECT_EQ(in.layout.unit_numel, (std::vector<uint64_t>(3, layer)));
  EXPECT_EQ(in.layout.resident_numel, 100u * 32 + 32);  // one embedding (tied) and the final norm
  EXPECT_EQ(in.layout.subgroups.size(), 3u * 3 + 1);    // 5000 | 5000 | 944 per layer, 3232
  EXPECT_EQ(LlamaTotalParams(s), 3 * layer + 3232);
  // Checkpoints 3 x 1 x 4 x 32 x 4 = 1536. Working: per token 4h + 2q + 2kv + 4i = 128 + 128 +
  // 64 + 192 = 512 values of 4 B x 4 tokens = 8192; scores 4 heads x 4 x 4 x (4 + 4) = 512;
  // logits 4 x 100 x 4 = 1600.
  EXPECT_EQ(in.activation_checkpoint_bytes, 1536u);
  EXPECT_EQ(in.activation_working_bytes, 8192u + 512 + 1600);
}

TEST(DeepSpeedEstimateTest, MatchesItsFormulas) {
  const uint64_t p = 1'000'000'000, l = 10'000'000;
  DeepSpeedEstimate both = DeepSpeedZero3Estimate(p, l, true, true);
  EXPECT_EQ(both.gpu, 40'000'000u);
  EXPECT_EQ(both.cpu, 27'000'000'000u);  // 18 P * 1.5
  DeepSpeedEstimate opt = DeepSpeedZero3Estimate(p, l, true, false);
  EXPECT_EQ(opt.gpu, 2'040'000'000u);
  EXPECT_EQ(opt.cpu, 24'000'000'000u);  // 16 P * 1.5
  DeepSpeedEstimate none = DeepSpeedZero3Estimate(p, l, false, false);
  EXPECT_EQ(none.gpu, 18'040'000'000u);
  EXPECT_EQ(none.cpu, 60'000'000u);  // 4 L * 1.5
}

}  // namespace
}  // namespace strata::runtime
