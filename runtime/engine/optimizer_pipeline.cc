// OptimizerPipeline states, per sub-group g of a step: prefetching (TierManager read of g+1
// started) -> stepping (state and gradient pinned, optimizer running on this thread) -> written
// behind (state pin handed to the writer, flushed while g+1 steps) -> flushed. Per update staging
// slot: free -> holds g's parameters -> H2D in flight (its event) -> free. Per step: idle ->
// Start (device-home sub-groups stepped on the caller's thread) -> deferred running (the other
// groups stepped in order on the `ahead_` worker; each group pending -> done as its last
// sub-group is stepped) -> idle (Finish collected its status).
// Lock rule: mu_ guards pending_, deferred_running_ and deferred_error_ (never held while
// stepping or waiting on the TierManager); the writer's queue is the Worker's, pins and blocks
// are the TierManager's. One StepSubGroups runs at a time: Start steps its own part before
// submitting the deferred one, and waits (Finish) for the previous one first.
#include "runtime/engine/optimizer_pipeline.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "base/trace.h"
#include "cpu_optimizer/convert.h"

namespace strata::runtime {

namespace {

// `p` moved on by `bytes` (null stays null).
void* Advance(void* p, uint64_t bytes) {
  return p == nullptr ? nullptr : static_cast<std::byte*>(p) + bytes;
}
const void* Advance(const void* p, uint64_t bytes) {
  return p == nullptr ? nullptr : static_cast<const std::byte*>(p) + bytes;
}

}  // namespace

Result<std::unique_ptr<OptimizerPipeline>> OptimizerPipeline::Create(
    const EngineOptions& options, const EngineLayout& layout, StateStore& store,
    GradPipeline& grads, const cpu_optimizer::CpuOptimizer& cpu,
    cpu_optimizer::OptimizerType type) {
  std::unique_ptr<OptimizerPipeline> p(
      new OptimizerPipeline(options, layout, store, grads, cpu, type));
  if (layout.max_subgroup_numel > 0) {
    for (int i = 0; i < 2; ++i) {
      STRATA_ASSIGN_OR_RETURN(
          PinnedBuffer b, store.arena().Allocate(store.sizes().Param(layout.max_subgroup_numel)));
      p->update_staging_.push_back(std::move(b));
      p->update_staging_done_.emplace_back();
    }
  }
  for (const ParamGroup& g : layout.groups) {
    p->skips_.emplace_back(g.params.size(), 0);
    p->stepping_.emplace_back(g.params.size(), 1);
  }
  p->had_gradient_.assign(layout.groups.size(), 1);
  p->writer_ = std::make_unique<Worker>("write-behind");
  p->ahead_ = std::make_unique<Worker>("optimizer ahead");
  {
    MutexLock lock(&p->mu_);
    p->pending_.assign(layout.groups.size(), 0);
  }
  p->policy_window_ = store.policy().AddWindow();
  return p;
}

OptimizerPipeline::~OptimizerPipeline() {
  ahead_.reset();  // a deferred step finishes first: it uses the writer
  writer_.reset();
}

uint64_t OptimizerPipeline::elements() const {
  uint64_t n = 0;
  for (const SubGroupSpan& sg : layout_.subgroups) n += sg.numel;
  return n;
}

size_t OptimizerPipeline::PoolSlots() const {
  const PinnedArena* pool = store_.state_pool();
  if (pool == nullptr || pool->slot_bytes() == 0) return 0;
  return static_cast<size_t>(pool->capacity() / pool->slot_bytes());
}

void OptimizerPipeline::PrefetchFirstStates() {
  if (opt_.optimizer != Home::kNvme || !opt_.pipeline || store_.state_pool() == nullptr) return;
  // One slot stays free for the write-behind of the first sub-group stepped.
  const size_t slots = PoolSlots();
  const size_t ahead = slots > 1 ? slots - 1 : 0;
  std::vector<BlockId> upcoming;
  for (size_t si = 0; si < layout_.subgroups.size() && upcoming.size() < ahead; ++si) {
    upcoming.push_back(store_.subgroup(static_cast<int>(si)).state);
  }
  for (BlockId id : upcoming) store_.tm().Prefetch(id, Tier::kPinned).IgnoreError();
}

void OptimizerPipeline::WriteBehind(std::vector<Pin> pins) {
  auto held = std::make_shared<std::vector<Pin>>(std::move(pins));
  writer_->Submit([this, held] {
    Status s;
    for (Pin& p : *held) {
      const BlockId id = p.id();
      p.Release();
      // Started, not awaited: the writer hashes this block while the disk writes the previous
      // ones. Run collects every write (and its error) at the end.
      if (s.ok()) s = store_.tm().FlushAsync(id);
      written_.push_back(id);
    }
    return s;
  });
}

void OptimizerPipeline::FinishGroupUpdate(Pin& pin, int g, bool deferred) {
  pin.MarkDirty();
  if (opt_.params == Home::kNvme) {
    // The values are final: the device copy may be made from them now (the forward gathers g
    // after GroupDone), before updates of the next groups take the pool's slots.
    if (deferred && on_updated_) on_updated_(g);
    std::vector<Pin> pins;
    pins.push_back(std::move(pin));
    WriteBehind(std::move(pins));
  } else {
    pin.Release();
  }
}

bool OptimizerPipeline::Updates(int g) const {
  const std::vector<uint8_t>& s = stepping_[g];
  return std::any_of(s.begin(), s.end(), [](uint8_t x) { return x != 0; });
}

bool OptimizerPipeline::Steps(int si) const {
  return grads_.micro_batches(si) > 0 || opt_.step_without_gradient;
}

Status OptimizerPipeline::Run(int64_t step, double grad_scale, double lr, bool compute) {
  STRATA_RETURN_IF_ERROR(Start(step, grad_scale, lr, compute, /*defer=*/false));
  return Finish();
}

Status OptimizerPipeline::Start(int64_t step, double grad_scale, double lr, bool compute,
                                bool defer) {
  STRATA_RETURN_IF_ERROR(Finish());  // the previous step's deferred part, if any
  cpu_optimizer::StepArgs args;
  args.step = step;
  args.grad_scale = grad_scale;
  args.lr = lr;
  // Which parameters this step updates: those some micro-batch on some rank gave a gradient.
  std::vector<double> any;
  for (size_t g = 0; g < stepping_.size(); ++g) {
    for (uint8_t r : grads_.received(static_cast<int>(g))) any.push_back(r);
  }
  grads_.ClearReceived();
  if (layout_.world > 1 && !any.empty()) {
    STRATA_RETURN_IF_ERROR(opt_.communicator->AllReduceSum(any.data(), any.size())
                               .WithContext("agreeing on the parameters with gradients"));
  }
  size_t at = 0;
  for (size_t g = 0; g < stepping_.size(); ++g) {
    had_gradient_[g] = 0;
    for (size_t i = 0; i < stepping_[g].size(); ++i) {
      const bool received = any[at++] > 0;
      had_gradient_[g] |= received ? 1 : 0;
      stepping_[g][i] = received || opt_.step_without_gradient ? 1 : 0;
      if (!stepping_[g][i]) ++skips_[g][i];
    }
  }
  // Sub-groups with gradients (every one with step_without_gradient: a zero gradient where no
  // hand-off reached it): device homes now (their device copies are read anywhere), the others now
  // or, deferred, on the worker in group order.
  std::vector<int> now, later;
  for (int i = 0; i < static_cast<int>(layout_.subgroups.size()); ++i) {
    if (!Steps(i)) continue;
    const bool device_home = layout_.groups[layout_.subgroups[i].group].home == Home::kDevice;
    (defer && !device_home ? later : now).push_back(i);
  }
  // Marked pending before the device homes are stepped; the deferred part is handed to the worker
  // after them, so the two never use the pools at once.
  if (!later.empty()) {
    MutexLock lock(&mu_);
    for (int si : later) pending_[layout_.subgroups[si].group] = 1;
    deferred_error_ = Status::Ok();
    deferred_running_ = true;
  }
  Status s = StepSubGroups(now, args, compute, /*deferred=*/false);
  if (later.empty()) return s;
  if (!s.ok()) {  // the step failed: nothing more is updated
    MutexLock lock(&mu_);
    std::fill(pending_.begin(), pending_.end(), 0);
    deferred_running_ = false;
    cv_.SignalAll();
    return s;
  }
  // Queued, not started: the first wait (the next forward's first gather, or Finish) starts it,
  // so a step's I/O falls in the window of the step that waits for it, whole.
  MutexLock lock(&mu_);
  queued_ = [this, later = std::move(later), args, compute] {
    TraceSpan span("optimizer", "optimizer step (deferred)");
    Status r = StepSubGroups(later, args, compute, /*deferred=*/true);
    MutexLock lock(&mu_);
    std::fill(pending_.begin(), pending_.end(), 0);
    deferred_error_ = r;
    deferred_running_ = false;
    cv_.SignalAll();
    return Status::Ok();  // reported through Finish/WaitGroup
  };
  return Status::Ok();
}

Status OptimizerPipeline::StepByParameter(int si, const cpu_optimizer::FlatSpan& fs,
                                          const cpu_optimizer::StepArgs& args) const {
  const SubGroupSpan& sg = layout_.subgroups[si];
  const ParamGroup& g = layout_.groups[sg.group];
  const std::vector<uint8_t>& stepping = stepping_[sg.group];
  const std::vector<int64_t>& skips = skips_[sg.group];
  // Runs [begin, end) of the sub-group (elements from sg.begin) sharing one step count; 0: skip.
  struct Run {
    uint64_t begin, end;
    int64_t step;
  };
  std::vector<Run> runs;
  const uint64_t lo = sg.begin, hi = sg.begin + sg.numel;
  for (size_t i = 0; i < g.params.size(); ++i) {
    const ParamSlot& p = g.params[i];
    const uint64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
    if (b >= e) continue;
    const int64_t step = stepping[i] ? args.step - skips[i] : 0;
    if (!runs.empty() && runs.back().end == b - lo && runs.back().step == step) {
      runs.back().end = e - lo;
    } else {
      runs.push_back({b - lo, e - lo, step});
    }
  }
  if (runs.size() == 1 && runs[0].begin == 0 && runs[0].end == sg.numel &&
      runs[0].step == args.step) {
    return StepSpan(fs, args);  // the common case: every parameter stepped, one call
  }
  const uint64_t moment = fs.moment_dtype == DType::kBFloat16 ? 2 : 4;
  const uint64_t grad = fs.grad_dtype == DType::kFloat32 ? 4 : 2;
  for (const Run& r : runs) {
    const uint64_t n = r.end - r.begin;
    cpu_optimizer::FlatSpan part = fs;
    part.numel = n;
    part.params = fs.params + r.begin;
    part.exp_avg = Advance(fs.exp_avg, r.begin * moment);
    part.exp_avg_sq = Advance(fs.exp_avg_sq, r.begin * moment);
    part.grads = Advance(fs.grads, r.begin * grad);
    part.copy_out = Advance(fs.copy_out, r.begin * 2);
    if (r.step > 0) {
      cpu_optimizer::StepArgs a = args;
      a.step = r.step;
      STRATA_RETURN_IF_ERROR(StepSpan(part, a));
    } else if (part.copy_out != nullptr) {
      // Unchanged master: its 16-bit copy again (the copy-out block may be a fresh one).
      auto* dst = static_cast<uint16_t*>(part.copy_out);
      const bool half = part.copy_out_dtype == DType::kFloat16;
      for (uint64_t k = 0; k < n; ++k) {
        dst[k] = half ? cpu_optimizer::FloatToHalf(part.params[k])
                      : cpu_optimizer::FloatToBf16(part.params[k]);
      }
    }
  }
  return Status::Ok();
}

Status OptimizerPipeline::StepSpan(const cpu_optimizer::FlatSpan& fs,
                                   const cpu_optimizer::StepArgs& args) const {
  if (fs.grads != nullptr) return cpu_.Step(fs, args);
  // A zero gradient (fp32), kZeroChunk elements at a time: the update is elementwise, so the
  // chunks give the one call's values.
  static const std::vector<float> zeros(kZeroChunk, 0.0f);
  const uint64_t moment = fs.moment_dtype == DType::kBFloat16 ? 2 : 4;
  for (uint64_t begin = 0; begin < fs.numel; begin += kZeroChunk) {
    cpu_optimizer::FlatSpan part = fs;
    part.numel = std::min<uint64_t>(kZeroChunk, fs.numel - begin);
    part.params = fs.params + begin;
    part.exp_avg = Advance(fs.exp_avg, begin * moment);
    part.exp_avg_sq = Advance(fs.exp_avg_sq, begin * moment);
    part.grads = zeros.data();
    part.grad_dtype = DType::kFloat32;
    part.copy_out = Advance(fs.copy_out, begin * 2);
    STRATA_RETURN_IF_ERROR(cpu_.Step(part, args));
  }
  return Status::Ok();
}

void OptimizerPipeline::Kick() {
  std::function<Status()> job;
  {
    MutexLock lock(&mu_);
    job = std::move(queued_);
    queued_ = nullptr;
  }
  if (job) ahead_->Submit(std::move(job));
}

Status OptimizerPipeline::Finish() {
  Kick();
  MutexLock lock(&mu_);
  while (deferred_running_) cv_.Wait(&mu_);
  Status s = deferred_error_;
  deferred_error_ = Status::Ok();
  return s;
}

bool OptimizerPipeline::Pending(int g) const {
  MutexLock lock(&mu_);
  return pending_[g] != 0;
}

Status OptimizerPipeline::WaitGroup(int g) {
  Kick();
  MutexLock lock(&mu_);
  while (pending_[g] != 0 && deferred_running_) cv_.Wait(&mu_);
  if (pending_[g] == 0 && deferred_error_.ok()) return Status::Ok();
  // Failed before this group was updated (or the whole deferred part failed): its error, kept
  // for Finish too.
  return deferred_error_.ok() ? InternalError("deferred optimizer step stopped") : deferred_error_;
}

void OptimizerPipeline::GroupDone(int g) {
  MutexLock lock(&mu_);
  if (pending_[g] == 0) return;
  pending_[g] = 0;
  cv_.SignalAll();
}

Status OptimizerPipeline::StepSubGroups(const std::vector<int>& order,
                                        const cpu_optimizer::StepArgs& args, bool compute,
                                        bool deferred) {
  if (order.empty()) return Status::Ok();
  TraceSpan span("optimizer", "optimizer step");
  TierManager& tm = store_.tm();
  DeviceBackend& device = store_.device();
  const bool nvme = opt_.optimizer == Home::kNvme;
  // The window of upcoming uses this pass sets (per sub-group, below) ends with it, however it
  // returns: left behind, it would steer the forward's evictions after the step.
  struct ClearWindow {
    FutureUsePolicy* policy;  // null: no window set
    FutureUsePolicy::Window window;
    ~ClearWindow() {
      if (policy != nullptr) policy->SetUpcoming(window, {});
    }
  } clear_window{nvme ? &store_.policy() : nullptr, policy_window_};
  // Sub-groups read ahead: the pool's slots less the one stepping and the one written behind
  // (offload_optimizer.buffer_count sets the slots).
  const size_t read_ahead = std::max<size_t>(1, PoolSlots() > 2 ? PoolSlots() - 2 : 1);
  const uint64_t c = store_.sizes().compute_bytes;
  Pin group_pin;  // the pinned parameter copy being updated (cpu/nvme homes)
  int group_pin_group = -1;
  int just_done = -1;  // the group updated last (done), which a deferred step's forward wants
  int staging_turn = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const int si = order[k];
    const SubGroupSpan& sg = layout_.subgroups[si];
    const ParamGroup& g = layout_.groups[sg.group];
    StateStore::SubGroupBlocks& blocks = store_.subgroup(si);
    if (nvme) {
      // The optimizer's own use order, for eviction from the state and gradient pools: without it
      // the window lists parameters only and every state block looks "never needed again".
      // Groups whose parameter block is their master are read here too.
      // Deferred, the group just updated comes first: the forward gathers it next, from the
      // pinned copy the update left.
      std::vector<BlockId> upcoming;
      if (deferred && just_done >= 0) upcoming.push_back(store_.group(just_done).block);
      for (size_t u = k; u < order.size() && u < k + kPolicyWindow; ++u) {
        const int ug = layout_.subgroups[order[u]].group;
        if (layout_.groups[ug].master_in_params &&
            (u == k || layout_.subgroups[order[u - 1]].group != ug)) {
          upcoming.push_back(store_.group(ug).block);
        }
        upcoming.push_back(store_.subgroup(order[u]).state);
        if (grads_.micro_batches(order[u]) > 0) upcoming.push_back(store_.subgroup(order[u]).grad);
      }
      store_.policy().SetUpcoming(policy_window_, std::move(upcoming));
    }
    if (nvme && opt_.pipeline) {  // read(g+1 .. g+ahead)
      // The next group's master (its parameter block) is read while this group steps: the
      // param pool has a slot for it beside this group's and the previous one's write-behind.
      for (size_t a = k + 1; a < order.size(); ++a) {
        const int ag = layout_.subgroups[order[a]].group;
        if (ag == sg.group) continue;
        if (layout_.groups[ag].master_in_params && layout_.groups[ag].home == Home::kNvme) {
          tm.Prefetch(store_.group(ag).block, Tier::kPinned).IgnoreError();
        }
        break;
      }
      for (size_t a = k + 1; a < order.size() && a <= k + read_ahead; ++a) {
        const StateStore::SubGroupBlocks& next = store_.subgroup(order[a]);
        tm.Prefetch(next.state, Tier::kPinned).IgnoreError();
        if (grads_.micro_batches(order[a]) > 0) tm.Prefetch(next.grad, Tier::kPinned).IgnoreError();
      }
    }
    STRATA_ASSIGN_OR_RETURN(Pin state,
                            tm.Acquire(blocks.state, Tier::kPinned, TierManager::Access::kWrite));
    // A sub-group no hand-off reached (step_without_gradient) steps on zeros (StepSpan): its
    // gradient block is neither read nor written.
    Pin grad;
    if (grads_.micro_batches(si) > 0) {
      STRATA_ASSIGN_OR_RETURN(grad, tm.Acquire(blocks.grad, Tier::kPinned));
      STRATA_RETURN_IF_ERROR(grad.Wait());
    }
    STRATA_RETURN_IF_ERROR(state.Wait());
    const void* grad_data = grad.valid() ? grad.data() : nullptr;

    std::byte* out = nullptr;  // where the updated parameters go (compute dtype)
    const bool device_home = g.home == Home::kDevice;
    int staging = -1;
    if (device_home) {
      staging = staging_turn;
      staging_turn = (staging_turn + 1) % static_cast<int>(update_staging_.size());
      STRATA_RETURN_IF_ERROR(update_staging_done_[staging].Wait());
      out = update_staging_[staging].data();
    } else {
      if (group_pin_group != sg.group) {
        if (group_pin.valid()) {
          FinishGroupUpdate(group_pin, group_pin_group, deferred);
          GroupDone(group_pin_group);
          just_done = group_pin_group;
        }
        // Every sub-group of the group is updated when all had gradients: overwrite, unless the
        // block is the master, which the update reads.
        bool all = !g.master_in_params;
        for (int other : g.subgroups) all = all && Steps(other);
        STRATA_ASSIGN_OR_RETURN(group_pin, tm.Acquire(store_.group(sg.group).block, Tier::kPinned,
                                                      all ? TierManager::Access::kOverwrite
                                                          : TierManager::Access::kWrite));
        STRATA_RETURN_IF_ERROR(group_pin.Wait());
        group_pin_group = sg.group;
        if (all && g.own_numel < g.part) {  // a fresh copy: the slice's padding is zeros
          std::memset(static_cast<std::byte*>(group_pin.data()) + g.own_numel * c, 0,
                      (g.part - g.own_numel) * c);
        }
      }
      // The block is this rank's slice of the group (all of it at world 1).
      out = static_cast<std::byte*>(group_pin.data()) + (sg.begin - g.own_begin) * c;
    }
    if (compute) {
      TraceSpan step_span("cpu optimizer", "step " + g.name + "/" + std::to_string(sg.begin));
      auto* state_data = static_cast<float*>(state.data());
      // master_in_params (fp32): the update runs in place in the parameter block.
      cpu_optimizer::FlatSpan fs =
          g.master_in_params ? StateSpan(type_, sg.numel, reinterpret_cast<float*>(out), state_data,
                                         grad_data, opt_.moment_dtype)
                             : StateSpan(type_, sg.numel, state_data, state_data + sg.numel,
                                         grad_data, opt_.moment_dtype);
      const bool fp32 = opt_.precision == DType::kFloat32;
      if (!fp32) {  // the fused kernel writes the rounded 16-bit copy in the same pass
        fs.copy_out = out;
        fs.copy_out_dtype = opt_.precision == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
      }
      STRATA_RETURN_IF_ERROR(StepByParameter(si, fs, args));
      if (fp32 && !g.master_in_params) std::memcpy(out, state_data, sg.numel * 4);
    }
    state.MarkDirty();
    grad.Release();
    grads_.Reset(si);
    if (device_home) {
      auto* dst = static_cast<std::byte*>(store_.group(sg.group).home_pin.data()) + sg.begin * c;
      STRATA_RETURN_IF_ERROR(
          device.CopyAsync(dst, out, sg.numel * c, CopyKind::kHostToDevice, store_.h2d()));
      STRATA_ASSIGN_OR_RETURN(update_staging_done_[staging], device.RecordEvent(store_.h2d()));
    }
    if (nvme) {  // write(g-1): the writer flushes while the next sub-group steps
      if (opt_.pipeline) {
        std::vector<Pin> pins;
        pins.push_back(std::move(state));
        WriteBehind(std::move(pins));
      } else {
        const BlockId id = state.id();
        state.Release();
        STRATA_RETURN_IF_ERROR(tm.Flush(id));
      }
    }
  }
  if (group_pin.valid()) {
    FinishGroupUpdate(group_pin, group_pin_group, deferred);
    GroupDone(group_pin_group);
  }
  STRATA_RETURN_IF_ERROR(writer_->Drain());
  std::vector<BlockId> written = std::move(written_);
  written_.clear();
  for (BlockId id : written) STRATA_RETURN_IF_ERROR(tm.Flush(id));
  return device.Synchronize(store_.h2d());
}

}  // namespace strata::runtime
