// Running a command line the way a user's shell does, for the integration tests that drive the
// `strata` binary: stdout and stderr together, and how the process ended.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace strata::testing {

struct CliRun {
  int rc = -1;      // the exit code; -1 when the process did not exit (a signal)
  int signal = 0;   // the signal that ended it, 0 if it exited
  std::string out;  // stdout and stderr, interleaved
};

// Runs `line` with /bin/sh, its stderr folded into stdout.
inline CliRun Shell(const std::string& line) {
  const std::string cmd = "(" + line + ") 2>&1";
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (fgets(buf, sizeof(buf), p) != nullptr) r.out += buf;
  const int status = pclose(p);
  if (WIFEXITED(status)) {
    r.rc = WEXITSTATUS(status);
    // A shell reports a child killed by signal N as 128 + N.
    if (r.rc > 128 && r.rc < 128 + 65) r.signal = r.rc - 128;
  } else if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
  }
  return r;
}

#ifdef STRATA_BINARY  // the test target defines it as the path of the `strata` binary
// Runs `strata <args>`.
inline CliRun Strata(const std::string& args) {
  return Shell(std::string(STRATA_BINARY) + " " + args);
}
#endif

// The whole contents of `path`; empty if it cannot be read (a test then says what it expected).
inline std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The JSON objects of a JSON-lines file (`--log-json`), one per non-empty line.
inline std::vector<nlohmann::json> JsonLines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::istringstream lines(ReadFileOrEmpty(path));
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

}  // namespace strata::testing
