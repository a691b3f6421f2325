// TraceRecorder: Chrome trace events (the JSON that Perfetto and chrome://tracing open).
//
// Each event is a complete span ("ph":"X") on a named lane (a "thread" in the viewer: "nvme read",
// "h2d", "compute", "optimizer"...), so overlap between stages is visible at a glance. Recording
// is off until Enable(); while off, Record costs one relaxed atomic load.
//
// Thread-safety: Record and Span may be used from any thread; WriteJson may run concurrently with
// Record (it sees a consistent prefix).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/mutex.h"
#include "base/status.h"

namespace strata {

class TraceRecorder {
 public:
  void Enable(bool on = true) { enabled_.store(on, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // Records a span [start_us, start_us + duration_us) on `lane`. `args` is an optional short
  // detail string shown in the viewer ("bytes": ...).
  void Record(std::string_view lane, std::string_view name, int64_t start_us, int64_t duration_us,
              std::string_view args = {});

  size_t size() const;
  void Clear();
  // Writes {"traceEvents":[...]} to `path` (atomically: a temporary file renamed into place).
  Status WriteJson(const std::string& path) const;
  std::string ToJson() const;

  // The process-wide recorder used by strata's stages.
  static TraceRecorder& Global();

 private:
  struct Event {
    std::string lane, name, args;
    int64_t start_us, duration_us;
  };
  std::atomic<bool> enabled_{false};
  mutable Mutex mu_;
  std::vector<Event> events_ GUARDED_BY(mu_);
};

// Records the lifetime of a scope as a span on `lane` of the global recorder.
class TraceSpan {
 public:
  // Copies `lane` and `name` (only while recording is enabled), so temporaries are fine.
  TraceSpan(std::string_view lane, std::string_view name)
      : start_(TraceRecorder::Global().enabled() ? NowMicros() : -1) {
    if (start_ >= 0) {
      lane_ = lane;
      name_ = name;
    }
  }
  ~TraceSpan() {
    if (start_ >= 0) TraceRecorder::Global().Record(lane_, name_, start_, NowMicros() - start_);
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  std::string lane_, name_;
  int64_t start_;
};

}  // namespace strata
