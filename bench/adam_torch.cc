// libtorch side of `strata bench adam`: times torch::optim's step on the same numel and threads.
// The parameter and its gradient are filled like the strata bench's buffers; the first step is
// untimed because it allocates the optimizer state. libtorch reports errors (out of memory...) by
// throwing; they become a Status at this boundary.
#include "bench/adam_torch.h"

#include "strata/config.h"

#if STRATA_HAVE_TORCH
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#endif

namespace strata::bench {

#if STRATA_HAVE_TORCH
namespace {

// Restores torch's intra-op thread count on scope exit.
class TorchThreadsScope {
 public:
  explicit TorchThreadsScope(int threads) : saved_(torch::get_num_threads()) {
    torch::set_num_threads(threads);
  }
  ~TorchThreadsScope() { torch::set_num_threads(saved_); }

 private:
  int saved_;
};

TorchStepTiming TimeOrThrow(std::string_view optimizer, uint64_t numel, int threads, int steps) {
  TorchThreadsScope threads_scope(threads);
  torch::NoGradGuard no_grad;
  const auto n = static_cast<int64_t>(numel);
  torch::Tensor p = torch::arange(n, torch::kFloat).remainder_(977).mul_(1e-4).add_(1.0);
  torch::Tensor g = torch::arange(n, torch::kFloat).remainder_(1009).sub_(504).mul_(1e-5);
  p.set_requires_grad(true);
  p.mutable_grad() = g;
  std::unique_ptr<torch::optim::Optimizer> opt;
  const std::vector<torch::Tensor> params = {p};
  if (optimizer == "adam") {
    opt = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
  } else if (optimizer == "adamw") {
    opt = std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(1e-3).weight_decay(1e-2));
  } else {
    opt = std::make_unique<torch::optim::Adagrad>(params, torch::optim::AdagradOptions(1e-2));
  }
  opt->step();  // allocates the state
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    Stopwatch sw;
    opt->step();
    times.push_back(sw.Seconds());
  }
  std::sort(times.begin(), times.end());
  TorchStepTiming timing;
  timing.steps = steps;
  timing.best_seconds = times.front();
  timing.median_seconds = times[times.size() / 2];
  return timing;
}

}  // namespace

Result<TorchStepTiming> TimeTorchOptimizer(std::string_view optimizer, uint64_t numel, int threads,
                                           int steps) {
  if (optimizer != "adam" && optimizer != "adamw" && optimizer != "adagrad") {
    return UnavailableError("libtorch has no " + std::string(optimizer) + " optimizer");
  }
  if (steps < 1) return InvalidArgumentError("steps must be >= 1");
  try {
    return TimeOrThrow(optimizer, numel, threads, steps);
  } catch (const std::exception& e) {
    return InternalError(std::string("libtorch: ") + e.what());
  }
}
#else
Result<TorchStepTiming> TimeTorchOptimizer(std::string_view, uint64_t, int, int) {
  return UnavailableError("not built in");
}
#endif

}  // namespace strata::bench
