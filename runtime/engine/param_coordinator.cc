// ParamCoordinator states, per pass: recording (no valid trace: gathers only append to the pass)
// -> following (trace valid, each gather matches trace[pos]: prefetch ahead of pos) -> diverged
// (a gather did not match: no prefetching until EndPass re-records). Per group: released
// (depth 0, no pin) <-> gathered (depth >= 1, a device pin; the parameters view it).
// Announcements (Expect) live in expected_ until their units are gathered; sites_ keep, per
// announcement of a pass, its anchor, units and history from the passes before (updated at each
// Expect, anchors committed at EndPass).
// Lock rule: the training thread owns all of it but the device horizon (the units the last
// Prefetch would copy to the device), which Updated reads on the optimizer's deferred worker:
// horizon_mu_ guards it, and neither thread calls out while holding it.
#include "runtime/engine/param_coordinator.h"

#include <algorithm>
#include <future>
#include <limits>
#include <string>

#include "base/clock.h"
#include "base/logging.h"
#include "base/trace.h"
#include "runtime/engine/optimizer_pipeline.h"

namespace strata::runtime {

ParamCoordinator::ParamCoordinator(const EngineOptions& options, const EngineLayout& layout,
                                   StateStore& store, TorchBoundary& boundary)
    : opt_(options),
      layout_(layout),
      store_(store),
      boundary_(boundary),
      policy_window_(store.policy().AddWindow()),
      gathered_(layout.groups.size()),
      gathered_whole_(layout.groups.size()),
      gather_buffer_user_(store.gather_buffers().size(), -1),
      depth_(layout.groups.size(), 0) {
  if (layout.world > 1 && options.params != Home::kDevice &&
      options.gather_communicator != nullptr) {
    gather_worker_ = std::make_unique<Worker>("ahead all-gather");
  }
}

double ParamCoordinator::TakeGatherWaitSeconds() {
  const double s = gather_wait_seconds_;
  gather_wait_seconds_ = 0;
  return s;
}

double ParamCoordinator::TakeOptimizerWaitSeconds() {
  const double s = optimizer_wait_seconds_;
  optimizer_wait_seconds_ = 0;
  return s;
}

int ParamCoordinator::FreeGatherBuffer() {
  for (size_t i = 0; i < gather_buffer_user_.size(); ++i) {
    if (gather_buffer_user_[i] == -1) return static_cast<int>(i);
  }
  return -1;
}

Status ParamCoordinator::AllGatherUnit(int u, void* whole, Communicator& comm) {
  const ParamGroup& g = layout_.groups[u];
  auto pin = store_.tm().Acquire(store_.group(u).block, Tier::kDevice, TierManager::Access::kRead);
  STRATA_RETURN_IF_ERROR(pin.status());
  STRATA_RETURN_IF_ERROR(pin->Wait());
  return comm.AllGather(pin->data(), whole, g.part * store_.sizes().compute_bytes);
}

void ParamCoordinator::StartAheadGather() {
  if (gather_worker_ == nullptr || ahead_.unit >= 0 || !trace_valid_ || pass_diverged_ ||
      pos_ >= trace_.size()) {
    return;
  }
  const int v = trace_[pos_];
  const ParamGroup& g = layout_.groups[v];
  if (g.home == Home::kDevice || g.numel == 0 || depth_[v] > 0) return;
  const int b = FreeGatherBuffer();
  if (b < 0) return;
  // Every input of this decision (the trace, the pass position, depths, buffer use) is the same
  // on every rank, so every rank starts the same all-gathers in the same order.
  // On a GPU, kernels enqueued before buffer b's release may still read it; the worker's collective
  // is ordered after its own thread's stream only, so it first waits for this point of the
  // compute stream.
  Result<Event> computed = store_.RecordCompute();
  gather_buffer_user_[b] = kAheadUser;
  auto done = std::make_shared<std::promise<Status>>();
  ahead_ = {v, b, done->get_future().share()};
  void* whole = store_.gather_buffers()[b].data();
  gather_worker_->Submit([this, v, whole, done, computed = std::move(computed)] {
    TraceSpan span("params", "all-gather ahead " + layout_.groups[v].name);
    if (Status w = computed.ok() ? computed->Wait() : computed.status(); !w.ok()) {
      done->set_value(w);
      return Status::Ok();
    }
    if (optimizer_ != nullptr) {  // this rank's slice as the deferred optimizer step leaves it
      if (Status w = optimizer_->WaitGroup(v); !w.ok()) {
        done->set_value(w);
        return Status::Ok();
      }
    }
    done->set_value(AllGatherUnit(v, whole, *opt_.gather_communicator));
    return Status::Ok();  // reported through the future, to the gather that takes it
  });
}

void ParamCoordinator::DropAheadGather() {
  if (ahead_.unit < 0) return;
  (void)ahead_.done.get();  // every rank drops the same one; its all-gather must still finish
  gather_buffer_user_[ahead_.buffer] = -1;
  ahead_ = {};
}

void ParamCoordinator::Gather(int u, bool tracked) {
  const ParamGroup& g = layout_.groups[u];
  if (g.conditional) {
    TakeExpected(u);  // not part of the recorded order
  } else if (tracked) {
    Coordinate(u);
  }
  if (g.home == Home::kDevice || g.numel == 0) return;
  if (depth_[u] == 0 && optimizer_ != nullptr && optimizer_->Pending(u)) {
    Stopwatch wait;
    TraceSpan wait_span("params", "wait for the optimizer step of " + g.name);
    Status w = optimizer_->WaitGroup(u);
    optimizer_wait_seconds_ += wait.Seconds();
    if (!w.ok()) boundary_.Throw(w.WithContext("the optimizer step of " + g.name));
  }
  if (depth_[u]++ > 0) return;
  Stopwatch watch;
  TraceSpan span("params", "gather " + g.name);
  void* base = nullptr;
  Status s;
  if (g.world == 1) {
    auto pin =
        store_.tm().Acquire(store_.group(u).block, Tier::kDevice, TierManager::Access::kRead);
    s = pin.ok() ? pin->Wait() : pin.status();
    if (s.ok()) {
      base = pin->data();
      gathered_[u] = std::move(*pin);
    }
  } else if (ahead_.unit == u) {
    // Its all-gather was started while the previous unit computed.
    s = ahead_.done.get();
    gather_buffer_user_[ahead_.buffer] = u;
    base = store_.gather_buffers()[ahead_.buffer].data();
    ahead_ = {};
    if (!s.ok()) ReleaseGatherBuffer(u);
  } else {
    // This rank's slice to the device, then every rank's slice into the whole unit: in a buffer
    // set aside at start (two), or a buffer of its own for a third nested gather.
    void* whole = nullptr;
    if (const int b = FreeGatherBuffer(); b >= 0) {
      gather_buffer_user_[b] = u;
      whole = store_.gather_buffers()[b].data();
    } else {
      Result<DeviceMemory> own = store_.device().Allocate(store_.sizes().Param(g.gathered()));
      s = own.status();
      if (s.ok()) {
        whole = own->data();
        gathered_whole_[u] = std::move(*own);
      }
    }
    if (s.ok()) s = AllGatherUnit(u, whole, *opt_.communicator);
    if (s.ok()) {
      base = whole;
    } else {
      ReleaseGatherBuffer(u);
    }
  }
  if (!s.ok()) {
    --depth_[u];  // not gathered: the unit's Release will not run, a retry must gather
    boundary_.Throw(s.WithContext("gathering " + g.name));
  }
  if (tracked) StartAheadGather();
  gather_wait_seconds_ += watch.Seconds();
  torch::NoGradGuard no_grad;
  for (const ParamSlot& p : g.params) {
    torch::Tensor var = p.var;
    var.set_data(store_.ViewOf(p, base));
  }
}

void ParamCoordinator::Release(int u) {
  const ParamGroup& g = layout_.groups[u];
  if (g.home == Home::kDevice || g.numel == 0) return;
  if (--depth_[u] > 0) return;
  // On a GPU the unit's kernels may still be reading its memory: copies that could reuse it wait
  // for them on the device (no host wait).
  if (Status s = store_.OrderCopiesAfterCompute(); !s.ok()) {
    boundary_.Throw(s.WithContext("releasing " + g.name));
  }
  torch::NoGradGuard no_grad;
  for (const ParamSlot& p : g.params) {
    torch::Tensor var = p.var;
    var.set_data(store_.Empty());
  }
  gathered_[u].Release();
  ReleaseGatherBuffer(u);
}

void ParamCoordinator::ReleaseGatherBuffer(int u) {
  for (int& user : gather_buffer_user_) {
    if (user == u) user = -1;
  }
  gathered_whole_[u].Reset();
}

void ParamCoordinator::Coordinate(int u) {
  pass_.push_back(u);
  if (!trace_valid_ || pass_diverged_) return;
  if (pos_ < trace_.size() && trace_[pos_] == u) {
    ++pos_;
    Prefetch(/*with_trace=*/true);
    Anticipate();
    return;
  }
  pass_diverged_ = true;
  SetDeviceHorizon({});  // no prefetching for the rest of the pass: no pushes either
  if (warned_divergence_++ < 3) {
    STRATA_LOG(kWarning) << "offload units ran in a new order (position " << pass_.size() - 1
                         << ": expected "
                         << (pos_ < trace_.size() ? layout_.groups[trace_[pos_]].name : "the end")
                         << ", got " << layout_.groups[u].name
                         << "); prefetching stops for this pass and the order is re-recorded";
  }
}

void ParamCoordinator::SetDeviceHorizon(std::vector<int> units) {
  MutexLock l(&horizon_mu_);
  device_horizon_ = std::move(units);
}

void ParamCoordinator::Updated(int u) {
  {
    MutexLock l(&horizon_mu_);
    if (std::find(device_horizon_.begin(), device_horizon_.end(), u) == device_horizon_.end()) {
      return;
    }
  }
  // The forward has not gathered u (it waits for the update, which is not done until the caller
  // returns), so this copy is the one its gather would make, made before the pool evicts u.
  store_.tm().Prefetch(store_.group(u).block, Tier::kDevice).IgnoreError();  // best effort
}

void ParamCoordinator::Prefetch(bool with_trace) {
  if (opt_.params == Home::kDevice) return;
  // The units needed next: the announced ones, then the recorded order from pos_. Without
  // announcements this is the recorded order alone, as it always was.
  with_trace = with_trace && Following();
  if (!with_trace && expected_.empty()) {
    SetDeviceHorizon({});
    return;
  }
  std::vector<int> next = expected_;
  if (with_trace) {
    next.insert(next.end(), trace_.begin() + static_cast<std::ptrdiff_t>(pos_), trace_.end());
  }
  // Device copies: the next units, within the prefetch bucket, the live limit and the slots left
  // besides the one in use (`units` and `elems` already going there).
  const uint64_t device_slots = store_.device_slots();
  const uint64_t device_limit =
      std::min<uint64_t>(opt_.prefetch_bucket_size, opt_.max_live_parameters);
  auto fits_device = [&](uint64_t units, uint64_t elems) {
    return units + 1 < device_slots && elems <= device_limit;
  };
  // The device horizon: the units the loop below copies to the device when none is pending.
  if (opt_.params == Home::kNvme && optimizer_ != nullptr) {
    std::vector<int> horizon;
    uint64_t elems = 0;
    for (const int u : next) {
      const ParamGroup& g = layout_.groups[u];
      if (g.numel == 0 || std::find(horizon.begin(), horizon.end(), u) != horizon.end()) continue;
      if (!fits_device(horizon.size(), elems + g.part)) break;
      elems += g.part;
      horizon.push_back(u);
    }
    SetDeviceHorizon(std::move(horizon));
  }
  // Units a deferred optimizer step has not updated yet are its to read (in the same order);
  // prefetching stops there and the eviction window stays the optimizer's (Updated copies those
  // in the horizon to the device as their updates finish).
  auto pending = [&](int u) { return optimizer_ != nullptr && optimizer_->Pending(u); };
  if (!next.empty() && pending(next[0])) return;
  std::vector<BlockId> upcoming;
  // The unit this gather is for comes first: Coordinate runs before its Acquire, and a window
  // without it would make its device copy the first to go when a prefetch below needs a slot
  // (evicted, then read from NVMe again at once).
  if (with_trace && pos_ > 0) upcoming.push_back(store_.group(trace_[pos_ - 1]).block);
  for (size_t i = 0; i < next.size() && upcoming.size() < 4 * (device_slots + 2); ++i) {
    upcoming.push_back(store_.group(next[i]).block);
  }
  store_.policy().SetUpcoming(policy_window_, upcoming);
  // Device copies as above; pinned copies (NVMe homes): twice as far ahead.
  const uint64_t pinned_slots = opt_.params == Home::kNvme
                                    ? std::max<uint64_t>(2, opt_.param_buffer_count) - 1
                                    : std::numeric_limits<uint64_t>::max();
  uint64_t dev_elems = 0, dev_units = 0, pin_units = 0;
  std::vector<int> seen;
  for (const int u : next) {
    if (std::find(seen.begin(), seen.end(), u) != seen.end()) continue;
    seen.push_back(u);
    const ParamGroup& g = layout_.groups[u];
    if (g.numel == 0) continue;
    if (pending(u)) break;
    const BlockId block = store_.group(u).block;
    // What moves ahead is this rank's slice (all of the unit with one rank).
    const uint64_t elems = g.part;
    const bool to_device = fits_device(dev_units, dev_elems + elems);
    if (to_device) {
      dev_elems += elems;
      ++dev_units;
      ++pin_units;
      store_.tm().Prefetch(block, Tier::kDevice).IgnoreError();  // best effort
    } else if (opt_.params == Home::kNvme && pin_units < pinned_slots &&
               dev_elems + elems <= 2 * std::max<uint64_t>(device_limit, elems)) {
      dev_elems += elems;
      ++pin_units;
      store_.tm().Prefetch(block, Tier::kPinned).IgnoreError();
    } else {
      break;
    }
  }
}

void ParamCoordinator::Expect(const std::vector<int>& units) {
  expected_.clear();
  for (const int u : units) {
    if (u < 0 || u >= layout_.units()) continue;  // a hint: nothing to fetch for it
    if (std::find(expected_.begin(), expected_.end(), u) == expected_.end()) expected_.push_back(u);
  }
  // A pass's announcements form its sites (a pass with no tracked gather yet is not a training
  // pass: an evaluation's forward, whose routing is not the training passes').
  if (!pass_.empty()) {
    const int k = site_calls_++;
    if (static_cast<size_t>(k) >= sites_.size()) sites_.resize(k + 1);
    Site& site = sites_[k];
    site.next_anchor = pass_.size();
    auto announced = [&](int u) {
      return std::find(expected_.begin(), expected_.end(), u) != expected_.end();
    };
    // The speculation made for this site is judged now: what was read and is not announced was
    // read for nothing; it goes first out of the pinned tier.
    for (const int u : site.speculated) {
      if (announced(u)) continue;
      ++speculation_.wasted_units;
      speculation_.wasted_bytes += store_.tm().BlockSize(store_.group(u).block);
      store_.tm().NotNeeded(store_.group(u).block);
    }
    site.speculated.clear();
    // Streaks: announced again here +1, not announced: gone.
    std::vector<std::pair<int, int>> streaks;
    for (const int u : expected_) {
      int n = 1;
      for (const auto& [v, run] : site.streaks) {
        if (v == u) n = run + 1;
      }
      streaks.emplace_back(u, n);
    }
    site.streaks = std::move(streaks);
    site.last = expected_;
  }
  Prefetch(/*with_trace=*/!pass_.empty());
}

void ParamCoordinator::TakeExpected(int u) {
  auto it = std::find(expected_.begin(), expected_.end(), u);
  if (it == expected_.end()) return;
  expected_.erase(it);
  // The next announced units move up into the slots this one leaves (an evaluation's forward,
  // outside training passes, prefetches no recorded order).
  const bool with_trace = !pass_.empty() && Following();
  if (expected_.empty() && !with_trace && opt_.params != Home::kDevice) {
    store_.policy().SetUpcoming(policy_window_, {});  // the window named only announced units
    return;
  }
  Prefetch(with_trace);
}

void ParamCoordinator::Anticipate() {
  if (sites_.empty() || opt_.params == Home::kDevice) return;
  auto pending = [&](int u) { return optimizer_ != nullptr && optimizer_->Pending(u); };
  TierManager& tm = store_.tm();
  const uint64_t pinned_slots = std::max<uint64_t>(2, opt_.param_buffer_count) - 1;
  for (size_t k = static_cast<size_t>(site_calls_); k < sites_.size(); ++k) {
    Site& site = sites_[k];
    if (site.anticipated || site.anchor != pos_) continue;
    site.anticipated = true;
    if (site.replay_of >= 0 && site.replay_of < site_calls_) {
      // Exact: the same units as an announcement earlier in this pass.
      std::vector<int> units = sites_[site.replay_of].last;
      if (site.reversed) std::reverse(units.begin(), units.end());
      expected_ = std::move(units);
      Prefetch(/*with_trace=*/true);
      continue;
    }
    if (opt_.params != Home::kNvme || opt_.speculation_passes <= 0) continue;
    uint64_t started = 0;
    for (const int u : site.last) {
      if (started >= pinned_slots) break;
      int run = 0;
      for (const auto& [v, n] : site.streaks) {
        if (v == u) run = n;
      }
      if (run < opt_.speculation_passes || layout_.groups[u].numel == 0 || pending(u) ||
          depth_[u] > 0) {
        continue;
      }
      const BlockId block = store_.group(u).block;
      if (tm.IsResident(block, Tier::kPinned) || tm.IsValid(block, Tier::kDevice)) continue;
      tm.Prefetch(block, Tier::kPinned).IgnoreError();     // best effort
      if (!tm.IsResident(block, Tier::kPinned)) continue;  // no room: nothing started
      ++started;
      site.speculated.push_back(u);
      ++speculation_.units;
      speculation_.bytes += tm.BlockSize(block);
    }
  }
}

void ParamCoordinator::Invalidate() {
  DropAheadGather();
  trace_valid_ = false;
  expected_.clear();
  sites_.clear();  // anchored in the forgotten order
  site_calls_ = 0;
  SetDeviceHorizon({});
}

ParamCoordinator::~ParamCoordinator() {
  // A started all-gather completes (or fails, if the other ranks are gone) before its buffer goes.
  gather_worker_.reset();
}

void ParamCoordinator::EndPass() {
  DropAheadGather();
  SetDeviceHorizon({});  // the next pass's first Prefetch sets it again
  if (!trace_valid_ || pass_diverged_ || pos_ != trace_.size()) {
    if (trace_valid_ && !pass_diverged_ && pos_ != trace_.size() && warned_divergence_++ < 3) {
      STRATA_LOG(kWarning) << "the pass gathered " << pass_.size() << " units, the recorded one "
                           << trace_.size() << "; re-recording";
    }
    trace_ = pass_;
    trace_valid_ = !trace_.empty();
  }
  pass_.clear();
  pass_diverged_ = false;
  pos_ = 0;
  expected_.clear();
  EndSites();
}

void ParamCoordinator::EndSites() {
  // Sites this pass did not reach lose their history; speculation nobody judged was wasted.
  for (size_t k = 0; k < sites_.size(); ++k) {
    for (const int u : sites_[k].speculated) {
      ++speculation_.wasted_units;
      speculation_.wasted_bytes += store_.tm().BlockSize(store_.group(u).block);
      store_.tm().NotNeeded(store_.group(u).block);
    }
    sites_[k].speculated.clear();
  }
  sites_.resize(static_cast<size_t>(site_calls_));
  for (size_t k = 0; k < sites_.size(); ++k) {
    Site& site = sites_[k];
    site.anchor = site.next_anchor;
    site.anticipated = false;
    site.replay_of = -1;
    site.reversed = false;
    std::vector<int> sorted = site.last;
    std::sort(sorted.begin(), sorted.end());
    for (size_t j = 0; j < k; ++j) {
      std::vector<int> other = sites_[j].last;
      std::sort(other.begin(), other.end());
      if (other != sorted) continue;
      site.replay_of = static_cast<int>(j);
      site.reversed = site.last.size() > 1 &&
                      std::equal(site.last.begin(), site.last.end(), sites_[j].last.rbegin());
      break;
    }
  }
  site_calls_ = 0;
}

void ParamCoordinator::PrefetchNextPass() {
  pos_ = 0;
  if (trace_valid_) Prefetch(/*with_trace=*/true);
}

}  // namespace strata::runtime
