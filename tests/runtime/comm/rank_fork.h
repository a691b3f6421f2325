// RunRanks: runs a function in N forked processes (the ranks of a test), for the comm tests.
// Each child calls fn(rank) and _exits with its return value, so no gtest state or destructor of
// the parent runs in it. The parent waits at most `timeout` and kills what is left (SIGKILL).
//
// Threads: call from the test's main thread while the test runs no other threads (fork).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

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

}  // namespace strata::testing
