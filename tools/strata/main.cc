// The `strata` binary: registers the runtime and bench commands with the command framework
// (runtime/commands/command.h), which owns parsing, output, exit codes and Ctrl-C.
#include <string>

#include "bench/commands.h"
#include "runtime/commands/command.h"
#include "runtime/commands/commands.h"
#include "strata/config.h"

int main(int argc, char** argv) {
  using namespace strata;
  runtime::CommandLine cli(
      "strata: train models larger than GPU memory by paging state between HBM, pinned host RAM "
      "and NVMe",
      std::string("strata ") + STRATA_VERSION);
  cli.AddGroup("bench", "Measure one part of the machine or of strata");
  cli.Add(bench::NewBenchIoCommand(), "bench");
  cli.Add(bench::NewBenchAdamCommand(), "bench");
  cli.Add(bench::NewBenchTiersCommand(), "bench");
#if STRATA_HAVE_TORCH
  cli.Add(bench::NewBenchStepCommand(), "bench");
#endif
  cli.Add(bench::NewTuneIoCommand());
  cli.Add(runtime::NewCleanCommand());
  cli.Add(runtime::NewEstimateCommand());
  cli.Add(runtime::NewReportCommand());
  cli.Add(runtime::NewTokenizeCommand());
#if STRATA_HAVE_TORCH
  cli.Add(runtime::NewTrainCommand());
  cli.Add(runtime::NewEvalCommand());
#endif
  return cli.Run(argc, argv);
}
