// Evaluate: what `strata eval` measures, the mean next-token cross-entropy of a model over
// consecutive windows of its data (over the completion tokens only of SFT records: sft_data.h),
// computed through the engine without gradients. The Trainer
// (trainer.h) calls it between steps with its engine, model and data.
//
// A batch whose loss is not finite ends the evaluation with kFailedPrecondition naming the first
// parameter that holds a NaN or an infinity (the data are token ids, so such a loss comes from the
// weights), or saying that every parameter is finite (the activations overflowed).
//
// Ownership: Evaluation borrows everything it points to; the caller keeps them alive during the
// call. Threads: the engine's training thread, between steps.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>

#include "base/status.h"

namespace strata::runtime {

class CausalLm;
class Engine;
class TrainingData;

// What `strata eval` measures: mean next-token cross-entropy over consecutive windows.
struct EvalReport {
  double loss = 0;        // nats per token
  double perplexity = 0;  // exp(loss)
  uint64_t tokens = 0;    // predicted tokens (windows · seq_len; SFT: the completion tokens)
  uint64_t windows = 0;   // windows, or SFT records when padded
  uint64_t batches = 0;
  double seconds = 0;
};

// The model and data one evaluation reads.
struct Evaluation {
  Engine* engine = nullptr;  // holds the model's parameters
  CausalLm* lm = nullptr;    // computes the logits
  const TrainingData* data = nullptr;
  int batch = 1;                   // windows per forward (train_micro_batch_size_per_gpu)
  int seq_len = 1;                 // windows hold seq_len + 1 tokens
  c10::Device device = c10::kCPU;  // where the model computes (inputs are moved there)
  // What an error out of libtorch's forward (already taken through Engine::ErrorFromException)
  // becomes, given the phase it happened in; null: itself.
  std::function<Status(const std::string& phase, Status)> compute_error;
};

// Mean next-token loss over consecutive windows of seq_len + 1 tokens of the data (batches of
// `batch` windows, at most max_batches of them if > 0). kInvalidArgument when the data holds no
// full window.
Result<EvalReport> Evaluate(const Evaluation& e, int64_t max_batches);

}  // namespace strata::runtime
