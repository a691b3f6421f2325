// The `strata` subcommands implemented in bench/: each Add* function attaches one subcommand with
// its flags and its callback to `parent`. The callback runs the command and sets `*exit_code`
// (0 success, 1 runtime failure, 2 bad input). Called once, from main, before parsing.
#pragma once

namespace CLI {
class App;
}

namespace strata::bench {

void AddBenchIoCommand(CLI::App& bench, int* exit_code);    // strata bench io
void AddTuneIoCommand(CLI::App& app, int* exit_code);       // strata tune-io
void AddBenchAdamCommand(CLI::App& bench, int* exit_code);  // strata bench adam
void AddBenchTiersCommand(CLI::App& bench, int* exit_code); // strata bench tiers
void AddBenchStepCommand(CLI::App& bench, int* exit_code);  // strata bench step (libtorch)

}  // namespace strata::bench
