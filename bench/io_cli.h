// Command-line flags shared by `strata bench io` and `strata tune-io`.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "bench/io_bench.h"

namespace CLI {
class App;
}

namespace strata::bench {

struct IoCliFlags {
  std::string path = ".";
  std::string block_size = "1M";
  uint32_t queue_depth = 32;
  uint32_t threads = 1;
  std::string backend = "auto";
  bool buffered = false;
  bool single_submit = false;
  bool sequential = false;  // overlap_events off
};

// Adds --path, --buffered, --single-submit, --sequential-requests and, unless `sweep`,
// --block-size, --queue-depth, --threads, --backend.
void AddIoCliFlags(CLI::App& cmd, IoCliFlags* flags, bool sweep);

// Fills the directory, backend and IoOptions of `config` from `flags`. InvalidArgument on a bad
// value (the caller exits with 2).
Status ResolveIoCliFlags(const IoCliFlags& flags, IoBenchConfig* config);

}  // namespace strata::bench
