// TorchOptimizer: the no-offload mode's optimizer (offload_optimizer.device "none"): libtorch's
// torch::optim Adam/AdamW/Adagrad over the model's trainable parameters on the compute device,
// with the global norm reduced through the Communicator and the engine's clipping rule
// (numerics/clipping.h). Lion has no torch::optim counterpart and is refused by the engine before
// this is built.
//
// bf16 (EngineOptions::device_masters, a GPU): Init keeps an fp32 master of every trainable
// parameter beside it on the device and turns the parameter into its bf16 compute copy; each
// backward's bf16 gradients are accumulated into the masters' fp32 gradients
// (AccumulateGradients, as the offload modes accumulate the handed-off gradients in fp32), the
// step updates the masters and rounds them into the parameters. fp32: the parameters are their
// own masters.
//
// Threads: the training thread.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/comm/communicator.h"
#include "runtime/engine/options.h"

namespace strata::runtime {

class TorchOptimizer {
 public:
  // REQUIRES: options.optimizer_options.type is not Lion; model and options outlive it.
  // Takes the model's trainable parameters (those that require a gradient now).
  TorchOptimizer(torch::nn::Module& model, const EngineOptions& options);

  // With bf16 and options.device_masters, makes the masters (no-op otherwise). Call once, after
  // the parameters hold their initial values on their device, before the first backward.
  [[nodiscard]] Status Init();
  // After a backward: adds the parameters' gradients (bf16) to the masters' fp32 gradients and
  // clears them. No-op without masters.
  void AccumulateGradients();
  // Drops every accumulated gradient (a failed backward's window: Engine::Backward).
  void DiscardGradients();

  // Clips (global norm over every parameter with a gradient), steps with learning rate `lr`,
  // clears the gradients. Sets *grad_norm to the norm before clipping. A norm that is inf or NaN
  // applies nothing and names the first parameter with a non-finite gradient in *non_finite (or,
  // when non_finite is null, returns FailedPrecondition naming it).
  [[nodiscard]] Status Step(double lr, double* grad_norm, std::string* non_finite = nullptr);

  // The fp32 value of trainable parameter `param` (its master; itself without masters).
  torch::Tensor Fp32Value(const torch::Tensor& param) const;
  // Sets trainable parameter `param` to fp32 `value` (its master, and its bf16 copy rounded).
  void Assign(const torch::Tensor& param, const torch::Tensor& value);

  // torch::optim's own serialization of its state ("" before the first step).
  [[nodiscard]] Result<std::string> Save() const;
  [[nodiscard]] Status Load(const std::string& bytes, double lr);

 private:
  Status Make(double lr);
  // What torch::optim steps: the masters, or the parameters themselves.
  const std::vector<torch::Tensor>& Stepped() const {
    return masters_.empty() ? params_ : masters_;
  }
  // Index of `param` in params_, or -1.
  int64_t IndexOf(const torch::Tensor& param) const;

  torch::nn::Module& model_;
  const EngineOptions& opt_;
  std::vector<std::string> names_;      // trainable parameters, in the model's order
  std::vector<torch::Tensor> params_;   // parallel to names_
  std::vector<torch::Tensor> masters_;  // fp32, parallel to params_; empty without masters
  std::unique_ptr<torch::optim::Optimizer> optim_;  // made at the first step or load
};

}  // namespace strata::runtime
