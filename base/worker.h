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

#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "base/mutex.h"
#include "base/status.h"

namespace strata {

class Worker {
 public:
  explicit Worker(std::string name);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void Submit(std::function<Status()> job) EXCLUDES(mu_);
  // Waits until every job submitted before the call has run; returns the first error since the
  // last Drain (Ok if none) and forgets it.
  [[nodiscard]] Status Drain() EXCLUDES(mu_);

  const std::string& name() const { return name_; }

 private:
  void Loop() EXCLUDES(mu_);

  const std::string name_;
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<Status()>> jobs_ GUARDED_BY(mu_);
  bool running_ GUARDED_BY(mu_) = false;  // a job is executing
  bool stopping_ GUARDED_BY(mu_) = false;
  Status error_ GUARDED_BY(mu_);  // the first failure since Drain
  std::thread thread_;            // last: starts after the fields above exist
};

}  // namespace strata
