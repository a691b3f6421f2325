// The I/O benchmark core behind `strata bench io` and `strata tune-io`.
//
// RunIoBench creates its own test file of `size` bytes in `dir` (preallocated with fallocate),
// then, per loop, writes it and/or reads it sequentially through one IoBackend as requests of one
// block each, keeping queue_depth x threads requests in flight (each worker: queue_depth). Per
// direction it measures wall time (first submit to last completion; for buffered writes including
// a final fdatasync, since without it only the page cache is measured), the process CPU time spent
// meanwhile, and the latency of every block (submit to completion). With `validate`, every 4 KiB
// page written carries its file offset and loop number, each block's checksum is kept, and every
// block read back is checked against both. A read-only run first writes the file (not measured).
// The file is removed at the end, also on failure.
//
// Units: bytes_per_second / 1e9 = GB/s; / 2^30 = GiB/s.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "swap/io_backend.h"

namespace strata::bench {

struct IoBenchConfig {
  std::string dir = ".";
  uint64_t size = 1ull << 30;
  std::string backend = "auto";
  IoOptions io;           // block_size, queue_depth, intra_op_parallelism, single_submit...
  bool buffered = false;  // no O_DIRECT; page cache dropped before reads
  bool do_write = true;
  bool do_read = true;
  int loops = 1;
  bool validate = false;
};

struct LatencySummary {
  double mean_us = 0, p50_us = 0, p90_us = 0, p99_us = 0, p999_us = 0, max_us = 0;
};

struct IoDirectionResult {
  uint64_t bytes = 0;      // over all loops
  double seconds = 0;      // over all loops
  double cpu_seconds = 0;  // process CPU (user + system), all threads
  std::vector<double> loop_gbps;
  LatencySummary latency;  // per block, all loops
  bool validated = false;  // every block read back was checked
  double gbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
  double gibps() const {
    return seconds > 0 ? static_cast<double>(bytes) / seconds / (1024.0 * 1024 * 1024) : 0;
  }
};

struct IoBenchResult {
  std::string backend;  // the backend actually used
  bool direct = false;  // O_DIRECT was used
  std::string file;
  uint64_t file_size = 0;
  std::optional<IoDirectionResult> write;
  std::optional<IoDirectionResult> read;
};

// Runs the benchmark. Fails on any I/O error (with the backend's message) or a validation
// mismatch (DataLoss naming the block).
Result<IoBenchResult> RunIoBench(const IoBenchConfig& config);

// Opens the backend as RunIoBench does (for callers that want to check it first).
Result<std::unique_ptr<IoBackend>> OpenBenchBackend(const IoBenchConfig& config);

}  // namespace strata::bench
