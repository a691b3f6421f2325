// The test-hook seam (runtime/engine/test_hooks.h): the two forms parse, malformed values are
// refused naming the variable and the form, and only the environment of the binary sets them.
#include "runtime/engine/test_hooks.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

namespace strata::runtime {
namespace {

TEST(TestHooksTest, NanGradientTakesTheLastAtSoNamesMayHoldOne) {
  Result<NanGradientHook> hook = ParseNanGradientHook("blocks.1@x.fc1@12");
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  EXPECT_EQ(hook->parameter, "blocks.1@x.fc1");
  EXPECT_EQ(hook->step, 12);
}

TEST(TestHooksTest, MalformedValuesNameTheVariableAndTheForm) {
  for (const std::string bad : {"blocks.1", "@3", "blocks.1@0", "blocks.1@3x", "blocks.1@"}) {
    Result<NanGradientHook> hook = ParseNanGradientHook(bad);
    ASSERT_FALSE(hook.ok()) << bad;
    EXPECT_EQ(hook.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(hook.status().ToString().find("STRATA_NAN_GRADIENT=" + bad + ": want PARAMETER@STEP"),
              std::string::npos)
        << hook.status().ToString();
  }
  for (const std::string bad : {"1", "x@2", "-1@2", "1@-2", "1@2@3"}) {
    Result<KillAtSaveHook> hook = ParseKillAtSaveHook(bad);
    ASSERT_FALSE(hook.ok()) << bad;
    EXPECT_NE(hook.status().ToString().find("STRATA_TEST_KILL_AT_SAVE=" + bad + ": want RANK@STEP"),
              std::string::npos)
        << hook.status().ToString();
  }
  Result<KillAtSaveHook> kill = ParseKillAtSaveHook("1@4");
  ASSERT_TRUE(kill.ok());
  EXPECT_EQ(kill->rank, 1);
  EXPECT_EQ(kill->step, 4);
}

TEST(TestHooksTest, TheEnvironmentSetsThemAndEmptyMeansNone) {
  ::unsetenv("STRATA_NAN_GRADIENT");
  ::setenv("STRATA_TEST_KILL_AT_SAVE", "", 1);
  Result<TestHooks> none = ReadTestHooks();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->nan_gradient.has_value());
  EXPECT_FALSE(none->kill_at_save.has_value());

  ::setenv("STRATA_NAN_GRADIENT", "fc@2", 1);
  ::setenv("STRATA_TEST_KILL_AT_SAVE", "0@6", 1);
  Result<TestHooks> both = ReadTestHooks();
  ::unsetenv("STRATA_NAN_GRADIENT");
  ::unsetenv("STRATA_TEST_KILL_AT_SAVE");
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  ASSERT_TRUE(both->nan_gradient.has_value());
  EXPECT_EQ(both->nan_gradient->parameter, "fc");
  ASSERT_TRUE(both->kill_at_save.has_value());
  EXPECT_EQ(both->kill_at_save->step, 6);

  ::setenv("STRATA_TEST_KILL_AT_SAVE", "soon", 1);
  EXPECT_FALSE(ReadTestHooks().ok());
  ::unsetenv("STRATA_TEST_KILL_AT_SAVE");
}

}  // namespace
}  // namespace strata::runtime
