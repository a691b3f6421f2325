#include "base/worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace strata {
namespace {

TEST(WorkerTest, RunsJobsInSubmissionOrderOnItsThread) {
  Worker w("test");
  std::vector<int> seen;  // written only by the worker thread, read after Drain
  std::thread::id worker_id;
  for (int i = 0; i < 100; ++i) {
    w.Submit([&, i] {
      seen.push_back(i);
      worker_id = std::this_thread::get_id();
      return Status::Ok();
    });
  }
  ASSERT_TRUE(w.Drain().ok());
  ASSERT_EQ(seen.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(seen[i], i);
  EXPECT_NE(worker_id, std::this_thread::get_id());
}

TEST(WorkerTest, DrainWaitsForTheRunningJob) {
  Worker w("test");
  std::atomic<bool> done{false};
  w.Submit([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    done = true;
    return Status::Ok();
  });
  ASSERT_TRUE(w.Drain().ok());
  EXPECT_TRUE(done.load());
}

TEST(WorkerTest, KeepsTheFirstErrorRunsLaterJobsAndClearsOnDrain) {
  Worker w("test");
  int ran = 0;
  w.Submit([&] {
    ++ran;
    return IoErrorFromErrno(5, "first");
  });
  w.Submit([&] {
    ++ran;
    return InternalError("second");
  });
  w.Submit([&] {
    ++ran;
    return Status::Ok();
  });
  Status s = w.Drain();
  EXPECT_EQ(ran, 3);  // jobs own resources: all of them run
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("first"), std::string::npos);
  EXPECT_TRUE(w.Drain().ok());  // forgotten after it was returned
}

TEST(WorkerTest, DestructorRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    Worker w("test");
    for (int i = 0; i < 10; ++i)
      w.Submit([&] {
        ++ran;
        return Status::Ok();
      });
  }
  EXPECT_EQ(ran.load(), 10);
}

TEST(WorkerTest, SubmitFromManyThreads) {
  Worker w("test");
  std::atomic<int> ran{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 250; ++i)
        w.Submit([&] {
          ++ran;
          return Status::Ok();
        });
    });
  }
  for (auto& t : ts) t.join();
  ASSERT_TRUE(w.Drain().ok());
  EXPECT_EQ(ran.load(), 1000);
}

}  // namespace
}  // namespace strata
