// The `strata` binary: registers the runtime and bench commands with the command framework
// (runtime/commands/command.h), which owns parsing, output, exit codes and Ctrl-C.
#include <malloc.h>

#include <string>

#include "base/signals.h"
#include "bench/commands.h"
#include "runtime/commands/command.h"
#include "runtime/commands/commands.h"
#include "strata/config.h"

int main(int argc, char** argv) {
  using namespace strata;
  // Before anything else: an interrupt from here on is obeyed (base/signals.h), also where the
  // shell started strata with SIGINT ignored (a script's background job).
  TakeSignalsAtStart();
  // Steady-state steps must not fault in fresh pages (issue: page faults per step in --log-json).
  // glibc's defaults make every step do so: its mmap threshold rises with each large free, so
  // activation-sized tensors move into the heap, whose top is trimmed back to the system at 128 KiB
  // of slack and regrown by the next step. A fixed 32 MiB threshold keeps large blocks as their own
  // mappings (returned at once: host memory does not grow with the model), and 64 MiB of trim
  // slack lets one step's heap be reused by the next.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
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
  cli.Add(bench::NewBenchCommCommand(), "bench");
#endif
  cli.Add(bench::NewTuneIoCommand());
  cli.Add(runtime::NewCleanCommand());
  cli.Add(runtime::NewEstimateCommand());
  cli.Add(runtime::NewPlotCommand());
  cli.Add(runtime::NewReportCommand());
  cli.Add(runtime::NewTokenizeCommand());
#if STRATA_HAVE_TORCH
  cli.Add(runtime::NewTrainCommand());
  cli.Add(runtime::NewEvalCommand());
  cli.Add(runtime::NewGenerateCommand());
#endif
  return cli.Run(argc, argv);
}
