// Monotonic time helpers for benchmarks and telemetry.
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>

namespace strata {

using Clock = std::chrono::steady_clock;

// Measures elapsed wall time since construction or the last Reset(). Not thread-safe.
class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  void Reset() { start_ = Clock::now(); }
  double Seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  Clock::time_point start_;
};

// CPU time (user + system) used by the whole process so far, in seconds.
inline double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

inline int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace strata
