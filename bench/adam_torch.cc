// libtorch side of `strata bench adam`: times torch::optim's step on the same numel and threads.
// The parameter and its gradient are filled like the strata bench's buffers; the first step is
// untimed because it allocates the optimizer state.
#include "bench/adam_torch.h"

#include "strata/config.h"

#if STRATA_HAVE_TORCH
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "base/clock.h"
#endif

namespace strata::bench {

#if STRATA_HAVE_TORCH
Result<TorchStepTiming> TimeTorchOptimizer(std::string_view optimizer, uint64_t numel, int threads,
                                           int steps) {
  if (optimizer != "adam" && optimizer != "adamw" && optimizer != "adagrad") {
    return UnavailableError("libtorch has no " + std::string(optimizer) + " optimizer");
  }
  const int saved_threads = torch::get_num_threads();
  torch::set_num_threads(threads);
  TorchStepTiming timing;
  {
    torch::NoGradGuard no_grad;
    const auto n = static_cast<int64_t>(numel);
    torch::Tensor p = torch::ones({n}).add_(torch::arange(n).remainder_(977).mul_(1e-4));
    torch::Tensor g = torch::arange(n).remainder_(1009).sub_(504).mul_(1e-5);
    p.set_requires_grad(true);
    p.mutable_grad() = g;
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (optimizer == "adam") {
      opt = std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{p},
                                                 torch::optim::AdamOptions(1e-3));
    } else if (optimizer == "adamw") {
      opt = std::make_unique<torch::optim::AdamW>(
          std::vector<torch::Tensor>{p}, torch::optim::AdamWOptions(1e-3).weight_decay(1e-2));
    } else {
      opt = std::make_unique<torch::optim::Adagrad>(std::vector<torch::Tensor>{p},
                                                    torch::optim::AdagradOptions(1e-2));
    }
    opt->step();  // allocates the state
    std::vector<double> times;
    for (int i = 0; i < steps; ++i) {
      Stopwatch sw;
      opt->step();
      times.push_back(sw.Seconds());
    }
    std::sort(times.begin(), times.end());
    timing.steps = steps;
    timing.best_seconds = times.front();
    timing.median_seconds = times[times.size() / 2];
  }
  torch::set_num_threads(saved_threads);
  return timing;
}
#else
Result<TorchStepTiming> TimeTorchOptimizer(std::string_view, uint64_t, int, int) {
  return UnavailableError("not built in");
}
#endif

}  // namespace strata::bench
