// `strata tune-io`: sweeps block size x queue depth x threads x backend on a directory (what
// DeepSpeed's ds_nvme_tune does), prints the table, the best read and write settings, and the
// `"aio": {...}` section to paste into a config. Each point runs bench/io_bench.h (write, then
// read, of --size bytes). The default sweep (3 x 3 x 2 x the compiled backends, 512 MiB) takes
// about a minute on a 2 GB/s disk.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/clock.h"
#include "bench/commands.h"
#include "bench/io_bench.h"
#include "bench/io_cli.h"
#include "runtime/commands/flag_checks.h"

namespace strata::bench {
namespace {

struct Point {
  std::string backend;
  uint64_t block = 0;
  uint32_t queue_depth = 0;
  uint32_t threads = 0;
  double write_gbps = 0;
  double read_gbps = 0;
  std::string error;  // empty: the point ran
};

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

void Progress(size_t done, size_t total, const std::string& what, double elapsed) {
  if (!isatty(STDERR_FILENO)) return;
  constexpr int kWidth = 30;
  const int filled = total == 0 ? kWidth : static_cast<int>(kWidth * done / total);
  std::string bar(filled, '#');
  bar.append(kWidth - filled, '.');
  std::fprintf(stderr, "\r[%s] %zu/%zu %5.0fs %-40s", bar.c_str(), done, total, elapsed,
               what.c_str());
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

std::string Describe(const Point& p) {
  return p.backend + " block " + FormatBytes(p.block) + " qd " + std::to_string(p.queue_depth) +
         " threads " + std::to_string(p.threads);
}

nlohmann::json AioSection(const nlohmann::json& p, const nlohmann::json& j) {
  return {{"block_size", p["block_size"]},
          {"queue_depth", p["queue_depth"]},
          {"intra_op_parallelism", p["threads"]},
          {"single_submit", j["single_submit"]},
          {"overlap_events", j["overlap_events"]}};
}

Point PointFromJson(const nlohmann::json& p) {
  return {p["backend"].get<std::string>(), p["block_size"].get<uint64_t>(),
          p["queue_depth"].get<uint32_t>(), p["threads"].get<uint32_t>()};
}

class TuneIoCommand final : public Command {
 public:
  TuneIoCommand()
      : Command(
            "tune-io",
            "Find the best aio settings for a directory's disk: sweep block size x queue depth x "
            "threads x backend (like DeepSpeed's ds_nvme_tune)") {}

  void AddFlags(CLI::App& cmd) override {
    namespace flags = runtime::flags;
    AddIoCliFlags(cmd, &io_, /*sweep=*/true);
    cmd.add_option("--size", size_, "Bytes written and read per point (default 512M)")
        ->check(flags::ByteSize(1, flags::kMaxBytes));
    cmd.add_option("--block-sizes", block_sizes_, "Comma list (default 128K,1M,8M)")
        ->check(flags::CommaList(flags::ByteSize(512, uint64_t{1} << 30)));
    cmd.add_option("--queue-depths", queue_depths_, "Comma list (default 8,32,128)")
        ->check(flags::CommaList(CLI::Range(1, 4096)));
    cmd.add_option("--threads", threads_, "Comma list of intra-op parallelism (default 1,2)")
        ->check(flags::CommaList(CLI::Range(1, 64)));
    cmd.add_option("--backends", backends_,
                   "Comma list of uring,aio,posix, or all (default: all compiled in)")
        ->check(flags::CommaList(CLI::IsMember({"uring", "aio", "posix", "all"})));
    cmd.add_flag("--no-read", no_read_, "Do not measure reads");
    cmd.add_flag("--no-write", no_write_, "Do not measure writes (the file is still written)");
    cmd.add_flag("--validate", validate_, "Validate the data read back at every point");
  }

  Status Run(runtime::CommandContext& ctx, nlohmann::json& j) override;
  void PrintText(const nlohmann::json& j, std::FILE* out) const override;

 private:
  IoCliFlags io_;
  std::string size_ = "512M";
  std::string block_sizes_ = "128K,1M,8M";
  std::string queue_depths_ = "8,32,128";
  std::string threads_ = "1,2";
  std::string backends_ = "all";
  bool no_read_ = false, no_write_ = false, validate_ = false;
};

Status TuneIoCommand::Run(runtime::CommandContext& /*ctx*/, nlohmann::json& j) {
  IoBenchConfig base;
  STRATA_RETURN_IF_ERROR(ResolveIoCliFlags(io_, &base));
  Result<uint64_t> size = ParseBytes(size_);
  if (!size.ok()) return size.status().WithContext("--size");
  base.size = *size;
  base.do_read = !no_read_;
  base.do_write = !no_write_;
  base.validate = validate_;
  if (!base.do_read && !base.do_write) {
    return InvalidArgumentError("--no-read and --no-write leave nothing to do");
  }

  std::vector<uint64_t> blocks;
  for (const std::string& s : SplitList(block_sizes_)) {
    Result<uint64_t> b = ParseBytes(s);
    if (!b.ok()) return b.status().WithContext("--block-sizes");
    blocks.push_back(*b);
  }
  std::vector<uint32_t> depths, threads;
  try {
    for (const std::string& s : SplitList(queue_depths_)) depths.push_back(std::stoul(s));
    for (const std::string& s : SplitList(threads_)) threads.push_back(std::stoul(s));
  } catch (const std::exception&) {
    return InvalidArgumentError("--queue-depths and --threads take comma lists of integers");
  }
  std::vector<std::string> backends =
      backends_ == "all" ? CompiledIoBackends() : SplitList(backends_);
  if (blocks.empty() || depths.empty() || threads.empty() || backends.empty()) {
    return InvalidArgumentError("empty sweep");
  }
  for (uint64_t b : blocks) {
    for (uint32_t q : depths) {
      for (uint32_t t : threads) {
        IoOptions o = base.io;
        o.block_size = b;
        o.queue_depth = q;
        o.intra_op_parallelism = t;
        STRATA_RETURN_IF_ERROR(ValidateIoOptions(o));
      }
    }
  }

  std::vector<Point> points;
  const size_t total = backends.size() * blocks.size() * depths.size() * threads.size();
  Stopwatch watch;
  size_t done = 0;
  for (const std::string& backend : backends) {
    for (uint64_t b : blocks) {
      for (uint32_t q : depths) {
        for (uint32_t t : threads) {
          Point p{backend, b, q, t};
          Progress(done, total, Describe(p), watch.Seconds());
          IoBenchConfig c = base;
          c.backend = backend;
          c.io.block_size = b;
          c.io.queue_depth = q;
          c.io.intra_op_parallelism = t;
          Result<IoBenchResult> r = RunIoBench(c);
          if (r.ok()) {
            if (r->write) p.write_gbps = r->write->gbps();
            if (r->read) p.read_gbps = r->read->gbps();
          } else {
            p.error = r.status().ToString();
          }
          points.push_back(p);
          ++done;
        }
      }
    }
  }
  Progress(done, total, "done", watch.Seconds());

  const Point* best_read = nullptr;
  const Point* best_write = nullptr;
  const Point* best_both = nullptr;
  for (const Point& p : points) {
    if (!p.error.empty()) continue;
    if (!best_read || p.read_gbps > best_read->read_gbps) best_read = &p;
    if (!best_write || p.write_gbps > best_write->write_gbps) best_write = &p;
    if (!best_both || p.read_gbps + p.write_gbps > best_both->read_gbps + best_both->write_gbps) {
      best_both = &p;
    }
  }
  if (best_both == nullptr) {
    return UnavailableError("every point failed; first error: " +
                            (points.empty() ? std::string("none") : points.front().error));
  }

  j["path"] = base.dir;
  j["size"] = base.size;
  j["buffered"] = base.buffered;
  j["single_submit"] = base.io.single_submit;
  j["overlap_events"] = base.io.overlap_events;
  j["seconds"] = watch.Seconds();
  j["units"] = {{"gbps", "1e9 bytes/s"}};
  j["results"] = nlohmann::json::array();
  for (const Point& p : points) {
    nlohmann::json r = {{"backend", p.backend},
                        {"block_size", p.block},
                        {"queue_depth", p.queue_depth},
                        {"threads", p.threads}};
    if (p.error.empty()) {
      if (base.do_write) r["write_gbps"] = p.write_gbps;
      if (base.do_read) r["read_gbps"] = p.read_gbps;
    } else {
      r["error"] = p.error;
    }
    j["results"].push_back(r);
  }
  auto point_json = [&](const Point& p) {
    return nlohmann::json{{"backend", p.backend},         {"block_size", p.block},
                          {"queue_depth", p.queue_depth}, {"threads", p.threads},
                          {"write_gbps", p.write_gbps},   {"read_gbps", p.read_gbps}};
  };
  if (base.do_read) j["best_read"] = point_json(*best_read);
  if (base.do_write) j["best_write"] = point_json(*best_write);
  j["recommended"] = point_json(*best_both);
  j["aio"] = AioSection(j["recommended"], j);
  j["backend"] = best_both->backend;
  return Status::Ok();
}

void TuneIoCommand::PrintText(const nlohmann::json& j, std::FILE* out) const {
  std::fprintf(out, "strata tune-io: %s, %s per point, %s, %.0f s\n",
               j["path"].get<std::string>().c_str(), FormatBytes(j["size"].get<uint64_t>()).c_str(),
               j["buffered"].get<bool>() ? "buffered" : "O_DIRECT", j["seconds"].get<double>());
  std::fprintf(out, "%-7s %10s %6s %8s %12s %12s\n", "backend", "block", "qd", "threads",
               "write GB/s", "read GB/s");
  for (const nlohmann::json& r : j["results"]) {
    const Point p = PointFromJson(r);
    if (r.contains("error")) {
      std::fprintf(out, "%-7s %10s %6u %8u   error: %s\n", p.backend.c_str(),
                   FormatBytes(p.block).c_str(), p.queue_depth, p.threads,
                   r["error"].get<std::string>().c_str());
      continue;
    }
    std::fprintf(out, "%-7s %10s %6u %8u %12.3f %12.3f\n", p.backend.c_str(),
                 FormatBytes(p.block).c_str(), p.queue_depth, p.threads, r.value("write_gbps", 0.0),
                 r.value("read_gbps", 0.0));
  }
  if (j.contains("best_read")) {
    std::fprintf(out, "Best read:  %.3f GB/s with %s\n", j["best_read"]["read_gbps"].get<double>(),
                 Describe(PointFromJson(j["best_read"])).c_str());
  }
  if (j.contains("best_write")) {
    std::fprintf(out, "Best write: %.3f GB/s with %s\n",
                 j["best_write"]["write_gbps"].get<double>(),
                 Describe(PointFromJson(j["best_write"])).c_str());
  }
  std::fprintf(out, "Recommended (highest read + write): %s\n",
               Describe(PointFromJson(j["recommended"])).c_str());
  std::fprintf(out, "Paste into the config (GB/s = 1e9 bytes/s):\n\"aio\": %s\n",
               j["aio"].dump().c_str());
  std::fprintf(out, "and run with STRATA_IO_BACKEND=%s (or leave the default, auto)\n",
               j["backend"].get<std::string>().c_str());
}

}  // namespace

std::unique_ptr<Command> NewTuneIoCommand() { return std::make_unique<TuneIoCommand>(); }

}  // namespace strata::bench
