// RunRanks: runs a function in N forked processes (the ranks of a test), for the comm tests.
// Each child calls fn(rank) and _exits with its return value, so no gtest state or destructor of
// the parent runs in it. The parent waits at most `timeout` and kills what is left (SIGKILL).
//
// Threads: call from the test's main thread while the test runs no other threads (fork).
//
// Handshakes between ranks (and the test), instead of sleeps: MarkFile/WaitForFile order events
// through files in a directory they share; HoldUntilExit/WaitUntilGone let a rank learn that
// another rank's process has ended. Their deadlines are safety nets only.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"

// In a rank's function (a forked child with `int rank` in scope): print what failed, naming the
// rank, and return 1 from the function, which RunRanks reports as that rank's exit code.
#define RANK_CHECK(cond)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::fprintf(stderr, "rank %d: %s:%d: check failed: %s\n", rank, __FILE__, __LINE__, #cond); \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)
#define RANK_OK(expr)                                                        \
  do {                                                                       \
    const Status s_ = (expr);                                                \
    if (!s_.ok()) {                                                          \
      std::fprintf(stderr, "rank %d: %s:%d: %s\n", rank, __FILE__, __LINE__, \
                   s_.ToString().c_str());                                   \
      return 1;                                                              \
    }                                                                        \
  } while (0)

namespace strata::testing {

// Exit codes of the ranks: the child's return value, 128 + N for a signal, -1 for a timeout.
inline std::vector<int> RunRanks(int n, const std::function<int(int rank)>& fn,
                                 std::chrono::seconds timeout = std::chrono::seconds(30)) {
  std::fflush(nullptr);
  std::vector<pid_t> pids(n, -1);
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 99;
      try {
        code = fn(r);
      } catch (...) {
        std::fprintf(stderr, "rank %d: exception\n", r);
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids[r] = pid;
  }
  std::vector<int> codes(n, -1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (pids[r] < 0) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      pids[r] = -1;
      --left;
    }
    if (left > 0 && std::chrono::steady_clock::now() >= deadline) {
      for (int r = 0; r < n; ++r) {
        if (pids[r] < 0) continue;
        std::fprintf(stderr, "rank %d timed out; killing it\n", r);
        ::kill(pids[r], SIGKILL);
        ::waitpid(pids[r], nullptr, 0);
        pids[r] = -1;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return codes;
}

// Creates the empty file `path` (the other side waits for it with WaitForFile).
inline void MarkFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
}

// Waits until `path` exists; false once `deadline` has passed.
inline bool WaitForFile(const std::string& path,
                        std::chrono::milliseconds deadline = std::chrono::seconds(60)) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (!std::filesystem::exists(path)) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Takes a lock on `path` that this process holds until it ends (the kernel drops a flock when
// the last descriptor of its open file is closed, at exit at the latest).
inline void HoldUntilExit(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0 || ::flock(fd, LOCK_EX) != 0) std::abort();
}

// Waits until the process holding the HoldUntilExit lock on `path` has ended; false once
// `deadline` has passed.
inline bool WaitUntilGone(const std::string& path,
                          std::chrono::milliseconds deadline = std::chrono::seconds(60)) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const auto end = std::chrono::steady_clock::now() + deadline;
  bool gone = false;
  while (!(gone = ::flock(fd, LOCK_EX | LOCK_NB) == 0) && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ::close(fd);
  return gone;
}

}  // namespace strata::testing
