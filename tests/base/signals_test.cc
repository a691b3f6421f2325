// The signal owner (base/signals.h): what SIGINT/SIGTERM do under each scope, and that a fatal one
// runs the registered cleanups first. Death tests run in a re-executed child ("threadsafe"), so
// each starts with the dispositions the test sets and the owner not yet installed.
#include "base/signals.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace strata {
namespace {

class SignalsTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(SignalsTest, UnderAnInterruptScopeTheFirstSignalOnlySetsTheFlag) {
  InterruptScope scope;
  EXPECT_FALSE(InterruptFlag()->load());
  ASSERT_EQ(raise(SIGTERM), 0);
  EXPECT_TRUE(InterruptFlag()->load());
  EXPECT_EQ(InterruptSignal(), SIGTERM);
  {
    InterruptScope inner;  // nested: the flag is not cleared
    EXPECT_TRUE(InterruptFlag()->load());
  }
}

TEST_F(SignalsTest, AnOuterScopeStartsWithTheFlagCleared) {
  {
    InterruptScope scope;
    raise(SIGINT);
  }
  InterruptScope again;
  EXPECT_FALSE(InterruptFlag()->load());
  EXPECT_EQ(InterruptSignal(), 0);
}

TEST_F(SignalsTest, UnderAForwardScopeSignalsAreRecordedForTheOwner) {
  InterruptScope interrupts;  // the forward scope wins over it
  ForwardScope forward;
  ASSERT_EQ(raise(SIGINT), 0);
  EXPECT_EQ(TakeForwardedSignal(), SIGINT);
  EXPECT_EQ(TakeForwardedSignal(), 0);  // taken
  EXPECT_FALSE(InterruptFlag()->load());
}

// The marker's name is the test's, not the process id: the re-executed child has another pid.
std::string MarkerPath() {
  return ::testing::TempDir() + "/strata_signals_marker_" +
         ::testing::UnitTest::GetInstance()->current_test_info()->name();
}

std::string g_marker;
void WriteMarker() {  // async-signal-safe: open/close only
  const int fd = ::open(g_marker.c_str(), O_CREAT | O_WRONLY, 0644);
  if (fd >= 0) ::close(fd);
}

TEST_F(SignalsTest, AFatalSignalRunsTheCleanupsThenTheDefaultAction) {
  g_marker = MarkerPath();
  std::filesystem::remove(g_marker);
  EXPECT_EXIT(
      {
        RegisterSignalCleanup(&WriteMarker);
        RegisterSignalCleanup(&WriteMarker);  // once only
        raise(SIGTERM);
        std::exit(0);  // not reached
      },
      ::testing::KilledBySignal(SIGTERM), "");
  EXPECT_TRUE(std::filesystem::exists(g_marker));
  std::filesystem::remove(g_marker);
}

TEST_F(SignalsTest, ASecondInterruptEndsTheProcessAfterTheCleanups) {
  g_marker = MarkerPath();
  std::filesystem::remove(g_marker);
  EXPECT_EXIT(
      {
        RegisterSignalCleanup(&WriteMarker);
        InterruptScope scope;
        raise(SIGINT);  // the first: the flag
        if (!InterruptFlag()->load()) std::exit(3);
        raise(SIGINT);  // the second: cleanups, then SIGINT's default action
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGINT), "");
  EXPECT_TRUE(std::filesystem::exists(g_marker));
  std::filesystem::remove(g_marker);
}

TEST_F(SignalsTest, ASignalIgnoredBeforeStaysIgnoredButASecondInterruptExits128PlusN) {
  EXPECT_EXIT(
      {
        ::signal(SIGINT, SIG_IGN);  // a background job of a script
        RegisterSignalCleanup(&WriteMarker);
        raise(SIGINT);  // no scope: ignored, as before strata
        InterruptScope scope;
        raise(SIGINT);
        raise(SIGINT);
        std::exit(0);
      },
      ::testing::ExitedWithCode(128 + SIGINT), "");
}

}  // namespace
}  // namespace strata
