// The `strata` subcommands implemented in runtime/ (one file each), as Commands (command.h) for
// tools/strata/main.cc to register.
#pragma once

#include <memory>

#include "runtime/commands/command.h"

namespace strata::runtime {

std::unique_ptr<Command> NewCleanCommand();     // strata clean
std::unique_ptr<Command> NewEstimateCommand();  // strata estimate
std::unique_ptr<Command> NewPlotCommand();      // strata plot
std::unique_ptr<Command> NewReportCommand();    // strata report
std::unique_ptr<Command> NewTokenizeCommand();  // strata tokenize
std::unique_ptr<Command> NewTrainCommand();     // strata train (libtorch builds only)
std::unique_ptr<Command> NewEvalCommand();      // strata eval (libtorch builds only)
std::unique_ptr<Command> NewGenerateCommand();  // strata generate (libtorch builds only)

}  // namespace strata::runtime
