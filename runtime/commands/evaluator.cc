// Evaluate: see evaluator.h. Each batch of consecutive windows is one forward of the model under
// NoGradGuard (the engine gathers each unit's parameters as training does); the summed
// cross-entropy is kept in double over every predicted token (over the completion tokens of SFT
// data: its other targets are kIgnoredTarget).
#include "runtime/commands/evaluator.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "base/clock.h"
#include "base/trace.h"
#include "runtime/data/training_data.h"
#include "runtime/engine/engine.h"
#include "runtime/models/causal_lm.h"

namespace strata::runtime {
namespace {

// A loss that is not finite comes from the weights (the data are token ids): name the first
// parameter holding a NaN or an infinity, as training names the unit whose gradients are not.
Status NonFiniteEvalError(Engine& engine, uint64_t first_window, int rows) {
  std::string which;
  Status visited = engine.VisitParameters(
      [&](const std::string& name, const std::vector<int64_t>& shape, const float* values) {
        if (!which.empty()) return Status::Ok();
        uint64_t n = 1;
        for (int64_t d : shape) n *= static_cast<uint64_t>(d);
        for (uint64_t i = 0; i < n; ++i) {
          if (!std::isfinite(values[i])) {
            which = name + " holds " + (std::isnan(values[i]) ? "NaN" : "an infinity") +
                    " (element " + std::to_string(i) + " of " + std::to_string(n) + ")";
            break;
          }
        }
        return Status::Ok();
      });
  STRATA_RETURN_IF_ERROR(visited);
  return FailedPreconditionError(
      "the loss over windows " + std::to_string(first_window) + "-" +
      std::to_string(first_window + rows - 1) + " is not finite: " +
      (which.empty() ? "every parameter is finite, so the activations overflowed (try fp32)"
                     : "parameter " + which + "; the model's weights are damaged"));
}

}  // namespace

Result<EvalReport> Evaluate(const Evaluation& m, int64_t max_batches) {
  Stopwatch w;
  const int batch = m.batch;
  const int seq = m.seq_len;
  uint64_t windows = m.data->Windows(seq);
  if (max_batches > 0) windows = std::min<uint64_t>(windows, max_batches * batch);
  if (windows == 0) {
    return InvalidArgumentError(
        "the data holds no full window of --seq-len + 1 = " + std::to_string(seq + 1) + " tokens");
  }
  EvalReport r;
  double nats = 0;  // summed in double over every predicted token
  // Masked data (SFT): the mean is over the trained targets only (cross_entropy ignores
  // kIgnoredTarget), and they are the tokens reported.
  const bool masked = m.data->Masked();
  uint64_t trained = 0;
  torch::NoGradGuard no_grad;
  for (uint64_t first = 0; first < windows; first += batch) {
    const int rows = static_cast<int>(std::min<uint64_t>(batch, windows - first));
    torch::Tensor x = torch::empty({rows, seq}, torch::kLong);
    torch::Tensor y = torch::empty({rows, seq}, torch::kLong);
    STRATA_RETURN_IF_ERROR(
        m.data->Eval(rows, seq, first, x.data_ptr<int64_t>(), y.data_ptr<int64_t>()));
    if (masked) {
      const int64_t* t = y.data_ptr<int64_t>();
      trained += std::count_if(t, t + y.numel(), [](int64_t v) { return v != kIgnoredTarget; });
    }
    if (!m.device.is_cpu()) {
      x = x.to(m.device);
      y = y.to(m.device);
    }
    double batch_nats = 0;
    try {
      TraceSpan span("compute", "eval forward");
      const torch::Tensor logits = m.lm->Logits(x);
      const torch::Tensor sum = torch::nn::functional::cross_entropy(
          logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), y.reshape({-1}),
          torch::nn::functional::CrossEntropyFuncOptions()
              .reduction(torch::kSum)
              .ignore_index(kIgnoredTarget));
      batch_nats = sum.item<double>();
      // A mixture of experts' router aux loss (models/moe.h), as transformers' loss with labels
      // holds it: counted once per target token of the batch, so a one-batch evaluation reports
      // the mean cross-entropy plus it.
      if (const torch::Tensor aux = m.lm->AuxiliaryLoss(); aux.defined()) {
        const torch::Tensor targets_cpu = y.cpu();
        const int64_t* t = targets_cpu.data_ptr<int64_t>();
        const auto targets =
            std::count_if(t, t + y.numel(), [](int64_t v) { return v != kIgnoredTarget; });
        batch_nats += aux.item<double>() * static_cast<double>(targets);
      }
      m.engine->EndForward();  // an inference engine prefetches the next batch's first units
    } catch (const std::exception& e) {
      m.engine->EndForward();
      Status s = m.engine->ErrorFromException(e);
      return m.compute_error ? m.compute_error("the evaluation's forward", std::move(s)) : s;
    }
    if (!std::isfinite(batch_nats)) return NonFiniteEvalError(*m.engine, first, rows);
    nats += batch_nats;
    ++r.batches;
  }
  r.windows = windows;
  r.tokens = masked ? trained : windows * static_cast<uint64_t>(seq);
  if (r.tokens == 0) {
    return InvalidArgumentError(
        "the evaluation data holds no completion token to evaluate within "
        "--seq-len " +
        std::to_string(seq));
  }
  r.loss = nats / static_cast<double>(r.tokens);
  r.perplexity = std::exp(r.loss);
  r.seconds = w.Seconds();
  return r;
}

}  // namespace strata::runtime
