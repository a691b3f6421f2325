// runtime/plan/ predicts before launch (no libtorch): the one group/sub-group split (layout.h),
// memory per tier (this file), whether it fits the machine (plan_fit.h), the machine itself
// (machine_info.h), the GPT preset shapes (model_presets.h) and the Llama family's
// (llama_shape.h). The engine sizes its buffers from the same plan, so `strata estimate` and a
// real run agree.
//
// Memory plan: how many bytes of each tier (device, pinned host, pageable host, NVMe) a training
// run needs, item by item, for a given model partition and offload configuration. Placements are
// tiers/tier.h's Home (where state lives) and the plan's columns its Tier.
//
// The engine sizes its pinned arena (tiers/pinned_arena.h) and checks its device budget from this
// plan, and `strata estimate` prints it, so the two always agree. The input is a small struct the
// engine fills from the DeepSpeed config (runtime/config/config.h) and the model's offload units,
// so this file depends on neither.
//
// The layout planned (every buffer padded to `io_align`, so pinned buffers are valid O_DIRECT
// targets and NVMe extents are whole blocks):
//   * Sub-groups: each unit, and the resident group, is cut into chunks of at most
//     `sub_group_size` elements (the optimizer's unit of work and of NVMe swapping).
//   * Parameters (compute_bytes per element). The resident group is always on the device. Units:
//       kDevice: all on the device;
//       kCpu:    all in the pinned arena, plus a device window of 2 × the largest unit (current +
//                next);
//       kNvme:   on NVMe (one padded extent per unit), max(2, param_buffer_count) pinned slots of
//                the largest unit on NVMe, and the same 2-unit device window. With max_in_cpu
//                (offload_param.max_in_cpu, as DeepSpeed's: parameter elements kept in pinned CPU
//                memory), the leading units whose elements sum to at most max_in_cpu are kept in
//                the pinned arena instead, as with kCpu (UnitsInCpu); no slots when none is left
//                on NVMe.
//   * Optimizer state, per sub-group: a state block (state_bytes per element: fp32 master +
//     moments) and an fp32 gradient block (4 bytes per element), padded separately. fp32 runs
//     keep one copy of an offloaded unit's parameters (MasterInParams): the unit's fp32 block is
//     its sub-groups' master, and their state blocks hold the moments only (state_bytes - 4).
//       kDevice: all on the device (no offload);
//       kCpu:    all in the pinned arena;
//       kNvme:   on NVMe; the pinned arena holds OptimizerSubGroupBuffers sub-group buffers of
//                (state + gradient) of the largest sub-group: 3 (read ahead, compute, write
//                behind; 1 without `pipeline`), or more when offload_optimizer.buffer_count asks
//                for more. The backward's gradient hand-off accumulates through the same
//                gradient buffers.
//
//   * Host-RAM tier (PlanInput::host_cache_bytes, SplitHostCache): the blocks it keeps are pinned
//     instead of on NVMe (their rows move from the nvme column to the pinned one); a class with no
//     block left on NVMe has no pinned pool (params.pinned_buffers, optimizer.pinned_buffers).
// Exactness: the engine's pinned arena is exactly pinned_arena_bytes. Its NVMe-backed blocks take
// their pinned copies from fixed-slot pools (PinnedArena::CarvePool) of the sizes and counts
// above, so mixed block sizes cannot fragment the arena and no slack is added.
//   * Staging in the pinned arena, only when the optimizer is offloaded (kCpu or kNvme):
//     device->host gradient staging of 2 × max(largest unit, resident group) × compute_bytes.
//     Whenever anything is offloaded: parameter copy-out staging of 2 × the largest sub-group ×
//     compute_bytes (the updated 16-bit copy on its way to the parameters' home tier).
//   * Device, always: the gradients of one unit and of the resident group (compute_bytes), the
//     activation checkpoints and one unit's working activations.
//   * Host (pageable): the model structure, negligible; a 0 row kept so tables have the tier.
// With nothing offloaded the pinned arena is empty.
//
// Inference (PlanInput::inference: `strata eval`, `strata generate`, DeepSpeed's ZeRO-Inference):
// the parameter items only (the units at their home, their pinned slots and device window as
// above) and one unit's forward activations; no optimizer state, no fp32 gradients, no staging, no
// device gradients, no activation checkpoints (a forward without autograd keeps no unit input);
// generation adds its KV cache on the device (kv_cache_bytes).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "runtime/plan/layout.h"
#include "runtime/plan/llama_shape.h"
#include "runtime/plan/model_presets.h"
#include "tiers/tier.h"

namespace strata::runtime {

struct PlanInput {
  // Units, the resident group (always on the device) and their sub-groups, cut once by
  // plan/layout.h (the engine passes its own layout; estimate one from a preset's shape).
  ModelLayout layout;
  int compute_bytes = 4;  // 4 fp32, 2 bf16/fp16 (the device copy of parameters)
  int state_bytes =
      12;  // fp32 master + optimizer moments per element: Adam/AdamW 12, Adagrad/Lion 8
  Home params = Home::kDevice;     // offload_param.device: none -> kDevice, cpu, nvme
  Home optimizer = Home::kDevice;  // offload_optimizer.device
  int param_buffer_count = 5;      // offload_param.buffer_count
  // offload_param.buffer_size in elements (params kNvme): each pinned slot must hold a whole
  // unit, so a smaller value cannot work (CheckOffloadBuffers). 0: not given; slots are sized to
  // the largest unit on NVMe, never to buffer_size (a bigger slot would hold nothing more).
  uint64_t param_buffer_size = 0;
  // offload_param.max_in_cpu in elements (params kNvme): see UnitsInCpu. 0: every unit on NVMe.
  uint64_t max_in_cpu = 0;
  // offload_optimizer.buffer_count (optimizer kNvme), DeepSpeed's count of pinned swap tensors: a
  // sub-group swaps state_bytes / 4 + 1 of them (fp32 master, moments, fp32 gradient).
  int optimizer_buffer_count = 4;
  bool pipeline = true;  // offload_optimizer.pipeline_read/write
  // No gradients and no optimizer state (see the file comment); the optimizer fields are ignored.
  bool inference = false;
  // Inference: the generation's KV cache on the device (keys and values of every attention layer
  // for the whole sequence); 0 for evaluation.
  uint64_t kv_cache_bytes = 0;
  uint64_t activation_checkpoint_bytes = 0;  // per micro-batch: unit inputs kept for recompute
  uint64_t activation_working_bytes = 0;     // per micro-batch: one unit's activations in recompute
  uint64_t io_align = 4096;  // every pinned allocation and NVMe extent is padded to this
  // The host-RAM tier: pinned bytes beyond the arena this layout needs without it, given to
  // blocks whose home would be NVMe so they stay in RAM instead (SplitHostCache says which). 0:
  // every such block on NVMe (DeepSpeed's all-or-nothing placement).
  uint64_t host_cache_bytes = 0;
  // Units the device window holds beside the resident group (StateStore::device_slots: the
  // device budget less the resident block, over the largest unit); what step_traffic.h counts as
  // still on the device when a unit is used again. 0: not known (estimate: no device given),
  // every gather of a unit on NVMe counted as a read.
  uint64_t device_unit_slots = 0;
  // min(stage3_prefetch_bucket_size, stage3_max_live_parameters): the elements the coordinator's
  // prefetch (and its device horizon, param_coordinator.h) puts on the device ahead of use.
  uint64_t device_prefetch_elements = 50'000'000;
};

struct TierBytes {
  uint64_t device = 0, pinned = 0, host = 0, nvme = 0;

  TierBytes& operator+=(const TierBytes& other);
  bool operator==(const TierBytes&) const = default;
};

struct MemoryPlan {
  TierBytes total;  // the sum of `items`
  // Itemized, in a stable order; names like "params.units", "optimizer.pinned_buffers".
  std::vector<std::pair<std::string, TierBytes>> items;
  uint64_t pinned_arena_bytes = 0;  // == total.pinned: the size to give PinnedArena
  uint64_t device_min_bytes = 0;    // == total.device: the least device memory the run needs
  TierBytes padding;                // included in `total`: bytes added by io_align rounding
  uint64_t largest_unit = 0;        // elements
  uint64_t largest_sub_group = 0;   // elements
  uint64_t sub_groups = 0;          // how many sub-groups (units and resident group together)
};

// REQUIRES: io_align > 0, compute_bytes > 0, state_bytes > 0.
MemoryPlan PlanMemory(const PlanInput& in);

// Which blocks in.host_cache_bytes keeps in pinned RAM instead of on NVMe (a training plan; in
// inference only units). The budget is filled class by class, gradients first (issue 33's order)
// and then by the NVMe bytes a byte of RAM saves per step at accumulation a:
//   1. fp32 gradient accumulators (optimizer on NVMe), sub-groups in layout order: each is
//      written by every hand-off and read back by the next and by the optimizer (4 bytes per
//      element each way per micro-batch: 2a bytes per byte), and in RAM it needs no pinned pool
//      slot to round-trip through;
//   2. whole units' parameters (params on NVMe), after those offload_param.max_in_cpu keeps, as a
//      prefix of the layout (so the units in RAM are UnitsInCpu's): read for the forward and the
//      backward of every micro-batch and written at the step (2a + 1 bytes per byte; fp32 also
//      reads the block as the optimizer's master: 2a + 2), and read on the step's critical path
//      (a gather the compute waits for), where the optimizer's reads overlap the backward;
//   3. optimizer state blocks (optimizer on NVMe), in layout order: read and written once per
//      step (2 bytes per byte).
// Within a class a block that does not fit what is left is skipped (units: the prefix ends) and
// smaller later ones still go (each padded to io_align, as the arena holds it). A block in RAM is
// the same bytes with no NVMe copy: nothing is read back from a drive, and checkpoints read blocks
// wherever they live, so the split may differ between a run and its resume.
struct HostCacheSplit {
  std::vector<uint8_t> grads;  // per sub-group of in.layout: 1 = the gradient block is in RAM
  std::vector<uint8_t> state;  // per sub-group: 1 = the state block is in RAM
  size_t units = 0;            // units in RAM beyond offload_param.max_in_cpu's
  uint64_t grad_bytes = 0, state_bytes = 0, unit_bytes = 0;  // padded, as the arena holds them
  uint64_t bytes() const { return grad_bytes + state_bytes + unit_bytes; }
};
HostCacheSplit SplitHostCache(const PlanInput& in);
// Whether a class of HostCacheSplit (grads or state) leaves a block on NVMe: its pinned pool is
// needed (optimizer.pinned_buffers).
bool AnyOnNvme(const std::vector<uint8_t>& in_ram);

// How many leading units keep their parameters in pinned host memory: with params kNvme, the
// longest prefix of in.layout.unit_numel whose elements sum to at most in.max_in_cpu (DeepSpeed
// fills its CPU buffer in parameter order until max_in_cpu; strata's grain is the unit), plus
// the units the host-RAM tier keeps (SplitHostCache(in).units); else 0.
size_t UnitsInCpu(const PlanInput& in);
// The largest unit whose parameters live on NVMe (elements; 0 when none does).
uint64_t LargestNvmeUnit(const PlanInput& in);
// Whether group `group` (an index into in.layout: units first, then the resident group) keeps
// its fp32 master in its parameter block, the one copy of its parameters: fp32 (compute_bytes 4),
// an offloaded unit (not the resident group, not params kDevice), with the optimizer offloaded
// to the unit's home or nearer (unit on cpu: optimizer cpu or nvme; unit on nvme: optimizer
// nvme). A unit on NVMe with the optimizer on cpu keeps its master pinned, as before: reading it
// from NVMe would add bytes, not save them. Never in inference (there is no master).
bool MasterInParams(const PlanInput& in, int group);
// Bytes of sub-group `sg`'s state block before padding: numel x state_bytes, less the master
// when its group keeps it in the parameter block.
uint64_t StateBlockBytes(const PlanInput& in, const SubGroupSpan& sg);
// The largest StateBlockBytes of in.layout's sub-groups (the state pool's slot before padding).
uint64_t LargestStateBlockBytes(const PlanInput& in);
// Tensors one optimizer sub-group swaps: state_bytes / 4 (master and moments) + 1 (gradient).
int SwapTensorsPerSubGroup(const PlanInput& in);
// Sub-group buffers in each optimizer pinned pool (state, gradients) when the optimizer is on
// NVMe: what the pipeline needs (3, or 1 without `pipeline`), or more when
// optimizer_buffer_count / SwapTensorsPerSubGroup is larger (the extra ones cache sub-groups).
uint64_t OptimizerSubGroupBuffers(const PlanInput& in);
// The buffer keys against the layout: kInvalidArgument naming the key and the least value that
// works when param_buffer_size is below LargestNvmeUnit, or optimizer_buffer_count below
// SwapTensorsPerSubGroup (DeepSpeed fails then too: "ran out of swap buffers").
Status CheckOffloadBuffers(const PlanInput& in);
// A host budget (--host-memory, strata.host_memory) bounds the process's host memory: the
// pinned arena, the host-RAM tier, and what the process holds beside them (HostBeside): itself
// (libtorch, the model's structure, the data, allocator slack: kHostProcessReserve) and, on the
// host-emulated device, that device's memory, which is host RAM there (on a GPU it is not).
inline constexpr uint64_t kHostProcessReserve = 512ull << 20;
struct HostBeside {
  uint64_t process = 0;          // kHostProcessReserve where a budget applies
  uint64_t emulated_device = 0;  // the host-emulated device's budget; 0 on a GPU
  uint64_t total() const { return process + emulated_device; }
};

// The host-emulated device's budget when `strata train --device-memory` is not given, as the
// engine opens it (engine/state_store.h OwnedHostDeviceBudget): every unit's gathered parameters
// and the resident group's, padded, with two gather buffers when ranks partition offloaded units,
// plus 64 MiB.
uint64_t EmulatedDeviceDefaultBudget(const PlanInput& in);

// The units a device of `device_budget` bytes holds beside the resident group (and, with ranks
// partitioning offloaded units, two gather buffers): PlanInput::device_unit_slots as the engine
// opens it (StateStore::device_slots). 0 with parameters on the device, no units, or a budget
// that holds none.
uint64_t DeviceUnitSlots(const PlanInput& in, uint64_t device_budget);

// The host budget a run gets without --host-memory or strata.host_memory ("auto"): of the
// memory this process may still take, `available` (MemAvailable, and under a cgroup v2 limit the
// limit less the group's usage, whichever is less), all but a quarter and at least 2 GiB, left
// for the OS's page cache, the data loader and other processes: available - max(available / 4,
// 2 GiB), or 0 below 2 GiB. The process's own memory comes out of it (HostBeside).
uint64_t DefaultHostBudget(uint64_t available);
// The host-RAM tier's bytes for a host budget `budget`: what is left after `beside` and the arena
// `in` needs without the tier (0 when they do not fit; the caller refuses an explicit budget that
// small). The result is what to set in.host_cache_bytes to.
uint64_t HostCacheBytesFor(const PlanInput& in, uint64_t budget, const HostBeside& beside);

// The error for a pinned arena of `arena` bytes (plan.pinned_arena_bytes, or an override) that
// with `beside` does not fit a host-memory budget of `budget` bytes set by `source` (e.g.
// "--host-memory"): kInvalidArgument naming the source, the budget, the need (arena + beside) and
// its parts, with the keys that shrink the arena. REQUIRES: arena + beside.total() > budget.
Status HostBudgetError(const MemoryPlan& plan, uint64_t arena, const HostBeside& beside,
                       uint64_t budget, const std::string& source);

// NVMe bytes of the plan by where they go: the parameters' items ("params.*": offload_param's
// nvme_path) and the others (the optimizer's state and fp32 gradients: offload_optimizer's).
struct NvmeNeed {
  uint64_t params = 0;
  uint64_t optimizer = 0;
};
NvmeNeed NvmeBytesByPath(const MemoryPlan& plan);
// The error for an nvme_path whose filesystem has `free_bytes` available where the run's swap
// files need `need` (`what` names the path and the config keys that point at it): kInvalidArgument
// naming both figures and the keys that shrink the need. REQUIRES: need > free_bytes.
Status DiskSpaceError(const std::string& what, uint64_t need, uint64_t free_bytes);

// Activation bytes per micro-batch of a GPT (model_presets.h) at `compute_bytes` per value:
//   checkpoint = n_layers · mb · seq · d · bytes  (each block's input, kept for recompute)
//   working    = mb · seq · (16·d + 2·heads·seq) · bytes, one block's activations while it is
//                recomputed and backpropagated (a rough count: two LayerNorm outputs 2d, qkv 3d,
//                attention output d, out-projection d, MLP hidden 4d and its GELU 4d, residual 1d:
//                16d per token; attention scores and softmax probabilities: 2·heads·seq per token).
struct ActivationBytes {
  uint64_t checkpoint = 0;
  uint64_t working = 0;
};
ActivationBytes GptActivationBytes(const GptShape& shape, int micro_batch, int compute_bytes);

// Activation bytes per micro-batch of a Llama-family model (llama_shape.h) at `seq_len` tokens and
// `compute_bytes` per value, counted as GptActivationBytes counts a GPT block. With B =
// micro_batch, T = seq_len, h = hidden_size, q = heads·head_dim, kv = kv_heads·head_dim, i =
// intermediate_size:
//   checkpoint = layers · B · T · h · bytes  (each decoder layer's input, kept for recompute)
//   working    = B · T · (4·h + 2·q + 2·kv + 4·i) · bytes  +  B · heads · T² · (4 + bytes)
//              + B · T · vocab · 4,
//     one layer's activations while it is recomputed and backpropagated (a rough count: the two
//     RMSNorm outputs 2h, q, k and v q + 2kv, the attention output q, o_proj's output h, the
//     residual h; gate, up, silu(gate) and their product 4i, what autograd keeps of the SwiGLU
//     MLP; the attention probabilities from the fp32 softmax, 4 bytes per score, and their
//     compute-dtype copy multiplied with v), plus the fp32 logits the loss is taken on (added, not
//     maxed with the layer's set: an upper bound). Gemma 2 adds B · T · 4h · bytes (its two
//     further norms) and, per soft-cap, its tanh: B · heads · T² · bytes for the attention scores,
//     B · T · vocab · bytes for the logits.
ActivationBytes LlamaActivationBytes(const LlamaShape& shape, int micro_batch, int seq_len,
                                     int compute_bytes);

// DeepSpeed's estimate_zero3_model_states_mem_needs for `num_gpus` GPUs on one node with zero_init
// and its additional_buffer_factor 1.5 on CPU figures (deepspeed-offload.md §5), for comparison:
// GPU figures per GPU, CPU figures for the node. It does
// not model NVMe (an NVMe mode is estimated as the matching CPU mode), pinned buffers, padding or
// activations. P = total parameters, L = parameters of the largest layer (leaf module).
struct DeepSpeedEstimate {
  uint64_t gpu = 0;
  uint64_t cpu = 0;
};
DeepSpeedEstimate DeepSpeedZero3Estimate(uint64_t total_params, uint64_t largest_layer_params,
                                         bool offload_optimizer, bool offload_params,
                                         int num_gpus = 1);

// A PlanInput for `shape` with its n_layers blocks as units cut into sub-groups of
// `sub_group_size` elements and its activations at `micro_batch`; other fields keep their defaults
// except compute_bytes. A block's tensors of at most `persistence_threshold` elements
// (stage3_param_persistence_threshold; 0: none) are resident, as the engine keeps them
// (engine/engine_layout.h PartitionModel), so the plan is the engine's to the byte.
PlanInput GptPlanInput(const GptShape& shape, int micro_batch, int compute_bytes,
                       uint64_t sub_group_size, uint64_t persistence_threshold = 0);

// The same for a Llama-family model: its num_hidden_layers decoder layers (LlamaLayerParams each)
// as units, the embedding, final norm and untied head (LlamaResidentParams) as the resident
// group, and LlamaActivationBytes at `micro_batch` × `seq_len`. With shape.page_experts (a mixture
// of experts) the units are LlamaLayerUnits' (attention, each expert, shared expert or MLP, layer
// by layer) and the layers' norms and routers are resident, as the engine partitions that model.
PlanInput LlamaPlanInput(const LlamaShape& shape, int micro_batch, int seq_len, int compute_bytes,
                         uint64_t sub_group_size, uint64_t persistence_threshold = 0);

}  // namespace strata::runtime
