// Faults a test can ask a run for, behind one seam: the binary reads them from the environment once
// (ReadTestHooks: STRATA_NAN_GRADIENT, STRATA_TEST_KILL_AT_SAVE, listed in base/env.h's table) and
// passes them down by option (TrainerOptions::test_hooks -> EngineOptions::nan_gradient and the
// checkpoint's CheckpointRun::kill_at_save). The engine and the checkpoint code never read the
// environment, so an embedder (the Python package, a test) gets no fault unless it asks for one.
//
//   STRATA_NAN_GRADIENT=PARAM@STEP     every parameter whose name starts with PARAM gets a NaN in
//                                      its gradient at optimizer step STEP (1-based): the overflow
//                                      and non-finite paths, end to end.
//   STRATA_TEST_KILL_AT_SAVE=RANK@STEP that rank kills itself (SIGKILL) after writing its part of
//                                      checkpoint STEP, before the ranks agree to commit it.
//
// Threads: plain values, copied into the options of whatever uses them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"

namespace strata::runtime {

struct NanGradientHook {
  std::string parameter;  // every parameter whose name starts with this
  int64_t step = 0;       // the optimizer step (1-based) whose gradients get a NaN
};

struct KillAtSaveHook {
  int rank = 0;
  int64_t step = 0;  // the checkpoint's step
};

struct TestHooks {
  std::optional<NanGradientHook> nan_gradient;
  std::optional<KillAtSaveHook> kill_at_save;
};

// The hooks the environment asks for (unset or empty variables: none). A malformed value is
// kInvalidArgument naming the variable, its value and the form it wants.
Result<TestHooks> ReadTestHooks();

// Parsers of the two forms, for tests: "PARAM@STEP" and "RANK@STEP".
Result<NanGradientHook> ParseNanGradientHook(const std::string& text);
Result<KillAtSaveHook> ParseKillAtSaveHook(const std::string& text);

}  // namespace strata::runtime
