// Worker states: idle (queue empty, not running) -> running a job -> idle; stopping is set once by
// the destructor, after which the loop empties the queue and exits.
// Lock rule: mu_ guards the queue, running_, stopping_ and error_; jobs run without it held.
#include "base/worker.h"

#include <utility>

namespace strata {

Worker::Worker(std::string name) : name_(std::move(name)), thread_([this] { Loop(); }) {}

Worker::~Worker() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

void Worker::Submit(std::function<Status()> job) {
  {
    MutexLock lock(&mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.SignalAll();
}

Status Worker::Drain() {
  MutexLock lock(&mu_);
  while (!jobs_.empty() || running_) cv_.Wait(&mu_);
  Status s = std::move(error_);
  error_ = Status::Ok();
  return s;
}

void Worker::Loop() {
  MutexLock lock(&mu_);
  for (;;) {
    while (!stopping_ && jobs_.empty()) cv_.Wait(&mu_);
    if (jobs_.empty()) return;  // stopping and nothing left
    std::function<Status()> job = std::move(jobs_.front());
    jobs_.pop_front();
    running_ = true;
    lock.Unlock();
    Status s = job();
    job = nullptr;  // release captures before reporting idle
    lock.Lock();
    running_ = false;
    if (!s.ok() && error_.ok()) error_ = std::move(s);
    cv_.SignalAll();
  }
}

}  // namespace strata
