// Minimal leveled logging to stderr, and STRATA_CHECK for programmer errors.
//
//   STRATA_LOG(kInfo) << "io backend: " << name;
//
// The threshold comes from STRATA_LOG_LEVEL (debug|info|warning|error; default info) read once, or
// SetLogLevel(). Each message is formatted on the calling thread and written with one write(2), so
// lines from different threads never interleave. Any thread may log.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace strata {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

LogLevel GetLogLevel();
void SetLogLevel(LogLevel level);
// Parses "debug", "info", "warning", "error"; returns false on anything else.
bool ParseLogLevel(std::string_view text, LogLevel* out);
// Text put before every line this process logs (and before a command's error line), e.g.
// "[rank 1] " for a data-parallel rank. Set once at start-up, before other threads log.
void SetLogPrefix(std::string_view prefix);
const std::string& LogPrefix();

namespace internal {

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // writes the line; aborts after a kFatal message
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Turns the stream expression into void so that it fits the ?: in STRATA_LOG.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal
}  // namespace strata

#define STRATA_LOG(level)                               \
  (::strata::LogLevel::level < ::strata::GetLogLevel()) \
      ? (void)0                                         \
      : ::strata::internal::LogVoidify() &              \
            ::strata::internal::LogMessage(::strata::LogLevel::level, __FILE__, __LINE__).stream()

// Aborts with a message when a programmer error is detected (never for I/O or user input).
#define STRATA_CHECK(cond)                                                                    \
  (cond) ? (void)0                                                                            \
         : ::strata::internal::LogVoidify() &                                                 \
               ::strata::internal::LogMessage(::strata::LogLevel::kFatal, __FILE__, __LINE__) \
                       .stream()                                                              \
                   << "check failed: " #cond " "
