// TorchOptimizer: the no-offload mode's optimizer (offload_optimizer.device "none"): libtorch's
// torch::optim Adam/AdamW/Adagrad over the model's trainable parameters on the compute device,
// with the global norm reduced through the Communicator and the engine's clipping rule
// (numerics/clipping.h). Lion has no torch::optim counterpart and is refused by the engine before
// this is built.
//
// Threads: the training thread.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "base/status.h"
#include "runtime/comm/communicator.h"
#include "runtime/engine/options.h"

namespace strata::runtime {

class TorchOptimizer {
 public:
  // REQUIRES: options.optimizer_options.type is not Lion; model and options outlive it.
  TorchOptimizer(torch::nn::Module& model, const EngineOptions& options)
      : model_(model), opt_(options) {}

  // Clips (global norm over every parameter with a gradient), steps with learning rate `lr`,
  // clears the gradients. Sets *grad_norm to the norm before clipping. A norm that is inf or NaN
  // applies nothing and names the first parameter with a non-finite gradient in *non_finite.
  [[nodiscard]] Status Step(double lr, double* grad_norm, std::string* non_finite);

  // torch::optim's own serialization of its state ("" before the first step).
  [[nodiscard]] Result<std::string> Save() const;
  [[nodiscard]] Status Load(const std::string& bytes, double lr);

 private:
  Status Make(double lr);

  torch::nn::Module& model_;
  const EngineOptions& opt_;
  std::unique_ptr<torch::optim::Optimizer> optim_;  // made at the first step or load
};

}  // namespace strata::runtime
