// Monotonic time and process-counter helpers for benchmarks and telemetry.
#pragma once

#include <sys/resource.h>

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

// Page faults taken by the whole process so far (getrusage RUSAGE_SELF, every thread). Minor
// faults map a page already in memory, or a fresh zeroed one (first touch of new anonymous
// memory); major faults wait for a disk read. Take the difference of two readings.
struct PageFaults {
  uint64_t minor = 0;
  uint64_t major = 0;
};
inline PageFaults ProcessPageFaults() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return {};
  return {static_cast<uint64_t>(ru.ru_minflt), static_cast<uint64_t>(ru.ru_majflt)};
}

inline int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace strata
