#include "base/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/env.h"
#include "base/log_settings.h"

namespace strata {
namespace {

// Whether STRATA_LOG_LEVEL or SetLogLevel chose the threshold (then the default no longer
// applies).
std::atomic<bool> g_level_chosen{false};
std::atomic<bool> g_erase_line{false};

LogLevel LevelFromEnv() {
  LogLevel level = LogLevel::kInfo;
  if (const char* env = GetEnv("STRATA_LOG_LEVEL"); env != nullptr && ParseLogLevel(env, &level)) {
    g_level_chosen.store(true);
  }
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
void SetLogLevel(LogLevel level) {
  LevelStore().store(static_cast<int>(level));
  g_level_chosen.store(true);
}
void SetDefaultLogLevel(LogLevel level) {
  std::atomic<int>& store = LevelStore();  // reads STRATA_LOG_LEVEL first
  if (!g_level_chosen.load()) store.store(static_cast<int>(level));
}
void SetLogErasesLine(bool on) { g_erase_line.store(on); }

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
  if (g_erase_line.load()) stream_ << "\r\x1b[K";
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
