#include "runtime/engine/io_replay.h"

#include <string>
#include <vector>

#include "runtime/engine/engine_impl.h"

namespace strata::runtime {

Status ReplayPassIo(Engine& engine) {
  Engine::Impl* m = engine.impl();
  if (m == nullptr) return FailedPreconditionError("no offload: nothing to replay");
  ParamCoordinator& c = *m->coordinator;
  if (!c.has_trace()) return FailedPreconditionError("no recorded pass to replay yet");
  const std::vector<int> order = c.trace();
  const EngineLayout& l = m->layout;
  STRATA_RETURN_IF_ERROR(m->optimizer->Finish());  // the last step's deferred part
  std::vector<int> seen(l.groups.size(), 0);
  try {
    c.RestartPass();
    for (int u : order) {
      c.Gather(u, /*tracked=*/true);
      c.Release(u);
      if (++seen[u] == 2) {
        m->grads->Submit(u, std::vector<torch::Tensor>(l.groups[u].params.size()), true);
      }
    }
    m->grads->Submit(l.resident_group,
                     std::vector<torch::Tensor>(l.groups[l.resident_group].params.size()), true);
  } catch (const std::exception& e) {
    m->grads->Drain().IgnoreError();
    return engine.ErrorFromException(e).WithContext("replaying the pass I/O");
  }
  Status s = m->grads->Drain();
  c.EndPass();
  return s;
}

Status ReplayOptimizerIo(Engine& engine) {
  Engine::Impl* m = engine.impl();
  if (m == nullptr) return FailedPreconditionError("no offload: nothing to replay");
  STRATA_RETURN_IF_ERROR(m->grads->Drain());
  return m->optimizer->Run(engine.applied_steps() + 1, 1.0, engine.learning_rate(),
                           /*compute=*/false);
}

uint64_t OptimizerElements(Engine& engine) {
  return engine.impl() ? engine.impl()->optimizer->elements() : 0;
}

uint64_t LargestSubGroupElements(Engine& engine) {
  return engine.impl() ? engine.impl()->layout.max_subgroup_numel : 0;
}

}  // namespace strata::runtime
