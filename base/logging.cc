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
std::atomic<int> g_wrap_columns{0};

// Terminal columns of UTF-8 text: its code points (log lines hold no wide characters).
size_t Columns(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// The byte length of the first `columns` code points of `s`.
size_t BytesOfColumns(std::string_view s, size_t columns) {
  size_t i = 0;
  for (size_t seen = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 && seen++ == columns) break;
  }
  return i;
}

// Each line of `text` in lines of at most `columns`, broken at the last space that fits (else at
// the width), continued after four spaces.
std::string Wrap(std::string_view text, size_t columns) {
  constexpr std::string_view kIndent = "    ";
  std::string out;
  for (;;) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    for (bool first = true;; first = false) {
      const std::string_view lead = first ? "" : kIndent;
      const size_t room = columns - lead.size();
      if (Columns(line) <= room) {
        out.append(lead).append(line);
        break;
      }
      const size_t cut = BytesOfColumns(line, room);
      const size_t text_from = line.find_first_not_of(' ');
      size_t end = line.rfind(' ', cut);
      if (end == std::string_view::npos || end <= text_from) end = cut;
      out.append(lead).append(line.substr(0, end)).append("\n");
      line.remove_prefix(end);
      while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      if (line.empty()) break;
    }
    if (nl == std::string_view::npos) break;
    out += '\n';
    text.remove_prefix(nl + 1);
  }
  return out;
}

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
void SetLogWrapColumns(int columns) { g_wrap_columns.store(columns); }

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
  std::string text = stream_.str();
  // A terminal too narrow to be worth wrapping for (or none): the line as it is.
  if (const int columns = g_wrap_columns.load(); columns >= 20) {
    text = Wrap(text, static_cast<size_t>(columns));
  }
  if (g_erase_line.load()) text.insert(0, "\r\x1b[K");
  text += '\n';
  // One write(2) keeps concurrent lines whole; a short write to stderr is not worth retrying.
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
  if (level_ == LogLevel::kFatal) std::abort();
}

}  // namespace internal
}  // namespace strata
