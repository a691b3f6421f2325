// terminal_text.h: progress lines that fit a width, wrapped lines, durations, the ETA.
#include "runtime/commands/terminal_text.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace strata::runtime {
namespace {

std::vector<LineField> Fields() {
  return {{"41/120", 0},        {"loss 2.3456", 0},          {"elapsed 0:12", 0},
          {"ETA 4:05", 0},      {"1234 tok/s", 1},           {"epoch 0.53", 1},
          {"NVMe r 1 GB/s", 2}, {"pinned 1.00 GiB/2 GiB", 2}};
}

TEST(FitProgressLineTest, KeepsTheFieldsThatFitByPriority) {
  const std::string wide = FitProgressLine(Fields(), 0.5, 200);
  EXPECT_EQ(wide,
            "[############............] 41/120  loss 2.3456  elapsed 0:12  ETA 4:05  1234 tok/s  "
            "epoch 0.53  NVMe r 1 GB/s  pinned 1.00 GiB/2 GiB");
  for (int cols : {120, 80, 60, 50, 40, 20, 5, 1}) {
    SCOPED_TRACE(cols);
    const std::string line = FitProgressLine(Fields(), 0.5, cols);
    EXPECT_LE(static_cast<int>(line.size()), std::max(1, cols - 1)) << line;
  }
  const std::string eighty = FitProgressLine(Fields(), 0.5, 80);
  EXPECT_NE(eighty.find("tok/s  epoch 0.53"), std::string::npos) << eighty;
  EXPECT_EQ(eighty.find("NVMe"), std::string::npos) << eighty;
  EXPECT_EQ(eighty.front(), '[');
  // 60 columns: the priority-0 fields and a smaller bar; 50: no room for a bar.
  EXPECT_EQ(FitProgressLine(Fields(), 1.0, 60),
            "[#############] 41/120  loss 2.3456  elapsed 0:12  ETA 4:05");
  EXPECT_EQ(FitProgressLine(Fields(), 1.0, 50), "41/120  loss 2.3456  elapsed 0:12  ETA 4:05");
  // Too narrow for a bar: the fields alone, cut at the width.
  EXPECT_EQ(FitProgressLine(Fields(), 0.5, 20), "41/120  loss 2.3456");
}

TEST(WrapSegmentsTest, BreaksOntoIndentedLines) {
  EXPECT_EQ(WrapSegments({"aaaa", "bbbb", "cccc"}, 12, "  "), "aaaa  bbbb\n  cccc");
  EXPECT_EQ(WrapSegments({"aaaa", "bbbb", "cccc"}, 100, "  "), "aaaa  bbbb  cccc");
  EXPECT_EQ(WrapSegments({"a", "b"}, 100, "  ", " "), "a b");
  // Longer than a line: a line of its own, whole.
  EXPECT_EQ(WrapSegments({"aa", "bbbbbbbbbbbbbbbb", "cc"}, 8, " "), "aa\n bbbbbbbbbbbbbbbb\n cc");
}

TEST(FormatDurationTest, MinutesThenHours) {
  EXPECT_EQ(FormatDuration(0), "0:00");
  EXPECT_EQ(FormatDuration(245), "4:05");
  EXPECT_EQ(FormatDuration(3723), "1:02:03");
  EXPECT_EQ(FormatDuration(-1), "-");
}

TEST(EtaEstimatorTest, StepsLeftTimesTheRecentMeanStepTime) {
  EtaEstimator eta(2);
  EXPECT_LT(eta.SecondsLeft(10), 0);
  eta.Add(1, 5.0);  // slow first step
  EXPECT_DOUBLE_EQ(eta.SecondsLeft(10), 9 * 5.0);
  eta.Add(2, 6.0);
  eta.Add(4, 8.0);  // 1 s per step over the last two intervals
  EXPECT_DOUBLE_EQ(eta.SecondsLeft(10), 6 * 1.0);
  EXPECT_DOUBLE_EQ(eta.SecondsLeft(4), 0);
}

TEST(TerminalColumnsTest, FallsBackToColumnsThenEighty) {
  const int not_a_terminal = 1000;  // no such descriptor: TIOCGWINSZ fails
  ::setenv("COLUMNS", "132", 1);
  EXPECT_EQ(TerminalColumns(not_a_terminal), 132);
  ::setenv("COLUMNS", "wide", 1);
  EXPECT_EQ(TerminalColumns(not_a_terminal), 80);
  ::unsetenv("COLUMNS");
  EXPECT_EQ(TerminalColumns(not_a_terminal), 80);
}

TEST(InterruptNoticeTest, NamesTheStepInProgressAndTheSaveDirectory) {
  std::atomic<bool> stop{false};
  InterruptNotice with_save(&stop, "ck/", false);
  with_save.set_phase(InterruptNotice::Phase::kTraining);
  with_save.set_step(41);
  EXPECT_EQ(with_save.Message(),
            "interrupted: finishing step 41, then saving to ck/ — Ctrl-C again to stop now");
  InterruptNotice without(&stop, "", false);
  without.set_phase(InterruptNotice::Phase::kTraining);
  EXPECT_EQ(without.Message(),
            "interrupted: finishing step 1, then stopping — Ctrl-C again to "
            "stop now");
}

}  // namespace
}  // namespace strata::runtime
