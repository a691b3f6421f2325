// A generated sweep over the DeepSpeed config space, through the built `strata` binary on
// `--model tiny`: every point is written as a DeepSpeed JSON file and run for one training step
// (`strata train`) and once through `strata estimate` (text on even points, --json on odd ones).
//
// Factors: zero_optimization.stage 0..3 x offload_param.device none/cpu/nvme x
// offload_optimizer.device none/cpu/nvme x precision fp32/bf16/fp16 x
// stage3_param_persistence_threshold 1000/100000 x sub_group_size 10000/1e9 x
// gradient_accumulation_steps 1/2. tiny (runtime/plan/model_presets.h: 2 blocks, d 64) has units of
// 12·64² + 13·64 = 49984 elements whose parameters have 64..16384 elements each: a threshold of
// 1000 keeps only LayerNorms and biases on the device, 100000 (DeepSpeed's default) every
// parameter, so the units' blocks are empty; a sub_group_size of 10000 cuts a unit (and the
// resident group) into several sub-groups, 1e9 never.
//
// Design: the full factorial (864 points, each a process start of ~1 s, mostly loading libtorch)
// is too slow for a 2-core machine, so the sweep is a covering design:
//   * stage x offload_param x offload_optimizer combinations DeepSpeed ignores or reinterprets
//     (offload_param below stage 3 and offload_optimizer at stage 0 are ignored; nvme for the
//     optimizer at stage 1/2 is CPU offload) are read into one of the other combinations with a
//     warning naming the key, before precision or anything else matters: one point each (22),
//     precision and the two-level factors counting through their levels;
//   * every other stage x offload_param x offload_optimizer x precision combination (42) gets two
//     complementary points, (t, s, g) and (1-t, 1-s, 1-g) for threshold, sub_group_size and
//     accumulation, so it sees both levels of each two-level factor; the complementary pair
//     rotates through the four there are, combination by combination, so every pair of
//     two-level factors meets in all four level pairs. ConfigSweepDesignTest checks these
//     properties.
// That is 22 + 84 = 106 points, run by as many processes at a time as there are cores (2 to 8);
// on a 2-core machine each of the two sweeps takes ~1 min idle, ~2 min beside a parallel build.
// The full factorial was run once by hand (all 864 points, train, estimate and estimate --json)
// when this test was written: no failure besides the one fixed with it (see git log).
//
// Per point: the process was not killed by a signal, did not time out (120 s, a hang) and exited
// 0: every point is a config DeepSpeed accepts. Points DeepSpeed reinterprets must also print a
// warning naming the key. estimate must exit 0 on every point too (it plans what training would
// need), and --json must print JSON.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/testing/temp_dir.h"

extern char** environ;

namespace {

using nlohmann::json;

enum class Dev { kNone, kCpu, kNvme };
enum class Precision { kFp32, kBf16, kFp16 };

const char* Name(Dev d) { return d == Dev::kNone ? "none" : d == Dev::kCpu ? "cpu" : "nvme"; }
const char* Name(Precision p) {
  return p == Precision::kFp32 ? "fp32" : p == Precision::kBf16 ? "bf16" : "fp16";
}

constexpr int64_t kSmallThreshold = 1000;     // weights offloaded, LayerNorms and biases resident
constexpr int64_t kLargeThreshold = 100'000;  // DeepSpeed's default: every parameter resident
constexpr int64_t kSmallSubGroup = 10'000;    // below a unit (49984) and the resident group
constexpr int64_t kLargeSubGroup = 1'000'000'000;
constexpr int kTimeoutSeconds = 120;

struct Point {
  int stage = 0;
  Dev param = Dev::kNone;
  Dev optimizer = Dev::kNone;
  Precision precision = Precision::kFp32;
  int64_t threshold = kLargeThreshold;
  int64_t sub_group_size = kLargeSubGroup;
  int gas = 1;
};

// The config keys DeepSpeed ignores or reinterprets at this point (empty: taken as written).
std::vector<std::string> ReinterpretedKeys(const Point& p) {
  std::vector<std::string> keys;
  if (p.param != Dev::kNone && p.stage != 3) {
    keys.push_back("zero_optimization.offload_param.device");
  }
  if ((p.optimizer != Dev::kNone && p.stage == 0) || (p.optimizer == Dev::kNvme && p.stage != 3)) {
    keys.push_back("zero_optimization.offload_optimizer.device");
  }
  return keys;
}

std::vector<Point> SweepPoints() {
  // (threshold, sub_group_size, gas) as bits t, s, g of c = 4t + 2s + g.
  auto with = [](Point p, int c) {
    p.threshold = (c & 4) ? kLargeThreshold : kSmallThreshold;
    p.sub_group_size = (c & 2) ? kLargeSubGroup : kSmallSubGroup;
    p.gas = (c & 1) ? 2 : 1;
    return p;
  };
  constexpr int kComplementary[4][2] = {{0, 7}, {1, 6}, {2, 5}, {4, 3}};
  std::vector<Point> out;
  int rejected = 0, valid = 0;
  for (int stage = 0; stage <= 3; ++stage) {
    for (Dev param : {Dev::kNone, Dev::kCpu, Dev::kNvme}) {
      for (Dev optimizer : {Dev::kNone, Dev::kCpu, Dev::kNvme}) {
        for (Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
          Point p{stage, param, optimizer, precision};
          if (!ReinterpretedKeys(p).empty()) {
            if (precision != Precision::kFp32) continue;  // one point per rejected combination
            p.precision = static_cast<Precision>(rejected % 3);
            out.push_back(with(p, rejected++ % 8));
            continue;
          }
          for (int c : kComplementary[valid % 4]) out.push_back(with(p, c));
          ++valid;
        }
      }
    }
  }
  return out;
}

std::string Describe(const Point& p) {
  std::ostringstream s;
  s << "stage " << p.stage << ", offload_param " << Name(p.param) << ", offload_optimizer "
    << Name(p.optimizer) << ", " << Name(p.precision) << ", persistence_threshold " << p.threshold
    << ", sub_group_size " << p.sub_group_size << ", gas " << p.gas;
  return s.str();
}

json ConfigOf(const Point& p, const std::string& nvme_path) {
  json zero = {{"stage", p.stage},
               {"stage3_param_persistence_threshold", p.threshold},
               {"sub_group_size", p.sub_group_size}};
  auto offload = [&](Dev d) {
    json o = {{"device", Name(d)}};
    if (d == Dev::kNvme) o["nvme_path"] = nvme_path;
    return o;
  };
  if (p.param != Dev::kNone) zero["offload_param"] = offload(p.param);
  if (p.optimizer != Dev::kNone) zero["offload_optimizer"] = offload(p.optimizer);
  json c = {{"train_micro_batch_size_per_gpu", 2},
            {"gradient_accumulation_steps", p.gas},
            {"zero_optimization", zero}};
  if (p.precision == Precision::kBf16) c["bf16"] = {{"enabled", true}};
  if (p.precision == Precision::kFp16) c["fp16"] = {{"enabled", true}};
  return c;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Outcome {
  bool spawned = false;
  bool signaled = false;  // strata (or timeout itself) killed by a signal
  bool timed_out = false;
  int signal = 0;
  int exit_code = -1;
  std::string out, err;
};

// Runs `timeout -k 10 120 strata ARGS...`, stdout and stderr to files of `prefix`.
Outcome RunStrata(const std::vector<std::string>& args, const std::string& prefix) {
  std::vector<std::string> argv = {"timeout", "-k", "10", std::to_string(kTimeoutSeconds),
                                   STRATA_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const std::string out_path = prefix + ".out", err_path = prefix + ".err";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  Outcome o;
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, "timeout", &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return o;
  o.spawned = true;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) {
    o.signaled = true;
    o.signal = WTERMSIG(status);
  } else if (WIFEXITED(status)) {
    o.exit_code = WEXITSTATUS(status);
    // timeout: 124 when the limit passed, 137 when it had to SIGKILL, 128+N when the command died
    // of signal N (older coreutils; newer ones re-raise the signal, seen above).
    if (o.exit_code == 124 || o.exit_code == 137) {
      o.timed_out = true;
    } else if (o.exit_code > 128) {
      o.signaled = true;
      o.signal = o.exit_code - 128;
    }
  }
  o.out = ReadAll(out_path);
  o.err = ReadAll(err_path);
  return o;
}

struct Verdict {
  bool ok = true;
  std::string why;
};

// The rules above for one run of `point`.
Verdict Judge(const Point& point, const Outcome& o) {
  if (!o.spawned) return {false, "could not start timeout/strata"};
  if (o.timed_out) return {false, "timed out after " + std::to_string(kTimeoutSeconds) + " s"};
  if (o.signaled) return {false, "killed by signal " + std::to_string(o.signal)};
  if (o.exit_code != 0)
    return {false, "exit " + std::to_string(o.exit_code) + " on a valid config"};
  for (const std::string& k : ReinterpretedKeys(point)) {
    if ((o.out + o.err).find(k) == std::string::npos) return {false, "no warning naming " + k};
  }
  return {};
}

class ConfigSweepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    std::ofstream data(dir_.File("data.txt"));
    for (int i = 0; i < 200; ++i)
      data << "The quick brown fox " << i << " jumps over the lazy dog.\n";
  }

  struct Failure {
    size_t index;
    std::string why, config, output;
  };

  // Runs `per_point(i, point, point_dir)` for every point, one per core at a time (2 to 8), and
  // returns the failures in point order. The point's directory is removed afterwards.
  template <typename Fn>
  std::vector<Failure> ForEachPoint(const std::vector<Point>& points, Fn per_point) {
    std::vector<Failure> failures;
    std::mutex mu;
    std::atomic<size_t> next{0};
    auto worker = [&] {
      for (size_t i = next++; i < points.size(); i = next++) {
        std::string pdir = dir_.path();
        pdir.append("/p").append(std::to_string(i));
        std::filesystem::create_directories(pdir);
        std::optional<Failure> f = per_point(i, points[i], pdir);
        std::error_code ec;
        std::filesystem::remove_all(pdir, ec);
        if (f) {
          std::lock_guard<std::mutex> lock(mu);
          failures.push_back(std::move(*f));
        }
      }
    };
    std::vector<std::thread> threads;
    const unsigned workers = std::clamp(std::thread::hardware_concurrency(), 2u, 8u);
    for (unsigned t = 0; t < workers; ++t) threads.emplace_back(worker);
    for (std::thread& t : threads) t.join();
    std::sort(failures.begin(), failures.end(),
              [](const Failure& a, const Failure& b) { return a.index < b.index; });
    return failures;
  }

  static std::string Report(const std::vector<Point>& points, const std::vector<Failure>& failed) {
    std::ostringstream s;
    s << failed.size() << " of " << points.size() << " points failed:\n";
    for (const Failure& f : failed) {
      s << "\n#" << f.index << " (" << Describe(points[f.index]) << "): " << f.why
        << "\n  config: " << f.config << "\n  output:\n"
        << f.output << "\n";
    }
    return s.str();
  }

  strata::testing::TempDir dir_{"strata-config-sweep"};
};

TEST(ConfigSweepDesignTest, CoversEveryCombinationAndPairOfLevels) {
  const std::vector<Point> points = SweepPoints();
  EXPECT_EQ(points.size(), 106u);
  // Every rejected stage x offload combination once; every valid one with every precision, each
  // with both levels of each two-level factor.
  for (int stage = 0; stage <= 3; ++stage) {
    for (Dev param : {Dev::kNone, Dev::kCpu, Dev::kNvme}) {
      for (Dev optimizer : {Dev::kNone, Dev::kCpu, Dev::kNvme}) {
        for (Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
          const Point probe{stage, param, optimizer, precision};
          const bool rejected = !ReinterpretedKeys(probe).empty();
          std::vector<Point> mine;
          for (const Point& p : points) {
            if (p.stage == stage && p.param == param && p.optimizer == optimizer &&
                (rejected || p.precision == precision)) {
              mine.push_back(p);
            }
          }
          SCOPED_TRACE(Describe(probe));
          if (rejected) {
            EXPECT_EQ(mine.size(), 1u);
            continue;
          }
          ASSERT_EQ(mine.size(), 2u);
          EXPECT_NE(mine[0].threshold, mine[1].threshold);
          EXPECT_NE(mine[0].sub_group_size, mine[1].sub_group_size);
          EXPECT_NE(mine[0].gas, mine[1].gas);
        }
      }
    }
  }
  std::set<Precision> rejected_precisions;
  for (const Point& p : points) {
    if (!ReinterpretedKeys(p).empty()) rejected_precisions.insert(p.precision);
  }
  EXPECT_EQ(rejected_precisions.size(), 3u);
  // Every pair of levels of two two-level factors, among the points that must train today.
  auto levels = [](const Point& p) {
    return std::vector<int>{p.threshold == kLargeThreshold, p.sub_group_size == kLargeSubGroup,
                            p.gas == 2};
  };
  for (int a = 0; a < 3; ++a) {
    for (int b = a + 1; b < 3; ++b) {
      std::set<std::pair<int, int>> seen;
      for (const Point& p : points) {
        if (!ReinterpretedKeys(p).empty()) continue;
        seen.insert({levels(p)[a], levels(p)[b]});
      }
      EXPECT_EQ(seen.size(), 4u) << "factors " << a << " and " << b;
    }
  }
}

TEST_F(ConfigSweepTest, TrainOneStepAtEveryPoint) {
  const std::vector<Point> points = SweepPoints();
  const std::string data = dir_.File("data.txt");
  auto failed = ForEachPoint(
      points, [&](size_t i, const Point& p, const std::string& pdir) -> std::optional<Failure> {
        const std::string nvme = pdir + "/nvme";
        const std::string config = ConfigOf(p, nvme).dump();
        const std::string config_path = pdir + "/ds.json";
        std::ofstream(config_path) << config;
        const Outcome o = RunStrata({"train", "--config", config_path, "--model", "tiny", "--steps",
                                     "1", "--data", data, "--threads", "1", "--quiet"},
                                    pdir + "/train");
        Verdict v = Judge(p, o);
        // A finished run leaves no swap files behind.
        std::error_code ec;
        if (v.ok && o.exit_code == 0 && std::filesystem::exists(nvme, ec) &&
            !std::filesystem::is_empty(nvme, ec)) {
          v = {false, "swap files left in " + nvme};
        }
        if (v.ok) return std::nullopt;
        return Failure{i, v.why, config, o.out + o.err};
      });
  EXPECT_TRUE(failed.empty()) << Report(points, failed);
}

TEST_F(ConfigSweepTest, EstimateAtEveryPoint) {
  const std::vector<Point> points = SweepPoints();
  auto failed = ForEachPoint(
      points, [&](size_t i, const Point& p, const std::string& pdir) -> std::optional<Failure> {
        const std::string config = ConfigOf(p, pdir + "/nvme").dump();
        const std::string config_path = pdir + "/ds.json";
        std::ofstream(config_path) << config;
        const bool as_json = i % 2 == 1;
        std::vector<std::string> args = {"estimate", "--config", config_path, "--model", "tiny"};
        if (as_json) args.push_back("--json");
        const Outcome o = RunStrata(args, pdir + "/estimate");
        Verdict v = Judge(p, o);
        if (v.ok && as_json && o.exit_code == 0 && !json::accept(o.out)) {
          v = {false, "--json printed no JSON object"};
        }
        if (v.ok) return std::nullopt;
        return Failure{i, v.why + (as_json ? " (--json)" : ""), config, o.out + o.err};
      });
  EXPECT_TRUE(failed.empty()) << Report(points, failed);
}

}  // namespace
