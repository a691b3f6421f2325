// Settings of base/logging.h's logger that a command changes while it runs (apart from logging.h,
// which nearly every file includes).
//
//   if (rank != 0) SetDefaultLogLevel(LogLevel::kWarning);  // --log-level still wins
//   SetLogErasesLine(true);   // a progress line is drawn in place on stderr
//   SetLogWrapColumns(80);    // stderr is a terminal 80 columns wide
//
// Threads: any thread.
#pragma once

#include "base/logging.h"

namespace strata {

// The threshold when neither STRATA_LOG_LEVEL nor SetLogLevel (--log-level) chose one: e.g.
// warning for data-parallel ranks other than 0, whose info lines would repeat rank 0's.
void SetDefaultLogLevel(LogLevel level);

// While on, each logged line starts by erasing the terminal row the cursor is on ("\r\x1b[K"), so
// that it replaces a progress line drawn in place on stderr instead of running on from its end.
void SetLogErasesLine(bool on);

// > 0: stderr is a terminal this many columns wide, and each logged line longer than that is
// broken at a space (or at the width) and continued on lines indented by four spaces, so that it
// reads as one message. 0 (the default): lines as they are.
void SetLogWrapColumns(int columns);

}  // namespace strata
