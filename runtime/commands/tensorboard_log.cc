#include "runtime/commands/tensorboard_log.h"

namespace strata::runtime {

std::vector<metrics::Scalar> TensorBoardScalars(const StepReport& r) {
  auto f = [](double v) { return static_cast<float>(v); };
  std::vector<metrics::Scalar> s = {
      {"train/loss", f(r.loss)},
      {"train/learning_rate", f(r.lr)},
      {"train/grad_norm", f(r.grad_norm)},
      {"train/tokens_per_second", f(r.tokens_per_second)},
      {"train/step_seconds", f(r.step_seconds)},
      {"train/nvme_read_bytes", f(static_cast<double>(r.nvme_read_bytes))},
      {"train/nvme_written_bytes", f(static_cast<double>(r.nvme_written_bytes))},
  };
  if (r.epoch > 0) s.push_back({"train/epoch", f(r.epoch)});
  if (r.eval) {
    s.push_back({"eval/loss", f(r.eval->loss)});
    s.push_back({"eval/perplexity", f(r.eval->perplexity)});
  }
  return s;
}

Result<std::unique_ptr<TensorBoardLog>> TensorBoardLog::Open(const std::string& dir) {
  Result<metrics::EventFileWriter> writer = metrics::EventFileWriter::Create(dir);
  if (!writer.ok()) return writer.status().WithContext("--tensorboard " + dir);
  return std::unique_ptr<TensorBoardLog>(new TensorBoardLog(std::move(*writer)));
}

}  // namespace strata::runtime
