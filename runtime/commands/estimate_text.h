// The text `strata estimate` prints: its --json object (estimate_command.cc builds it) rendered
// for people: the model, the settings, one line per offload mode next to DeepSpeed's estimator,
// with --items each mode's itemized bytes per tier, and with --config the configured mode against
// this machine (what fits, what does not, the suggested keys).
//
// Rendering reads only the JSON, so the text and --json cannot disagree.
// Threads: a pure function of its arguments (writes to `out`).
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>

namespace strata::runtime {

// REQUIRES: `estimate` is an object EstimateCommand::Run produced.
void PrintEstimate(const nlohmann::json& estimate, bool items, std::FILE* out);

}  // namespace strata::runtime
