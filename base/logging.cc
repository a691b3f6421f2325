#include "base/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/env.h"

namespace strata {
namespace {

LogLevel LevelFromEnv() {
  LogLevel level = LogLevel::kInfo;
  if (const char* env = GetEnv("STRATA_LOG_LEVEL")) ParseLogLevel(env, &level);
  return level;
}

std::atomic<int>& LevelStore() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnv())};
  return level;
}

const char* LevelTag(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
    case LogLevel::kFatal:
      return "fatal";
  }
  return "?";
}

}  // namespace

LogLevel GetLogLevel() {
  return static_cast<LogLevel>(LevelStore().load(std::memory_order_relaxed));
}
void SetLogLevel(LogLevel level) { LevelStore().store(static_cast<int>(level)); }

bool ParseLogLevel(std::string_view text, LogLevel* out) {
  if (text == "debug")
    *out = LogLevel::kDebug;
  else if (text == "info")
    *out = LogLevel::kInfo;
  else if (text == "warning" || text == "warn")
    *out = LogLevel::kWarning;
  else if (text == "error")
    *out = LogLevel::kError;
  else
    return false;
  return true;
}

namespace {
std::string& MutablePrefix() {
  static std::string prefix;
  return prefix;
}
}  // namespace

void SetLogPrefix(std::string_view prefix) { MutablePrefix() = std::string(prefix); }
const std::string& LogPrefix() { return MutablePrefix(); }

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  stream_ << LogPrefix() << "strata " << LevelTag(level) << ": ";
  if (level == LogLevel::kDebug || level == LogLevel::kFatal) {
    const char* base = std::strrchr(file, '/');
    stream_ << "[" << (base ? base + 1 : file) << ":" << line << "] ";
  }
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string text = stream_.str();
  // One write(2) keeps concurrent lines whole; a short write to stderr is not worth retrying.
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
  if (level_ == LogLevel::kFatal) std::abort();
}

}  // namespace internal
}  // namespace strata
