// `strata bench comm`: all-gather and reduce-scatter bandwidth between local ranks over the
// Communicator (Gloo on CPU memory), reported as nccl-tests do: per size (the whole gathered
// buffer, in bytes), the time of one operation (the slowest rank's mean over --iters after one
// warm-up), algbw = bytes / time and busbw = algbw * (n-1)/n.
//
// Without RANK in the environment the command launches --nproc ranks of itself
// (runtime/comm/launcher.h) with --json, captures rank 0's JSON and reports it; inside a launched
// group (RANK set, e.g. by torchrun) it is one rank, and only rank 0 prints anything on stdout.
// libtorch builds only.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "bench/commands.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/comm/launcher.h"
#include "runtime/commands/flag_checks.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;
using runtime::Communicator;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The slowest rank's value of `mine` (every rank gets it).
Result<double> MaxOverRanks(Communicator& comm, double mine) {
  std::vector<double> all(comm.world_size());
  STRATA_RETURN_IF_ERROR(comm.AllGather(&mine, all.data(), sizeof(double)));
  return *std::max_element(all.begin(), all.end());
}

nlohmann::json OpJson(double seconds, uint64_t bytes, int n) {
  const double algbw = seconds > 0 ? bytes / seconds / 1e9 : 0.0;
  return {{"seconds", seconds},
          {"algbw_gbps", algbw},
          {"busbw_gbps", algbw * (n - 1) / static_cast<double>(n)}};
}

class BenchCommCommand final : public Command {
 public:
  BenchCommCommand()
      : Command("comm",
                "All-gather and reduce-scatter bandwidth between local ranks (Gloo, CPU memory), "
                "as nccl-tests reports it") {}

  void AddFlags(CLI::App& cmd) override {
    cmd.add_option("--nproc", nproc_,
                   "Ranks to launch on this machine (default 2; ignored inside a launched group)")
        ->check(CLI::Range(1, 256));
    cmd.add_option("--min-bytes", min_bytes_, "Smallest gathered buffer (default 1M)")
        ->check(runtime::flags::ByteSize(1, runtime::flags::kMaxBytes));
    cmd.add_option("--max-bytes", max_bytes_, "Largest gathered buffer (default 64M); sizes double")
        ->check(runtime::flags::ByteSize(1, runtime::flags::kMaxBytes));
    cmd.add_option("--iters", iters_, "Timed operations per size, after one warm-up (default 5)")
        ->check(CLI::Range(1, 100000));
    cmd.add_option("--timeout", timeout_s_, "Seconds a rank waits for the others (default 60)")
        ->check(CLI::Range(1, 3600));
  }

  Status Run(runtime::CommandContext& ctx, nlohmann::json& j) override {
    STRATA_ASSIGN_OR_RETURN(const uint64_t min_bytes, ParseBytes(min_bytes_));
    STRATA_ASSIGN_OR_RETURN(const uint64_t max_bytes, ParseBytes(max_bytes_));
    if (min_bytes > max_bytes) {
      return InvalidArgumentError("--min-bytes " + min_bytes_ + " is above --max-bytes " +
                                  max_bytes_);
    }
    STRATA_ASSIGN_OR_RETURN(const std::optional<runtime::DistEnv> env,
                            runtime::DistEnvFromEnvironment());
    if (!env) return Launch(j);
    Status s = RunRank(*env, min_bytes, max_bytes, j);
    if (s.ok() && env->rank != 0) {
      // Only rank 0 reports: the framework's printing of this rank's result goes nowhere.
      const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
      if (devnull >= 0) {
        std::fflush(stdout);
        ::dup2(devnull, STDOUT_FILENO);
        ::close(devnull);
      }
    }
    return s;
  }

  void PrintText(const nlohmann::json& j, std::FILE* out) const override {
    if (j.empty()) return;
    std::fprintf(out, "strata bench comm: backend %s, %d ranks, %d iterations per size\n",
                 j["backend"].get<std::string>().c_str(), j["world_size"].get<int>(),
                 j["iters"].get<int>());
    std::fprintf(out, "  %10s  %29s  %29s\n", "", "all_gather", "reduce_scatter");
    std::fprintf(out, "  %10s  %9s %9s %9s  %9s %9s %9s\n", "bytes", "time(ms)", "algbw", "busbw",
                 "time(ms)", "algbw", "busbw");
    for (const nlohmann::json& r : j["results"]) {
      const nlohmann::json& g = r["all_gather"];
      const nlohmann::json& s = r["reduce_scatter"];
      std::fprintf(out, "  %10s  %9.3f %9.3f %9.3f  %9.3f %9.3f %9.3f\n",
                   FormatBytes(r["bytes"].get<uint64_t>()).c_str(),
                   g["seconds"].get<double>() * 1e3, g["algbw_gbps"].get<double>(),
                   g["busbw_gbps"].get<double>(), s["seconds"].get<double>() * 1e3,
                   s["algbw_gbps"].get<double>(), s["busbw_gbps"].get<double>());
    }
    std::fprintf(out, "  (algbw = bytes / time, busbw = algbw * (n-1)/n, in GB/s = 1e9 bytes/s)\n");
  }

 private:
  // Starts --nproc ranks of this binary and reports rank 0's result as this command's.
  Status Launch(nlohmann::json& j) {
    const std::vector<std::string> argv = {"strata",
                                           "bench",
                                           "comm",
                                           "--min-bytes",
                                           min_bytes_,
                                           "--max-bytes",
                                           max_bytes_,
                                           "--iters",
                                           std::to_string(iters_),
                                           "--timeout",
                                           std::to_string(timeout_s_),
                                           "--json"};
    std::string rank0_out;
    runtime::LaunchOptions options;
    options.rank0_stdout = &rank0_out;
    STRATA_ASSIGN_OR_RETURN(const int code, runtime::LaunchLocalRanks(nproc_, argv, options));
    if (code == 130 || code == 143) return CancelledError("interrupted");
    if (code != 0) {
      return UnavailableError("the ranks failed (exit code " + std::to_string(code) +
                              "; their stderr is above)");
    }
    j = nlohmann::json::parse(rank0_out, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return InternalError("rank 0 printed no JSON result: '" + rank0_out + "'");
    }
    return Status::Ok();
  }

  Status RunRank(const runtime::DistEnv& env, uint64_t min_bytes, uint64_t max_bytes,
                 nlohmann::json& j) {
    STRATA_ASSIGN_OR_RETURN(auto comms,
                            runtime::ConnectGloo(env, 1, std::chrono::seconds(timeout_s_)));
    Communicator& comm = *comms[0];
    const int n = comm.world_size();
    const uint64_t unit = static_cast<uint64_t>(n) * sizeof(float);
    nlohmann::json results = nlohmann::json::array();
    for (uint64_t size = min_bytes; size <= max_bytes; size *= 2) {
      // Each rank's block is a whole number of floats (reduce-scatter sums floats).
      const uint64_t per_rank = std::max<uint64_t>(size / unit, 1) * sizeof(float);
      const uint64_t bytes = per_rank * n;
      std::vector<float> buffer(bytes / sizeof(float), 1.0f);
      std::vector<float> block(per_rank / sizeof(float), 1.0f);
      double seconds[2] = {0, 0};
      for (int op = 0; op < 2; ++op) {
        for (int i = 0; i < iters_ + 1; ++i) {
          if (i == 1) {
            STRATA_RETURN_IF_ERROR(comm.Barrier());
          }
          const Clock::time_point t0 = Clock::now();
          if (op == 0) {
            STRATA_RETURN_IF_ERROR(comm.AllGather(block.data(), buffer.data(), per_rank));
          } else {
            STRATA_RETURN_IF_ERROR(
                comm.ReduceScatterSum(buffer.data(), block.data(), block.size()));
          }
          if (i > 0) seconds[op] += Seconds(t0, Clock::now());
        }
        STRATA_ASSIGN_OR_RETURN(seconds[op], MaxOverRanks(comm, seconds[op] / iters_));
      }
      results.push_back({{"bytes", bytes},
                         {"all_gather", OpJson(seconds[0], bytes, n)},
                         {"reduce_scatter", OpJson(seconds[1], bytes, n)}});
      if (size > max_bytes / 2) break;  // no overflow past the top
    }
    j["backend"] = comm.backend();
    j["world_size"] = n;
    j["iters"] = iters_;
    j["results"] = std::move(results);
    j["units"] = {{"bytes", "the whole gathered buffer (world x per-rank block)"},
                  {"seconds", "one operation, slowest rank"},
                  {"algbw_gbps", "1e9 bytes/s"},
                  {"busbw_gbps", "1e9 bytes/s"}};
    return Status::Ok();
  }

  int nproc_ = 2;
  std::string min_bytes_ = "1M";
  std::string max_bytes_ = "64M";
  int iters_ = 5;
  int timeout_s_ = 60;
};

}  // namespace

std::unique_ptr<Command> NewBenchCommCommand() { return std::make_unique<BenchCommCommand>(); }

}  // namespace strata::bench
