// `strata bench io`: sequential NVMe bandwidth and per-block latency through strata's own I/O
// engine (what DeepSpeed's ds_io measures). See bench/io_bench.h for the method.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "base/bytes.h"
#include "base/logging.h"
#include "bench/commands.h"
#include "bench/io_bench.h"
#include "bench/io_cli.h"

namespace strata::bench {
namespace {

nlohmann::json DirectionJson(const IoDirectionResult& d) {
  nlohmann::json j;
  j["gbps"] = d.gbps();
  j["gibps"] = d.gibps();
  j["bytes"] = d.bytes;
  j["seconds"] = d.seconds;
  j["cpu_seconds"] = d.cpu_seconds;
  j["cpu_percent_of_one_core"] = d.seconds > 0 ? 100.0 * d.cpu_seconds / d.seconds : 0.0;
  j["loops_gbps"] = d.loop_gbps;
  j["latency_us"] = {{"mean", d.latency.mean_us}, {"p50", d.latency.p50_us},
                     {"p90", d.latency.p90_us},   {"p99", d.latency.p99_us},
                     {"p999", d.latency.p999_us}, {"max", d.latency.max_us}};
  j["validated"] = d.validated;
  return j;
}

void PrintDirection(const char* name, const IoDirectionResult& d) {
  std::printf("  %-5s %8.3f GB/s  (%.3f GiB/s)   %s in %.3f s\n", name, d.gbps(), d.gibps(),
              FormatBytes(d.bytes).c_str(), d.seconds);
  std::printf(
      "        latency per block (us): mean %.0f  p50 %.0f  p90 %.0f  p99 %.0f  "
      "p99.9 %.0f  max %.0f\n",
      d.latency.mean_us, d.latency.p50_us, d.latency.p90_us, d.latency.p99_us, d.latency.p999_us,
      d.latency.max_us);
  std::printf("        CPU %.3f s (%.0f%% of one core)%s\n", d.cpu_seconds,
              d.seconds > 0 ? 100.0 * d.cpu_seconds / d.seconds : 0.0,
              d.validated ? ", every block read back validated" : "");
  if (d.loop_gbps.size() > 1) {
    std::printf("        per loop GB/s:");
    for (double g : d.loop_gbps) std::printf(" %.3f", g);
    std::printf("\n");
  }
}

}  // namespace

void AddBenchIoCommand(CLI::App& bench, int* exit_code) {
  struct Flags {
    IoCliFlags io;
    std::string size = "1G";
    bool read = false, write = false, both = false;
    int loops = 1;
    bool validate = false;
    bool json = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = bench.add_subcommand(
      "io",
      "Sequential read/write bandwidth and per-block latency of a directory's disk "
      "through strata's I/O engine (like DeepSpeed's ds_io, or fio)");
  cmd->add_option("--size", flags->size, "Test file size, e.g. 512M, 4G (default 1G)");
  AddIoCliFlags(*cmd, &flags->io, /*sweep=*/false);
  auto* r = cmd->add_flag("--read", flags->read, "Measure reads only (the file is written first)");
  auto* w = cmd->add_flag("--write", flags->write, "Measure writes only");
  auto* b = cmd->add_flag("--both", flags->both, "Measure writes, then reads (default)");
  r->excludes(w)->excludes(b);
  w->excludes(b);
  cmd->add_option("--loops", flags->loops, "Passes over the file per direction (default 1)")
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("--validate", flags->validate,
                "Stamp and checksum every block written and check every block read back");
  cmd->add_flag("--json", flags->json, "Print one JSON object instead of text");

  cmd->callback([flags, exit_code] {
    IoBenchConfig config;
    Status st = ResolveIoCliFlags(flags->io, &config);
    Result<uint64_t> size = ParseBytes(flags->size);
    if (st.ok() && !size.ok()) st = size.status().WithContext("--size");
    if (!st.ok()) {
      std::fprintf(stderr, "strata bench io: %s\n", st.ToString().c_str());
      *exit_code = 2;
      return;
    }
    config.size = *size;
    config.do_write = flags->write || flags->both || !flags->read;
    config.do_read = flags->read || flags->both || !flags->write;
    config.loops = flags->loops;
    config.validate = flags->validate;

    Result<IoBenchResult> res = RunIoBench(config);
    if (!res.ok()) {
      std::fprintf(stderr, "strata bench io: %s\n", res.status().ToString().c_str());
      *exit_code = res.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
      return;
    }
    const IoBenchResult& out = *res;
    if (flags->json) {
      nlohmann::json j;
      j["backend"] = out.backend;
      j["direct"] = out.direct;
      j["file"] = out.file;
      j["file_size"] = out.file_size;
      j["block_size"] = config.io.block_size;
      j["queue_depth"] = config.io.queue_depth;
      j["threads"] = config.io.intra_op_parallelism;
      j["single_submit"] = config.io.single_submit;
      j["overlap_events"] = config.io.overlap_events;
      j["loops"] = config.loops;
      j["units"] = {{"gbps", "1e9 bytes/s"}, {"gibps", "2^30 bytes/s"}, {"latency_us", "µs"}};
      if (out.write) j["write"] = DirectionJson(*out.write);
      if (out.read) j["read"] = DirectionJson(*out.read);
      std::cout << j.dump(2) << std::endl;
    } else {
      std::printf("strata bench io: backend %s, %s, file %s\n", out.backend.c_str(),
                  out.direct ? "O_DIRECT" : "buffered (page cache dropped before reads)",
                  out.file.c_str());
      std::printf(
          "  size %s, block %s, queue depth %u, threads %u, loops %d, overlap_events %s, "
          "single_submit %s\n",
          FormatBytes(out.file_size).c_str(), FormatBytes(config.io.block_size).c_str(),
          config.io.queue_depth, config.io.intra_op_parallelism, config.loops,
          config.io.overlap_events ? "on" : "off", config.io.single_submit ? "on" : "off");
      if (out.write) PrintDirection("write", *out.write);
      if (out.read) PrintDirection("read", *out.read);
      std::printf("  (GB/s = 1e9 bytes/s; GiB/s = 2^30 bytes/s; the test file was removed)\n");
    }
    *exit_code = 0;
  });
}

}  // namespace strata::bench
