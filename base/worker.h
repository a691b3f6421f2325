// Worker: one thread running submitted jobs in order (a serial job queue), keeping the first
// error.
//
//   Worker writer("write-behind");
//   writer.Submit([&] { return tm.Flush(id); });
//   ...
//   STRATA_RETURN_IF_ERROR(writer.Drain());  // every job so far has run; their first error
//
// Jobs run one at a time, in submission order, on the worker's thread. Every job runs, also after
// an earlier one failed (a job owns resources, e.g. pins or staging slots, that it must release);
// the first failure is kept ("sticky") until Drain returns it. Drain waits for the queue to be
// empty and no job running, then returns that first error and clears it, so the next window of
// work starts clean.
//
// Threads: Submit and Drain may be called from any thread, but not from a job (Drain would wait
// for itself). The destructor runs whatever is still queued, then joins; a job must not outlive
// what it captures, so owners drain (or destroy) the worker before tearing those down.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "base/status.h"

namespace strata {

class Worker {
 public:
  explicit Worker(std::string name);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void Submit(std::function<Status()> job);
  // Waits until every job submitted before the call has run; returns the first error since the
  // last Drain (Ok if none) and forgets it.
  [[nodiscard]] Status Drain();

  const std::string& name() const { return name_; }

 private:
  void Loop();

  const std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<Status()>> jobs_;  // guarded by mu_
  bool running_ = false;                      // guarded by mu_: a job is executing
  bool stopping_ = false;                     // guarded by mu_
  Status error_;                              // guarded by mu_: the first failure since Drain
  std::thread thread_;                        // last: starts after the fields above exist
};

}  // namespace strata
