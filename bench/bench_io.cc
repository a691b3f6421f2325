// `strata bench io`: sequential NVMe bandwidth and per-block latency through strata's own I/O
// engine (what DeepSpeed's ds_io measures). See bench/io_bench.h for the method.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "base/bytes.h"
#include "base/logging.h"
#include "bench/commands.h"
#include "bench/io_bench.h"
#include "bench/io_cli.h"
#include "runtime/commands/flag_checks.h"

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

std::string Str(const nlohmann::json& j) { return j.get<std::string>(); }

void PrintDirection(const char* name, const nlohmann::json& d, std::FILE* out) {
  const nlohmann::json& l = d["latency_us"];
  std::fprintf(out, "  %-5s %8.3f GB/s  (%.3f GiB/s)   %s in %.3f s\n", name,
               d["gbps"].get<double>(), d["gibps"].get<double>(),
               FormatBytes(d["bytes"].get<uint64_t>()).c_str(), d["seconds"].get<double>());
  std::fprintf(out,
               "        latency per block (us): mean %.0f  p50 %.0f  p90 %.0f  p99 %.0f  "
               "p99.9 %.0f  max %.0f\n",
               l["mean"].get<double>(), l["p50"].get<double>(), l["p90"].get<double>(),
               l["p99"].get<double>(), l["p999"].get<double>(), l["max"].get<double>());
  std::fprintf(out, "        CPU %.3f s (%.0f%% of one core)%s\n", d["cpu_seconds"].get<double>(),
               d["cpu_percent_of_one_core"].get<double>(),
               d["validated"].get<bool>() ? ", every block read back validated" : "");
  if (d["loops_gbps"].size() > 1) {
    std::fprintf(out, "        per loop GB/s:");
    for (const nlohmann::json& g : d["loops_gbps"]) std::fprintf(out, " %.3f", g.get<double>());
    std::fprintf(out, "\n");
  }
}

class BenchIoCommand final : public Command {
 public:
  BenchIoCommand()
      : Command(
            "io",
            "Sequential read/write bandwidth and per-block latency of a directory's disk through "
            "strata's I/O engine (like DeepSpeed's ds_io, or fio)") {}

  void AddFlags(CLI::App& cmd) override {
    cmd.add_option("--size", size_, "Test file size, e.g. 512M, 4G (default 1G)")
        ->check(runtime::flags::ByteSize(1, runtime::flags::kMaxBytes));
    AddIoCliFlags(cmd, &io_, /*sweep=*/false);
    auto* r = cmd.add_flag("--read", read_, "Measure reads only (the file is written first)");
    auto* w = cmd.add_flag("--write", write_, "Measure writes only");
    auto* b = cmd.add_flag("--both", both_, "Measure writes, then reads (default)");
    r->excludes(w)->excludes(b);
    w->excludes(b);
    cmd.add_option("--loops", loops_, "Passes over the file per direction (default 1)")
        ->check(CLI::Range(1, 1000));
    cmd.add_flag("--validate", validate_,
                 "Stamp and checksum every block written and check every block read back");
  }

  Status Run(runtime::CommandContext& /*ctx*/, nlohmann::json& j) override {
    IoBenchConfig config;
    STRATA_RETURN_IF_ERROR(ResolveIoCliFlags(io_, &config));
    Result<uint64_t> size = ParseBytes(size_);
    if (!size.ok()) return size.status().WithContext("--size");
    config.size = *size;
    config.do_write = write_ || both_ || !read_;
    config.do_read = read_ || both_ || !write_;
    config.loops = loops_;
    config.validate = validate_;
    STRATA_ASSIGN_OR_RETURN(const IoBenchResult out, RunIoBench(config));
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
    return Status::Ok();
  }

  void PrintText(const nlohmann::json& j, std::FILE* out) const override {
    std::fprintf(
        out, "strata bench io: backend %s, %s, file %s\n", Str(j["backend"]).c_str(),
        j["direct"].get<bool>() ? "O_DIRECT" : "buffered (page cache dropped before reads)",
        Str(j["file"]).c_str());
    std::fprintf(out,
                 "  size %s, block %s, queue depth %u, threads %u, loops %d, overlap_events %s, "
                 "single_submit %s\n",
                 FormatBytes(j["file_size"].get<uint64_t>()).c_str(),
                 FormatBytes(j["block_size"].get<uint64_t>()).c_str(),
                 j["queue_depth"].get<uint32_t>(), j["threads"].get<uint32_t>(),
                 j["loops"].get<int>(), j["overlap_events"].get<bool>() ? "on" : "off",
                 j["single_submit"].get<bool>() ? "on" : "off");
    if (j.contains("write")) PrintDirection("write", j["write"], out);
    if (j.contains("read")) PrintDirection("read", j["read"], out);
    std::fprintf(out, "  (GB/s = 1e9 bytes/s; GiB/s = 2^30 bytes/s; the test file was removed)\n");
  }

 private:
  IoCliFlags io_;
  std::string size_ = "1G";
  bool read_ = false, write_ = false, both_ = false;
  int loops_ = 1;
  bool validate_ = false;
};

}  // namespace

std::unique_ptr<Command> NewBenchIoCommand() { return std::make_unique<BenchIoCommand>(); }

}  // namespace strata::bench
