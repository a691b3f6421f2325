#include "runtime/commands/flag_checks.h"

#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "base/bytes.h"

namespace strata::runtime::flags {
namespace {

// "a directory", "a FIFO"...: what the path is when it is not what a flag wants.
std::string KindOf(const struct stat& st) {
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISREG(st.st_mode)) return "a regular file";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "not a regular file";
}

// The parent directory of `path` as written ("." for a bare name).
std::string ParentOf(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

CLI::Validator Make(std::string description, std::function<std::string(std::string&)> check) {
  return CLI::Validator(std::move(check), std::move(description));
}

}  // namespace

std::string CheckInputFile(const std::string& path) {
  if (path.empty()) return "an empty path";
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return path + ": no such file";
  if (!S_ISREG(st.st_mode)) return path + " is " + KindOf(st) + ", expected a file";
  return {};
}

std::string CheckInputDirectory(const std::string& path) {
  if (path.empty()) return "an empty path";
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return path + ": no such directory";
  if (!S_ISDIR(st.st_mode)) return path + " is " + KindOf(st) + ", expected a directory";
  return {};
}

std::string CheckOutputFile(const std::string& path) {
  if (path.empty()) return "an empty path";
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return path + " is a directory, expected a file to write";
  }
  const std::string parent = ParentOf(path);
  if (stat(parent.c_str(), &st) != 0) return path + ": its directory " + parent + " does not exist";
  if (!S_ISDIR(st.st_mode)) return path + ": " + parent + " is " + KindOf(st);
  return {};
}

std::string CheckOutputDirectory(const std::string& path) {
  if (path.empty()) return "an empty path";
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return path + " is " + KindOf(st) + ", expected a directory";
    return {};
  }
  // Created with its missing parents: the nearest existing ancestor must be a directory.
  std::string ancestor = path;
  while (true) {
    ancestor = ParentOf(ancestor);
    if (stat(ancestor.c_str(), &st) == 0) break;
    if (ancestor == "." || ancestor == "/") return path + ": no existing parent directory";
  }
  if (!S_ISDIR(st.st_mode)) return path + ": " + ancestor + " is " + KindOf(st);
  return {};
}

Status ParseStepRange(const std::string& text, const std::string& flag, int64_t* from,
                      int64_t* to) {
  auto parse = [](std::string_view s, int64_t* out) {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
    return ec == std::errc() && end == s.data() + s.size() && *out >= 1;
  };
  const size_t dash = text.find('-');
  const std::string_view all(text);
  const bool ok = dash == std::string::npos
                      ? parse(all, from) && parse(all, to)
                      : parse(all.substr(0, dash), from) && parse(all.substr(dash + 1), to);
  if (!ok || *from > *to) {
    return InvalidArgumentError(flag + " " + text + ": want N or A-B with 1 <= A <= B");
  }
  return Status::Ok();
}

CLI::Validator Real(double min, double max, bool min_open) {
  char interval[96];
  std::snprintf(interval, sizeof(interval), "%s%g, %g]", min_open ? "(" : "[", min, max);
  const std::string range = interval;
  return Make("NUMBER in " + range, [=](std::string& text) -> std::string {
    const char* begin = text.c_str();
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(begin, &end);
    if (text.empty() || end == begin || *end != '\0') return "'" + text + "' is not a number";
    if (!std::isfinite(v)) return text + " is not a finite number";
    if (v < min || (min_open && v == min) || v > max) return text + " is outside " + range;
    return {};
  });
}

CLI::Validator Threads(int64_t min_threads) { return CLI::Range(min_threads, kMaxThreads); }

CLI::Validator Count(int64_t min) { return CLI::Range(min, kMaxCount); }

CLI::Validator SeqLen() { return CLI::Range(int64_t{1}, kMaxSeqLen); }

CLI::Validator Seed() {
  return Make("UINT64", [](std::string& text) -> std::string {
    uint64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
      return text + " is not a non-negative 64-bit integer";
    }
    return {};
  });
}

CLI::Validator DeviceSpec() {
  return Make("DEVICE", [](std::string& text) -> std::string {
    if (text == "auto" || text == "host" || text == "cuda") return {};
    for (const char* kind : {"host:", "cuda:"}) {
      const std::string prefix = kind;
      if (text.rfind(prefix, 0) != 0) continue;
      const std::string digits = text.substr(prefix.size());
      int index = 0;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
      if (!digits.empty() && ec == std::errc() && end == digits.data() + digits.size() &&
          index >= 0) {
        return {};
      }
    }
    return text + " is not a device: auto, host, cuda or cuda:N (N: the GPU's index)";
  });
}

Result<uint64_t> ParseByteSizeIn(const std::string& text, uint64_t min, uint64_t max) {
  Result<uint64_t> bytes = ParseBytes(text);
  if (!bytes.ok()) return bytes.status();
  if (*bytes < min || *bytes > max) {
    return InvalidArgumentError(text + " is out of range: want " + FormatBytes(min) + " to " +
                                FormatBytes(max));
  }
  return bytes;
}

CLI::Validator ByteSize(uint64_t min, uint64_t max) {
  return Make("SIZE", [min, max](std::string& text) -> std::string {
    Result<uint64_t> bytes = ParseByteSizeIn(text, min, max);
    return bytes.ok() ? std::string() : std::string(bytes.status().message());
  });
}

CLI::Validator ByteSizeOrAuto(uint64_t min, uint64_t max) {
  return Make("SIZE|auto", [min, max](std::string& text) -> std::string {
    if (text == "auto") return {};
    Result<uint64_t> bytes = ParseBytes(text);
    if (!bytes.ok()) return std::string(bytes.status().message());
    if (*bytes < min || *bytes > max) {
      return text + " is out of range: want " + FormatBytes(min) + " to " + FormatBytes(max);
    }
    return {};
  });
}

CLI::Validator InputFile() {
  return Make("FILE", [](std::string& p) { return CheckInputFile(p); });
}
CLI::Validator InputDirectory() {
  return Make("DIR", [](std::string& p) { return CheckInputDirectory(p); });
}
CLI::Validator OutputFile(bool allow_empty) {
  return Make("FILE", [allow_empty](std::string& p) {
    return allow_empty && p.empty() ? std::string() : CheckOutputFile(p);
  });
}
CLI::Validator OutputDirectory() {
  return Make("DIR", [](std::string& p) { return CheckOutputDirectory(p); });
}

CLI::Validator StepRange() {
  return Make("N|A-B", [](std::string& text) -> std::string {
    int64_t from = 0, to = 0;
    Status s = ParseStepRange(text, "value", &from, &to);
    return s.ok() ? std::string() : std::string(s.message());
  });
}

CLI::Validator CommaList(const CLI::Validator& element) {
  return Make("LIST", [element](std::string& text) -> std::string {
    if (text.empty()) return "an empty list";
    size_t start = 0;
    while (true) {
      const size_t comma = text.find(',', start);
      std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
      if (item.empty()) return "an empty element in the list " + text;
      std::string error = element(item);
      if (!error.empty()) return error;
      if (comma == std::string::npos) return {};
      start = comma + 1;
    }
  });
}

}  // namespace strata::runtime::flags
