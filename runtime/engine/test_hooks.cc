#include "runtime/engine/test_hooks.h"

#include <charconv>

#include "base/env.h"

namespace strata::runtime {
namespace {

constexpr const char* kNanGradientEnv = "STRATA_NAN_GRADIENT";
constexpr const char* kKillAtSaveEnv = "STRATA_TEST_KILL_AT_SAVE";

// Splits "HEAD@N" at its last '@' into a non-empty head and an integer N >= min_step.
bool SplitAt(const std::string& text, int64_t min_step, std::string* head, int64_t* step) {
  const size_t at = text.rfind('@');
  if (at == std::string::npos || at == 0) return false;
  const char* first = text.data() + at + 1;
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(first, last, *step);
  if (ec != std::errc() || end != last || *step < min_step) return false;
  *head = text.substr(0, at);
  return true;
}

}  // namespace

Result<NanGradientHook> ParseNanGradientHook(const std::string& text) {
  NanGradientHook hook;
  if (!SplitAt(text, 1, &hook.parameter, &hook.step)) {
    return InvalidArgumentError(std::string(kNanGradientEnv) + "=" + text +
                                ": want PARAMETER@STEP, e.g. blocks.1.fc1.weight@3");
  }
  return hook;
}

Result<KillAtSaveHook> ParseKillAtSaveHook(const std::string& text) {
  KillAtSaveHook hook;
  std::string rank;
  bool parsed = SplitAt(text, 0, &rank, &hook.step);
  if (parsed) {
    const auto [end, ec] = std::from_chars(rank.data(), rank.data() + rank.size(), hook.rank);
    parsed = ec == std::errc() && end == rank.data() + rank.size() && hook.rank >= 0;
  }
  if (!parsed) {
    return InvalidArgumentError(std::string(kKillAtSaveEnv) + "=" + text +
                                ": want RANK@STEP, e.g. 1@4");
  }
  return hook;
}

Result<TestHooks> ReadTestHooks() {
  TestHooks hooks;
  if (const char* text = GetEnv(kNanGradientEnv); text != nullptr && *text != '\0') {
    STRATA_ASSIGN_OR_RETURN(hooks.nan_gradient, ParseNanGradientHook(text));
  }
  if (const char* text = GetEnv(kKillAtSaveEnv); text != nullptr && *text != '\0') {
    STRATA_ASSIGN_OR_RETURN(hooks.kill_at_save, ParseKillAtSaveHook(text));
  }
  return hooks;
}

}  // namespace strata::runtime
