// Worker states: idle (queue empty, not running) -> running a job -> idle; stopping is set once by
// the destructor, after which the loop empties the queue and exits.
// Lock rule: mu_ guards the queue, running_, stopping_ and error_; jobs run without it held.
#include "base/worker.h"

#include <utility>

namespace strata {

Worker::Worker(std::string name) : name_(std::move(name)), thread_([this] { Loop(); }) {}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Worker::Submit(std::function<Status()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
}

Status Worker::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return jobs_.empty() && !running_; });
  Status s = std::move(error_);
  error_ = Status::Ok();
  return s;
}

void Worker::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping and nothing left
    std::function<Status()> job = std::move(jobs_.front());
    jobs_.pop_front();
    running_ = true;
    lock.unlock();
    Status s = job();
    job = nullptr;  // release captures before reporting idle
    lock.lock();
    running_ = false;
    if (!s.ok() && error_.ok()) error_ = std::move(s);
    cv_.notify_all();
  }
}

}  // namespace strata
