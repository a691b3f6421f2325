// Every environment variable strata reads, in one table: its name, its default (what an unset
// variable means), what it does and who reads it. `strata report` prints the table with the values
// this process sees; tests/scripts/check_env_reads.sh fails on a getenv call anywhere but here, so
// a new variable cannot be read without being listed.
//
//   if (const char* spec = GetEnv("STRATA_IO_FAULTS")) ...   // nullptr: unset
//
// Variables are read where their effect starts (the I/O backend at its creation, the CPU ISA at
// the first dispatch, the log level at the first log line), not cached here: a test may set one
// before the reader's first use.
//
// Threads: EnvVars() is immutable. GetEnv is getenv: safe against other readers, not against a
// concurrent setenv (strata calls setenv only before it starts threads: trainer.cc's OpenMP
// restart).
#pragma once

#include <span>
#include <string_view>

namespace strata {

struct EnvVar {
  std::string_view name;
  std::string_view default_value;  // what an unset (or empty) variable means
  std::string_view meaning;
  std::string_view reader;  // the file that reads it
  bool test_only = false;   // a hook for tests and fault drills, not for users
};

// Every variable strata reads: STRATA_* first, then the variables of other programs it honours
// (torchrun's, OpenMP's, Gloo's).
std::span<const EnvVar> EnvVars();

// getenv(name). REQUIRES: `name` is in EnvVars() (a CHECK: an unlisted read is a bug).
const char* GetEnv(std::string_view name);

}  // namespace strata
