// Offload units: the submodules (transformer blocks) whose parameters live off the device between
// uses (ARCHITECTURE.md §5).
//
//   blocks->push_back(strata::Offload(Block(cfg)));   // a unit, registered like any submodule
//
// An OffloadUnit adopts the inner module's children and parameters as its own, so parameter names
// stay what the model calls them ("blocks.3.attn.qkv.weight"). Without an engine attached it is a
// plain pass-through. With one (Engine::Create attaches every unit it finds in the model):
//   forward:  gather the unit's parameters onto the device, run the inner module without building
//             an autograd graph, release them; the input is kept as the activation checkpoint.
//   backward: a custom autograd Function gathers again, recomputes the forward from the saved
//             input, backpropagates through it (torch::autograd::grad), hands the parameter
//             gradients to the engine, releases, and returns the input's gradient.
// The inner module must be deterministic (no dropout): the recomputed forward must equal the first.
//
// Conditional units: a unit whose use depends on the data (an expert of a sparse MLP, run only for
// the tokens the router sends to it) is marked set_conditional(true) by the model that owns it.
// The engine keeps such units out of the gather order it records and prefetches along (that order
// stays the same every pass), and fetches them when the model announces them (UnitHooks::Expect).
//
// More than one input: a unit's inner module may take `forward(Tensor x, const UnitInputs& extra)`
// (e.g. a decoder layer's rotary cos/sin). `x` is the differentiable input (the activation that
// flows unit to unit); `extra` are constants of the pass that need no gradient (positions, masks,
// rotary tables): they are kept with the checkpoint and passed again to the recomputation, and
// no gradient flows to them.
//
// Exceptions: this is the libtorch boundary, so failures of the hooks surface as c10::Error, which
// torch propagates out of forward()/backward().
#pragma once

#include <torch/torch.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace strata {

// What an OffloadUnit asks of the engine. Called on the thread running forward/backward.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  // Makes unit `unit`'s parameters usable on the device (the parameter tensors point at them).
  // `tracked`: part of a training pass (forward or backward), so the engine records the order
  // and prefetches along it; false for forwards that build no graph (evaluation).
  virtual void Gather(int unit, bool tracked) = 0;
  // The unit's parameters are no longer needed by this pass.
  virtual void Release(int unit) = 0;
  // The unit's parameters that need gradients, in a fixed order.
  virtual const std::vector<torch::Tensor>& GradParameters(int unit) = 0;
  // Gradients for GradParameters(unit), same order (undefined where a parameter got none).
  virtual void GradientsReady(int unit, std::vector<torch::Tensor> grads) = 0;
  // The units this pass gathers next, nearest first, as soon as the model knows them (a sparse
  // MLP, right after its router's top-k: the experts it is about to run, in the order it runs
  // them; in backward, the same experts in the order their recomputations run). A hint: the
  // engine starts fetching them so that one unit's read overlaps the previous one's compute; the
  // gathers themselves decide what runs, and a unit announced but never gathered costs at most
  // its fetch. Default: nothing.
  virtual void Expect(const std::vector<int>& units) { (void)units; }
};

// The libtorch boundary for the engine's side: a hook that fails throws its Status as a c10::Error
// through Throw (torch propagates that out of forward() and backward()); the Status is kept so the
// code that catches the exception gets it back with its code and message intact (Take), e.g. an
// NVMe read error during a unit's forward stays kIoError instead of becoming a generic error.
// Threads: the training thread (hooks run there).
class TorchBoundary {
 public:
  [[noreturn]] void Throw(Status s);
  // The Status behind `e` if it was thrown by Throw, else kInternal with e.what().
  Status Take(const std::exception& e);

 private:
  Status error_;
};

// The constant extra inputs of a unit (see above).
using UnitInputs = std::vector<torch::Tensor>;

class OffloadUnitImpl : public torch::nn::Module {
 public:
  // `run` calls the inner module (Offload() makes it for either forward signature).
  using RunFn = std::function<torch::Tensor(const torch::Tensor&, const UnitInputs&)>;
  OffloadUnitImpl(std::shared_ptr<torch::nn::Module> inner, RunFn run);

  torch::Tensor forward(torch::Tensor x) { return forward(std::move(x), UnitInputs{}); }
  torch::Tensor forward(torch::Tensor x, const UnitInputs& extra);
  void train(bool on = true) override;

  // Engine side. REQUIRES: hooks outlives the attachment (Detach before it dies).
  void Attach(UnitHooks* hooks, int index);
  void Detach() {
    hooks_ = nullptr;
    index_ = -1;
  }
  bool attached() const { return hooks_ != nullptr; }
  int index() const { return index_; }
  // Data-dependent use (see the file comment). Set by the owning model before the engine starts.
  void set_conditional(bool on) { conditional_ = on; }
  bool conditional() const { return conditional_; }

  // Runs the wrapped module directly (used by the autograd Function).
  torch::Tensor RunInner(const torch::Tensor& x, const UnitInputs& extra) { return run_(x, extra); }
  // The wrapped module. Its children are this unit's children (so a walk of the model's modules
  // meets them), but the module itself is not one: a caller looking for a module type it may be
  // (e.g. a caching attention made a unit of its own) looks here.
  const std::shared_ptr<torch::nn::Module>& inner() const { return inner_; }
  UnitHooks* hooks() const { return hooks_; }

 private:
  std::shared_ptr<torch::nn::Module> inner_;
  RunFn run_;
  UnitHooks* hooks_ = nullptr;
  int index_ = -1;
  bool conditional_ = false;
};
TORCH_MODULE(OffloadUnit);

// Wraps `module` (a torch::nn module holder with forward(Tensor) -> Tensor, or
// forward(Tensor, const UnitInputs&) -> Tensor) as an offload unit.
template <typename ModuleHolder>
OffloadUnit Offload(ModuleHolder module) {
  auto inner = module.ptr();
  OffloadUnitImpl::RunFn run;
  if constexpr (requires(ModuleHolder m, torch::Tensor x, UnitInputs e) { m->forward(x, e); }) {
    run = [inner](const torch::Tensor& x, const UnitInputs& extra) {
      return inner->forward(x, extra);
    };
  } else {
    run = [inner](const torch::Tensor& x, const UnitInputs& extra) {
      TORCH_CHECK(extra.empty(), "this offload unit's module takes one input, got ",
                  extra.size() + 1);
      return inner->forward(x);
    };
  }
  return OffloadUnit(std::move(inner), std::move(run));
}

}  // namespace strata
