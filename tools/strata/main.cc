// The `strata` binary: registers the runtime and bench commands with the command framework
// (runtime/commands/command.h), which owns parsing, output, exit codes and Ctrl-C.
#include <malloc.h>

#include <cstdlib>
#include <string>

#include "bench/commands.h"
#include "runtime/commands/command.h"
#include "runtime/commands/commands.h"
#include "strata/config.h"

int main(int argc, char** argv) {
  using namespace strata;
  // Host memory must not grow with the model (ARCHITECTURE.md §1). glibc raises its mmap threshold
  // each time a large block is freed, after which blocks of up to 32 MB come from the heap, and a
  // heap that held one unit's tensors at a time, interleaved with longer-lived small blocks,
  // keeps every unit's worth of pages: loading a 32-layer checkpoint then peaked at 1.9x a 4-layer
  // one. A fixed threshold (glibc's initial 128 KiB) maps large blocks and returns them on free.
  // MALLOC_MMAP_THRESHOLD_ in the environment still decides when set.
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 128 * 1024);
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
  cli.Add(runtime::NewEstimateCommand());
  cli.Add(runtime::NewReportCommand());
  cli.Add(runtime::NewTokenizeCommand());
#if STRATA_HAVE_TORCH
  cli.Add(runtime::NewTrainCommand());
  cli.Add(runtime::NewEvalCommand());
#endif
  return cli.Run(argc, argv);
}
