#include "base/trace.h"

#include <cstdio>
#include <filesystem>
#include <map>

#include "base/file_util.h"

namespace strata {
namespace {

void AppendEscaped(std::string& out, std::string_view s) {
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
}

}  // namespace

TraceRecorder& TraceRecorder::Global() {
  static TraceRecorder* recorder = new TraceRecorder();  // never destroyed: usable at exit
  return *recorder;
}

void TraceRecorder::Record(std::string_view lane, std::string_view name, int64_t start_us,
                           int64_t duration_us, std::string_view args) {
  if (!enabled()) return;
  MutexLock lock(&mu_);
  events_.push_back(
      Event{std::string(lane), std::string(name), std::string(args), start_us, duration_us});
}

size_t TraceRecorder::size() const {
  MutexLock lock(&mu_);
  return events_.size();
}

void TraceRecorder::Clear() {
  MutexLock lock(&mu_);
  events_.clear();
}

std::string TraceRecorder::ToJson() const {
  MutexLock lock(&mu_);
  std::map<std::string, int> lanes;  // lane name -> tid, in order of first appearance
  for (const Event& e : events_) lanes.emplace(e.lane, static_cast<int>(lanes.size()) + 1);
  std::string out = "{\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  for (const auto& [lane, tid] : lanes) {
    sep();
    out += "{\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(tid) +
           ",\"name\":\"thread_name\",\"args\":{\"name\":\"";
    AppendEscaped(out, lane);
    out += "\"}}";
  }
  for (const Event& e : events_) {
    sep();
    out += "{\"ph\":\"X\",\"pid\":1,\"tid\":" + std::to_string(lanes[e.lane]) + ",\"name\":\"";
    AppendEscaped(out, e.name);
    out += "\",\"ts\":" + std::to_string(e.start_us) + ",\"dur\":" + std::to_string(e.duration_us);
    if (!e.args.empty()) {
      out += ",\"args\":{\"detail\":\"";
      AppendEscaped(out, e.args);
      out += "\"}";
    }
    out += "}";
  }
  out += "\n]}\n";
  return out;
}

Status TraceRecorder::WriteJson(const std::string& path) const {
  // Atomically, so a viewer polling the file never loads half a trace.
  const std::filesystem::path p(path);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  return WriteFileAtomically(dir, p.filename().string(), ToJson())
      .WithContext("writing trace file " + path);
}

}  // namespace strata
