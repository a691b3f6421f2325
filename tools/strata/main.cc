// The `strata` command: one binary, one subcommand per job. Output is for people by default and
// one JSON object with --json. Exit codes: 0 success, 1 the job failed, 2 bad command line.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "base/logging.h"
#include "bench/commands.h"
#include "runtime/commands/commands.h"
#include "strata/config.h"

int main(int argc, char** argv) {
  CLI::App app{"strata: train models larger than GPU memory by paging state between HBM, pinned "
               "host RAM and NVMe"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("strata ") + STRATA_VERSION);

  std::string log_level;
  app.add_option("--log-level", log_level, "debug|info|warning|error (default: STRATA_LOG_LEVEL or info)")
      ->check(CLI::IsMember({"debug", "info", "warning", "error"}));
  app.parse_complete_callback([&] {
    strata::LogLevel level;
    if (!log_level.empty() && strata::ParseLogLevel(log_level, &level)) strata::SetLogLevel(level);
  });

  int exit_code = 0;
  CLI::App* bench = app.add_subcommand("bench", "Measure one part of the machine or of strata");
  bench->require_subcommand(1);
  strata::bench::AddBenchIoCommand(*bench, &exit_code);
  strata::bench::AddBenchAdamCommand(*bench, &exit_code);
  strata::bench::AddBenchTiersCommand(*bench, &exit_code);
#if STRATA_HAVE_TORCH
  strata::bench::AddBenchStepCommand(*bench, &exit_code);
#endif
  strata::bench::AddTuneIoCommand(app, &exit_code);
  strata::runtime::AddEstimateCommand(app, &exit_code);
  strata::runtime::AddReportCommand(app, &exit_code);
#if STRATA_HAVE_TORCH
  strata::runtime::AddTrainCommand(app, &exit_code);
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  return exit_code;
}
