// The `strata` subcommands implemented in runtime/: each Add* function attaches one subcommand with
// its flags and its callback to `app`. The callback runs the command and sets `*exit_code`
// (0 success, 1 runtime failure, 2 bad input; a plan that does not fit the machine is a successful
// estimate). Called once, from main, before parsing.
#pragma once

namespace CLI {
class App;
}

namespace strata::runtime {

void AddEstimateCommand(CLI::App& app, int* exit_code);  // strata estimate
void AddReportCommand(CLI::App& app, int* exit_code);    // strata report
void AddTrainCommand(CLI::App& app, int* exit_code);     // strata train (libtorch)

}  // namespace strata::runtime
