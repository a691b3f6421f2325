// GradPipeline states, per staging slot: free -> filling (training thread queued its D2H copies)
// -> accumulating (the worker waits for the copies' event, adds into the sub-groups) -> free.
// Lock rule: mu_ guards staging_busy_ only. Between Submit and Drain the worker is the only writer
// of accum_ and of the gradient blocks' contents; the training thread reads accum_ only after
// Drain, and Reset (the optimizer's, at the step) runs only after it (engine.h, "Threads").
#include "runtime/engine/grad_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "base/trace.h"
#include "cpu_optimizer/convert.h"

namespace strata::runtime {
namespace {

// Widens 16-bit gradients to fp32 (exact) into `acc`: overwrite on the window's first micro-batch,
// else accumulate in fp32.
template <typename ToFloat>
void Widen(const uint16_t* src, uint64_t n, bool first, float* acc, ToFloat to_float) {
  if (first) {
    for (uint64_t i = 0; i < n; ++i) acc[i] = to_float(src[i]);
  } else {
    for (uint64_t i = 0; i < n; ++i) acc[i] += to_float(src[i]);
  }
}

}  // namespace

Result<std::unique_ptr<GradPipeline>> GradPipeline::Create(const EngineOptions& options,
                                                           const EngineLayout& layout,
                                                           StateStore& store,
                                                           TorchBoundary& boundary) {
  std::unique_ptr<GradPipeline> p(new GradPipeline(options, layout, store, boundary));
  p->accum_.resize(layout.subgroups.size());
  for (const ParamGroup& g : layout.groups) p->received_.emplace_back(g.params.size(), 0);
  const uint64_t max_group =
      std::max(layout.max_unit_gathered, layout.groups[layout.resident_group].gathered());
  if (layout.world > 1) {
    if (options.grad_communicator == nullptr ||
        options.grad_communicator->world_size() != layout.world ||
        options.grad_communicator->rank() != layout.rank) {
      return InvalidArgumentError(
          "data-parallel ranks need EngineOptions::grad_communicator (a process group of its own "
          "for the gradient hand-off) of the same world size");
    }
    p->reduce_.resize(max_group);
  }
  if (max_group > 0) {
    for (int i = 0; i < 2; ++i) {
      STRATA_ASSIGN_OR_RETURN(PinnedBuffer b,
                              store.arena().Allocate(store.sizes().Param(max_group)));
      p->staging_.push_back(std::move(b));
      MutexLock lock(&p->mu_);
      p->staging_busy_.push_back(false);
    }
  }
  p->worker_ = std::make_unique<Worker>("gradient hand-off");
  return p;
}

GradPipeline::~GradPipeline() { worker_.reset(); }

int GradPipeline::AcquireStaging() {
  MutexLock lock(&mu_);
  for (;;) {
    for (size_t i = 0; i < staging_busy_.size(); ++i) {
      if (!staging_busy_[i]) {
        staging_busy_[i] = true;
        return static_cast<int>(i);
      }
    }
    cv_.Wait(&mu_);
  }
}

void GradPipeline::ReleaseStaging(int slot) {
  {
    MutexLock lock(&mu_);
    staging_busy_[slot] = false;
  }
  cv_.SignalAll();
}

void GradPipeline::Submit(int gi, std::vector<torch::Tensor> grads, bool boundary) {
  const ParamGroup& g = layout_.groups[gi];
  if (g.numel == 0) return;
  DeviceBackend& device = store_.device();
  const int slot = AcquireStaging();
  std::byte* staging = staging_[slot].data();
  const uint64_t c = store_.sizes().compute_bytes;
  const auto dtype = store_.tensor_dtype();
  const auto storage = store_.storage_dtype();
  // On a GPU the gradients are libtorch's, still being computed on its stream: the copies below
  // wait for that on the device.
  if (Status s = store_.OrderHandOffAfterCompute(); !s.ok()) {
    ReleaseStaging(slot);
    boundary_.Throw(s.WithContext("handing off the gradients of " + g.name));
  }
  auto job = std::make_shared<Job>();
  job->group = gi;
  job->staging = slot;
  job->boundary = boundary;
  for (size_t i = 0; i < g.params.size(); ++i) {
    const ParamSlot& p = g.params[i];
    if (grads[i].defined()) received_[gi][i] = 1;
    if (!grads[i].defined()) {
      std::memset(staging + p.offset * c, 0, p.numel * c);
      continue;
    }
    torch::Tensor t = grads[i].contiguous();
    if (t.scalar_type() != dtype) {
      ReleaseStaging(slot);
      boundary_.Throw(InternalError("gradient of " + p.name + " is " +
                                    std::string(c10::toString(t.scalar_type())) + ", expected " +
                                    std::string(c10::toString(dtype))));
    }
    // fp16 on the host-emulated device: the fp32 gradient is rounded to fp16 here, where a GPU
    // would have produced it in fp16, so values beyond 65504 become inf and the loss scaler sees
    // the overflow a GPU run would.
    if (dtype != storage) t = t.to(storage);
    Status s = device.CopyAsync(staging + p.offset * c, t.data_ptr(), p.numel * c,
                                CopyKind::kDeviceToHost, store_.d2h());
    if (!s.ok()) {
      device.Synchronize(store_.d2h()).IgnoreError();  // copies already queued read `t`s we hold
      ReleaseStaging(slot);
      boundary_.Throw(s.WithContext("copying the gradient of " + p.name));
    }
    job->keep_alive.push_back(std::move(t));
  }
  auto ev = device.RecordEvent(store_.d2h());
  if (!ev.ok()) {
    device.Synchronize(store_.d2h()).IgnoreError();
    ReleaseStaging(slot);
    boundary_.Throw(ev.status());
  }
  job->copied = *ev;
  worker_->Submit([this, job] {
    Status s = Accumulate(*job);
    job->keep_alive.clear();
    ReleaseStaging(job->staging);
    return s;
  });
}

Status GradPipeline::Accumulate(Job& job) {
  STRATA_RETURN_IF_ERROR(job.copied.Wait());
  job.keep_alive.clear();
  const ParamGroup& g = layout_.groups[job.group];
  TraceSpan span("gradients", "hand-off " + g.name);
  std::byte* staging = staging_[job.staging].data();
  TierManager& tm = store_.tm();
  // Ranks: every rank's gradients of the whole group are summed into this rank's slice (fp32,
  // widened exactly from bf16/fp16 first); `own` is that slice, element own_begin first.
  const float* own = nullptr;
  if (g.world > 1) {
    float* whole = reduce_.data();
    if (opt_.precision == DType::kFloat32) {
      whole = reinterpret_cast<float*>(staging);
    } else if (opt_.precision == DType::kBFloat16) {
      Widen(reinterpret_cast<const uint16_t*>(staging), g.numel, true, whole,
            cpu_optimizer::Bf16ToFloat);
    } else {
      Widen(reinterpret_cast<const uint16_t*>(staging), g.numel, true, whole,
            cpu_optimizer::HalfToFloat);
    }
    std::fill(whole + g.numel, whole + g.gathered(), 0.0f);  // the padding
    float* mine = whole + static_cast<uint64_t>(layout_.rank) * g.part;
    STRATA_RETURN_IF_ERROR(opt_.grad_communicator->ReduceScatterSum(whole, mine, g.part)
                               .WithContext("reducing the gradients of " + g.name));
    // The mean over ranks (exact for a power-of-two world size).
    const float inv_world = 1.0f / static_cast<float>(g.world);
    for (uint64_t i = 0; i < g.part; ++i) mine[i] *= inv_world;
    own = mine;
  }
  for (const int si : g.subgroups) {
    const SubGroupSpan& sg = layout_.subgroups[si];
    Accum& a = accum_[si];
    const bool first = a.micro_batches == 0;
    STRATA_ASSIGN_OR_RETURN(
        Pin pin, tm.Acquire(store_.subgroup(si).grad, Tier::kPinned,
                            first ? TierManager::Access::kOverwrite : TierManager::Access::kWrite));
    STRATA_RETURN_IF_ERROR(pin.Wait());
    auto* acc = static_cast<float*>(pin.data());
    // fp32 sources (this rank's reduced slice, or fp32 staging) are copied or added; 16-bit
    // staging is widened exactly.
    const float* src = own != nullptr ? own + (sg.begin - g.own_begin)
                       : opt_.precision == DType::kFloat32
                           ? reinterpret_cast<const float*>(staging) + sg.begin
                           : nullptr;
    if (src != nullptr) {
      if (first) {
        std::memcpy(acc, src, sg.numel * 4);
      } else {
        for (uint64_t i = 0; i < sg.numel; ++i) acc[i] += src[i];
      }
    } else if (opt_.precision == DType::kBFloat16) {
      Widen(reinterpret_cast<const uint16_t*>(staging) + sg.begin, sg.numel, first, acc,
            cpu_optimizer::Bf16ToFloat);
    } else {
      Widen(reinterpret_cast<const uint16_t*>(staging) + sg.begin, sg.numel, first, acc,
            cpu_optimizer::HalfToFloat);
    }
    ++a.micro_batches;
    a.sumsq_current = false;
    if (job.boundary) {
      STRATA_ASSIGN_OR_RETURN(a.sumsq,
                              cpu_optimizer::SumOfSquares(acc, DType::kFloat32, sg.numel, 1));
      a.sumsq_current = true;
    }
    pin.MarkDirty();
    if (opt_.optimizer == Home::kNvme) {
      // Written behind: the hand-off goes on to the next sub-group while the disk writes this
      // one, and the pinned copy stays usable (the optimizer reads it in place if it is still
      // resident). A failed write keeps the copy dirty and is reported by the eviction or flush
      // that needs it (TierManager::FlushAsync).
      pin.Release();
      STRATA_RETURN_IF_ERROR(tm.FlushAsync(store_.subgroup(si).grad));
      written_.push_back(store_.subgroup(si).grad);
    }
  }
  return Status::Ok();
}

Status GradPipeline::Drain() {
  Status s = worker_->Drain();
  // Every write started since the last Drain has landed, or its error is returned here (the
  // hand-off is the call that needed it); by now only the last few are still in flight.
  std::vector<BlockId> written = std::move(written_);
  written_.clear();
  for (BlockId id : written) {
    Status f = store_.tm().Flush(id);
    if (s.ok() && !f.ok()) s = std::move(f);
  }
  return s;
}

Status GradPipeline::RefreshSums() {
  TierManager& tm = store_.tm();
  for (size_t si = 0; si < accum_.size(); ++si) {
    Accum& a = accum_[si];
    if (a.micro_batches == 0 || a.sumsq_current) continue;
    STRATA_ASSIGN_OR_RETURN(Pin pin,
                            tm.Acquire(store_.subgroup(static_cast<int>(si)).grad, Tier::kPinned));
    STRATA_RETURN_IF_ERROR(pin.Wait());
    STRATA_ASSIGN_OR_RETURN(
        a.sumsq, cpu_optimizer::SumOfSquares(static_cast<const float*>(pin.data()), DType::kFloat32,
                                             layout_.subgroups[si].numel, 1));
    a.sumsq_current = true;
  }
  return Status::Ok();
}

void GradPipeline::ClearReceived() {
  for (std::vector<uint8_t>& r : received_) std::fill(r.begin(), r.end(), 0);
}

double GradPipeline::SumOfSquares() const {
  double total = 0;
  for (const Accum& a : accum_) {
    if (a.micro_batches > 0) total += a.sumsq;
  }
  return total;
}

int GradPipeline::FirstNonFiniteSubgroup() const {
  for (size_t si = 0; si < accum_.size(); ++si) {
    if (accum_[si].micro_batches > 0 && !std::isfinite(accum_[si].sumsq)) {
      return static_cast<int>(si);
    }
  }
  return -1;
}

}  // namespace strata::runtime
