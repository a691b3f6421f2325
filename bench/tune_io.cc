// Placeholder until swap/ lands: replaced by the I/O benchmark.
#include <CLI/CLI.hpp>

#include "bench/commands.h"

namespace strata::bench {
void AddTuneIoCommand(CLI::App& app, int* exit_code) {}
}  // namespace strata::bench
