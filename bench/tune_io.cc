// `strata tune-io`: sweeps block size x queue depth x threads x backend on a directory (what
// DeepSpeed's ds_nvme_tune does), prints the table, the best read and write settings, and the
// `"aio": {...}` section to paste into a config. Each point runs bench/io_bench.h (write, then
// read, of --size bytes). The default sweep (3 x 3 x 2 x the compiled backends, 512 MiB) takes
// about a minute on a 2 GB/s disk.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/clock.h"
#include "bench/commands.h"
#include "bench/io_bench.h"
#include "bench/io_cli.h"

namespace strata::bench {
namespace {

struct Point {
  std::string backend;
  uint64_t block = 0;
  uint32_t queue_depth = 0;
  uint32_t threads = 0;
  double write_gbps = 0;
  double read_gbps = 0;
  std::string error;
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

nlohmann::json AioSection(const Point& p, const IoBenchConfig& base) {
  return {{"block_size", p.block},
          {"queue_depth", p.queue_depth},
          {"intra_op_parallelism", p.threads},
          {"single_submit", base.io.single_submit},
          {"overlap_events", base.io.overlap_events}};
}

}  // namespace

void AddTuneIoCommand(CLI::App& app, int* exit_code) {
  struct Flags {
    IoCliFlags io;
    std::string size = "512M";
    std::string block_sizes = "128K,1M,8M";
    std::string queue_depths = "8,32,128";
    std::string threads = "1,2";
    std::string backends = "all";
    bool no_read = false, no_write = false, validate = false, json = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "tune-io",
      "Find the best aio settings for a directory's disk: sweep block size x queue "
      "depth x threads x backend (like DeepSpeed's ds_nvme_tune)");
  AddIoCliFlags(*cmd, &flags->io, /*sweep=*/true);
  cmd->add_option("--size", flags->size, "Bytes written and read per point (default 512M)");
  cmd->add_option("--block-sizes", flags->block_sizes, "Comma list (default 128K,1M,8M)");
  cmd->add_option("--queue-depths", flags->queue_depths, "Comma list (default 8,32,128)");
  cmd->add_option("--threads", flags->threads, "Comma list of intra-op parallelism (default 1,2)");
  cmd->add_option("--backends", flags->backends,
                  "Comma list of uring,aio,posix, or all (default: all compiled in)");
  cmd->add_flag("--no-read", flags->no_read, "Do not measure reads");
  cmd->add_flag("--no-write", flags->no_write, "Do not measure writes (the file is still written)");
  cmd->add_flag("--validate", flags->validate, "Validate the data read back at every point");
  cmd->add_flag("--json", flags->json, "Print one JSON object instead of text");

  cmd->callback([flags, exit_code] {
    auto bad = [&](const std::string& why) {
      std::fprintf(stderr, "strata tune-io: %s\n", why.c_str());
      *exit_code = 2;
    };
    IoBenchConfig base;
    Status st = ResolveIoCliFlags(flags->io, &base);
    if (!st.ok()) return bad(st.ToString());
    Result<uint64_t> size = ParseBytes(flags->size);
    if (!size.ok()) return bad("--size: " + size.status().ToString());
    base.size = *size;
    base.do_read = !flags->no_read;
    base.do_write = !flags->no_write;
    base.validate = flags->validate;
    if (!base.do_read && !base.do_write) return bad("--no-read and --no-write leave nothing to do");

    std::vector<uint64_t> blocks;
    for (const std::string& s : SplitList(flags->block_sizes)) {
      Result<uint64_t> b = ParseBytes(s);
      if (!b.ok()) return bad("--block-sizes: " + b.status().ToString());
      blocks.push_back(*b);
    }
    std::vector<uint32_t> depths, threads;
    try {
      for (const std::string& s : SplitList(flags->queue_depths)) depths.push_back(std::stoul(s));
      for (const std::string& s : SplitList(flags->threads)) threads.push_back(std::stoul(s));
    } catch (const std::exception&) {
      return bad("--queue-depths and --threads take comma lists of integers");
    }
    std::vector<std::string> backends =
        flags->backends == "all" ? CompiledIoBackends() : SplitList(flags->backends);
    if (blocks.empty() || depths.empty() || threads.empty() || backends.empty()) {
      return bad("empty sweep");
    }
    for (uint64_t b : blocks) {
      for (uint32_t q : depths) {
        for (uint32_t t : threads) {
          IoOptions o = base.io;
          o.block_size = b;
          o.queue_depth = q;
          o.intra_op_parallelism = t;
          if (Status v = ValidateIoOptions(o); !v.ok()) return bad(v.ToString());
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
      std::fprintf(stderr, "strata tune-io: every point failed; first error: %s\n",
                   points.empty() ? "none" : points.front().error.c_str());
      *exit_code = 1;
      return;
    }

    if (flags->json) {
      nlohmann::json j;
      j["path"] = base.dir;
      j["size"] = base.size;
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
      j["aio"] = AioSection(*best_both, base);
      j["backend"] = best_both->backend;
      std::cout << j.dump(2) << std::endl;
      *exit_code = 0;
      return;
    }

    std::printf("strata tune-io: %s, %s per point, %s, %.0f s\n", base.dir.c_str(),
                FormatBytes(base.size).c_str(), base.buffered ? "buffered" : "O_DIRECT",
                watch.Seconds());
    std::printf("%-7s %10s %6s %8s %12s %12s\n", "backend", "block", "qd", "threads", "write GB/s",
                "read GB/s");
    for (const Point& p : points) {
      if (!p.error.empty()) {
        std::printf("%-7s %10s %6u %8u   error: %s\n", p.backend.c_str(),
                    FormatBytes(p.block).c_str(), p.queue_depth, p.threads, p.error.c_str());
        continue;
      }
      std::printf("%-7s %10s %6u %8u %12.3f %12.3f\n", p.backend.c_str(),
                  FormatBytes(p.block).c_str(), p.queue_depth, p.threads, p.write_gbps,
                  p.read_gbps);
    }
    if (base.do_read) {
      std::printf("Best read:  %.3f GB/s with %s\n", best_read->read_gbps,
                  Describe(*best_read).c_str());
    }
    if (base.do_write) {
      std::printf("Best write: %.3f GB/s with %s\n", best_write->write_gbps,
                  Describe(*best_write).c_str());
    }
    std::printf("Recommended (highest read + write): %s\n", Describe(*best_both).c_str());
    std::printf("Paste into the config (GB/s = 1e9 bytes/s):\n\"aio\": %s\n",
                AioSection(*best_both, base).dump().c_str());
    std::printf("and run with STRATA_IO_BACKEND=%s (or leave the default, auto)\n",
                best_both->backend.c_str());
    *exit_code = 0;
  });
}

}  // namespace strata::bench
