// A program built against an installed strata (find_package(strata), examples/consumer/): trains
// a few steps of the tiny GPT preset on the host device with strata's Trainer and prints each
// step's loss, in the shortest form that reads back as the same double.
//
// Usage: train_tiny CONFIG DATA STEPS
//   CONFIG  DeepSpeed JSON config   DATA  a text file   STEPS  optimizer steps
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "base/status.h"
#include "runtime/commands/trainer.h"
#include "strata/config.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s CONFIG DATA STEPS\n", argv[0]);
    return 2;
  }
  strata::runtime::TrainerOptions options;
  options.config = argv[1];
  options.data = argv[2];
  options.steps = std::atoll(argv[3]);
  options.model = "tiny";
  options.device = "host";
  options.threads = 1;

  strata::Result<std::unique_ptr<strata::runtime::Trainer>> trainer =
      strata::runtime::Trainer::Create(options);
  if (!trainer.ok()) {
    std::fprintf(stderr, "train_tiny: %s\n", trainer.status().ToString().c_str());
    return 1;
  }
  strata::Result<strata::runtime::RunSummary> summary = (*trainer)->Run(
      [](const strata::runtime::StepReport& report) {
        char loss[64];
        const std::to_chars_result end = std::to_chars(loss, loss + sizeof(loss), report.loss);
        std::printf("step %lld loss %.*s\n", static_cast<long long>(report.step),
                    static_cast<int>(end.ptr - loss), loss);
      },
      /*stop=*/nullptr);
  if (!summary.ok()) {
    std::fprintf(stderr, "train_tiny: %s\n", summary.status().ToString().c_str());
    return 1;
  }
  std::printf("strata %s: %lld steps\n", STRATA_VERSION, static_cast<long long>(summary->step));
  return 0;
}
