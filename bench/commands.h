// The `strata` subcommands implemented in bench/ (one file each), as Commands
// (runtime/commands/command.h) for tools/strata/main.cc to register.
#pragma once

#include <memory>

#include "runtime/commands/command.h"

namespace strata::bench {

using runtime::Command;

std::unique_ptr<Command> NewBenchIoCommand();     // strata bench io
std::unique_ptr<Command> NewTuneIoCommand();      // strata tune-io
std::unique_ptr<Command> NewBenchAdamCommand();   // strata bench adam
std::unique_ptr<Command> NewBenchTiersCommand();  // strata bench tiers
std::unique_ptr<Command> NewBenchStepCommand();   // strata bench step (libtorch builds only)
std::unique_ptr<Command> NewBenchCommCommand();   // strata bench comm (libtorch builds only)

}  // namespace strata::bench
