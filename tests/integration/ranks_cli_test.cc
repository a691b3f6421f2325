// Data-parallel ranks through the binary (`strata train --nproc N`, Gloo on loopback): the same
// global batch on 1, 2 and 4 ranks gives the same losses in every offload mode, a checkpoint of
// N ranks resumes on M, a rank killed mid-step ends the others with a message naming it and the
// last checkpoint still loads, a rank killed mid-save leaves the previous checkpoint as `latest`,
// and a bad rendezvous (wrong WORLD_SIZE, nobody at MASTER_ADDR:MASTER_PORT) fails clearly.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/cli_run.h"

extern char** environ;

namespace {

using strata::testing::CliRun;
using strata::testing::JsonLines;
using strata::testing::ReadFileOrEmpty;
using strata::testing::Shell;
using strata::testing::Strata;

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return -1;
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::vector<double> Losses(const std::string& log) {
  std::vector<double> out;
  for (const auto& j : JsonLines(log)) out.push_back(j.at("loss").get<double>());
  return out;
}

// Relative differences within `bound`, step by step, and as many steps as expected.
void ExpectSameLosses(const std::vector<double>& want, const std::vector<double>& got, double bound,
                      const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(std::fabs(want[i] - got[i]), bound * std::fabs(want[i]))
        << what << ": step " << i + 1 << " " << want[i] << " vs " << got[i];
  }
}

class RanksCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-ranks-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ + "/nvme");
    std::ofstream data(dir_ + "/data.txt");
    for (int i = 0; i < 400; ++i) data << "The quick brown fox " << i << " jumps over the dog.\n";
    const std::string head =
        R"({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": 1.0, "strata": {"comms_timeout_seconds": 60},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4}},
        "zero_optimization": )";
    const std::string nvme = dir_ + "/nvme";
    Write("none.json", head + R"({"stage": 0}})");
    Write("opt.json", head + R"({"stage": 3, "sub_group_size": 5000, "offload_optimizer":
        {"device": "nvme", "nvme_path": ")" +
                          nvme + R"("}}})");
    // Parameters and optimizer on NVMe with tight pinned buffers and small sub-groups.
    Write("full.json", head + R"({"stage": 3, "sub_group_size": 3000,
        "stage3_param_persistence_threshold": 100,
        "offload_param": {"device": "nvme", "nvme_path": ")" +
                           nvme + R"(", "buffer_count": 2},
        "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                           nvme + R"(", "buffer_count": 4}}})");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
  }

  // `strata train` of the tiny GPT on `nproc` ranks with a global batch of 8 rows (micro-batch
  // 4 / nproc, 2 accumulation steps); its --log-json file is returned in `log`.
  CliRun Train(int nproc, const std::string& config, int steps, const std::string& log,
               const std::string& extra = "") {
    const std::string args = "train --model tiny --quiet --config " + dir_ + "/" + config +
                             " --data " + dir_ + "/data.txt --steps " + std::to_string(steps) +
                             " --micro-batch " + std::to_string(4 / nproc) +
                             " --grad-accum 2 --log-json " + dir_ + "/" + log + " " + extra;
    return Strata(args + (nproc > 1 ? " --nproc " + std::to_string(nproc) : std::string()));
  }

  std::string dir_;
};

TEST_F(RanksCliTest, WorldSizesGiveTheSameLossesInEveryOffloadMode) {
  for (const std::string mode : {"none", "opt", "full"}) {
    std::vector<double> single;
    for (int n : {1, 2, 4}) {
      const std::string log = mode + "-" + std::to_string(n) + ".jsonl";
      std::string args = "train --model tiny --quiet --config " + dir_ + "/" + mode +
                         ".json --data " + dir_ + "/data.txt --steps 10 --micro-batch " +
                         std::to_string(4 / n) + " --grad-accum 2 --log-json " + dir_ + "/" + log;
      if (n > 1) args += " --nproc " + std::to_string(n);
      const CliRun r = Strata(args);
      ASSERT_EQ(r.rc, 0) << mode << " on " << n << " ranks: " << r.out;
      const std::vector<double> losses = Losses(dir_ + "/" + log);
      if (n == 1) {
        single = losses;
        ASSERT_EQ(single.size(), 10u);
        EXPECT_NE(single.front(), single.back());  // it trains
        continue;
      }
      // Only the order of the sums over ranks differs (fp32): relative 1e-6.
      ExpectSameLosses(single, losses, 1e-6, mode + " on " + std::to_string(n) + " ranks");
      // Only rank 0 reports.
      EXPECT_EQ(r.out.find("[rank 1] step"), std::string::npos) << r.out;
    }
  }
}

TEST_F(RanksCliTest, ATightDeviceBudgetHoldsTheGatheredUnits) {
  // 148 KiB resident + 100 KiB slice + 2 x 196 KiB gathered units = 640 KiB at least: 700K leaves
  // room for one slice more; the gathers must not be starved by cached slices.
  ASSERT_EQ(Train(1, "full.json", 6, "one.jsonl").rc, 0);
  const CliRun two = Train(2, "full.json", 6, "two.jsonl", "--device-memory 700K");
  ASSERT_EQ(two.rc, 0) << two.out;
  ExpectSameLosses(Losses(dir_ + "/one.jsonl"), Losses(dir_ + "/two.jsonl"), 1e-6,
                   "2 ranks in a tight device budget");
  const CliRun small = Train(2, "full.json", 6, "small.jsonl", "--device-memory 500K");
  EXPECT_NE(small.rc, 0);
  EXPECT_NE(small.out.find("two gathered units"), std::string::npos) << small.out;
}

TEST_F(RanksCliTest, EachRankMovesItsShareOfTheOffloadedState) {
  auto written = [&](const std::string& log) {
    double sum = 0;
    const auto lines = JsonLines(dir_ + "/" + log);
    for (size_t i = 1; i < lines.size(); ++i)
      sum += lines[i].at("nvme_written_bytes").get<double>();
    return sum;
  };
  ASSERT_EQ(Train(1, "full.json", 4, "w1.jsonl").rc, 0);
  const CliRun two = Train(2, "full.json", 4, "w2.jsonl");
  ASSERT_EQ(two.rc, 0) << two.out;
  // Rank 0 writes its slices only: about half (padding aside) of what one rank writes.
  EXPECT_GT(written("w1.jsonl"), 0);
  EXPECT_LT(written("w2.jsonl"), 0.6 * written("w1.jsonl"));
  EXPECT_GT(written("w2.jsonl"), 0.4 * written("w1.jsonl"));
}

TEST_F(RanksCliTest, CheckpointsResumeOnAnyNumberOfRanks) {
  const std::string flags = " --model tiny --quiet --config " + dir_ + "/full.json --data " + dir_ +
                            "/data.txt --grad-accum 2";
  auto run = [&](int n, int steps, const std::string& log, const std::string& extra) {
    std::string args = "train" + flags + " --steps " + std::to_string(steps) + " --micro-batch " +
                       std::to_string(4 / n) + " --log-json " + dir_ + "/" + log + " " + extra;
    if (n > 1) args += " --nproc " + std::to_string(n);
    const CliRun r = Strata(args);
    EXPECT_EQ(r.rc, 0) << n << " ranks " << extra << ": " << r.out;
    return Losses(dir_ + "/" + log);
  };
  const std::vector<double> straight = run(2, 10, "straight.jsonl", "");
  ASSERT_EQ(straight.size(), 10u);
  const std::vector<double> tail(straight.begin() + 5, straight.end());
  run(2, 5, "first.jsonl", "--save " + dir_ + "/ck2");
  EXPECT_EQ(ReadFileOrEmpty(dir_ + "/ck2/latest"), "step-5");
  for (int m : {1, 2, 4}) {
    const std::vector<double> resumed =
        run(m, 10, "from2-on" + std::to_string(m) + ".jsonl", "--resume " + dir_ + "/ck2");
    ExpectSameLosses(tail, resumed, 1e-6, "saved on 2 ranks, resumed on " + std::to_string(m));
  }
  // One rank's checkpoint on two.
  const std::vector<double> single = run(1, 10, "single.jsonl", "");
  run(1, 5, "single-first.jsonl", "--save " + dir_ + "/ck1");
  const std::vector<double> resumed = run(2, 10, "from1-on2.jsonl", "--resume " + dir_ + "/ck1");
  ExpectSameLosses(std::vector<double>(single.begin() + 5, single.end()), resumed, 1e-6,
                   "saved on 1 rank, resumed on 2");
  // The consolidated export has the same tensors whatever the world size.
  const std::string a = ReadFileOrEmpty(dir_ + "/ck1/model.safetensors");
  const std::string b = ReadFileOrEmpty(dir_ + "/ck2/model.safetensors");
  ASSERT_GT(a.size(), 8u);
  EXPECT_EQ(a.size(), b.size());
  EXPECT_EQ(a.substr(0, 8), b.substr(0, 8));  // the header's length: same names, shapes, dtypes
}

TEST_F(RanksCliTest, ARankKilledMidSaveLeavesThePreviousCheckpoint) {
  ASSERT_EQ(Train(2, "full.json", 6, "straight.jsonl").rc, 0);
  const std::vector<double> straight = Losses(dir_ + "/straight.jsonl");
  ASSERT_EQ(straight.size(), 6u);
  // STRATA_TEST_KILL_AT_SAVE=RANK@STEP: that rank dies (SIGKILL) after writing its part of the
  // step-4 checkpoint, before the ranks agree to commit it.
  for (const std::string who : {"1@4", "0@4"}) {
    const std::string ck = dir_ + "/kill-" + who.substr(0, 1);
    const CliRun r = Shell(
        "STRATA_TEST_KILL_AT_SAVE=" + who + " " + std::string(STRATA_BINARY) +
        " train --nproc 2 --model tiny --quiet --config " + dir_ + "/full.json --data " + dir_ +
        "/data.txt --steps 6 --micro-batch 2 --grad-accum 2 --save " + ck + " --save-every 2");
    EXPECT_NE(r.rc, 0) << who << ": " << r.out;
    EXPECT_NE(r.out.find("killed by signal 9"), std::string::npos) << who << ": " << r.out;
    EXPECT_EQ(ReadFileOrEmpty(ck + "/latest"), "step-2") << who;
    EXPECT_FALSE(std::filesystem::exists(ck + "/step-4")) << who;
    // The previous checkpoint loads and goes on as the straight run does.
    const std::string log = "resumed-" + who.substr(0, 1) + ".jsonl";
    const CliRun resumed = Train(2, "full.json", 6, log, "--resume " + ck);
    ASSERT_EQ(resumed.rc, 0) << who << ": " << resumed.out;
    ExpectSameLosses(std::vector<double>(straight.begin() + 2, straight.end()),
                     Losses(dir_ + "/" + log), 1e-6, "resumed after a kill at " + who);
  }
}

// Reads /proc/PID/environ for `name=value`.
bool HasEnv(pid_t pid, const std::string& entry) {
  const std::string env = ReadFileOrEmpty("/proc/" + std::to_string(pid) + "/environ");
  size_t at = 0;
  while (at < env.size()) {
    const size_t end = env.find('\0', at);
    if (env.compare(at, (end == std::string::npos ? env.size() : end) - at, entry) == 0)
      return true;
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return false;
}

TEST_F(RanksCliTest, ARankKilledMidStepEndsTheOthersNamingIt) {
  const std::string ck = dir_ + "/ck";
  const std::string out = dir_ + "/out.txt";
  const std::string log = dir_ + "/steps.jsonl";
  const std::string marker = "STRATA_RANKS_TEST=" + dir_;
  const std::string line = marker + " " + std::string(STRATA_BINARY) +
                           " train --nproc 2 --model tiny --quiet --config " + dir_ +
                           "/full.json --data " + dir_ +
                           "/data.txt --steps 100000 --micro-batch 2 --grad-accum 2 --save " + ck +
                           " --save-every 2 --log-json " + log + " > " + out + " 2>&1";
  const char* argv[] = {"/bin/sh", "-c", line.c_str(), nullptr};
  pid_t shell = 0;
  ASSERT_EQ(posix_spawn(&shell, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  // Wait for a checkpoint, then for the step after it (the ranks are stepping again, past the
  // save), then kill rank 1 with SIGKILL in the middle of its steps. The deadlines are safety nets.
  const auto start = std::chrono::steady_clock::now();
  auto wait_until = [&](const std::function<bool()>& done) {
    while (!done() && std::chrono::steady_clock::now() - start < std::chrono::seconds(120)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return done();
  };
  ASSERT_TRUE(wait_until([&] { return std::filesystem::exists(ck + "/latest"); }))
      << ReadFileOrEmpty(out);
  const std::string first_tag = ReadFileOrEmpty(ck + "/latest");
  ASSERT_EQ(first_tag.rfind("step-", 0), 0u) << first_tag;
  const size_t first_saved = std::stoul(first_tag.substr(5));
  // One --log-json line per step, complete lines only.
  auto steps_logged = [&] {
    const std::string text = ReadFileOrEmpty(log);
    return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
  };
  ASSERT_TRUE(wait_until([&] { return steps_logged() > first_saved; })) << ReadFileOrEmpty(out);
  pid_t victim = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::stoi(name);
    if (HasEnv(pid, marker) && HasEnv(pid, "RANK=1")) victim = pid;
  }
  ASSERT_NE(victim, 0) << "rank 1 not found";
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  int status = 0;
  ASSERT_EQ(waitpid(shell, &status, 0), shell);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  const std::string text = ReadFileOrEmpty(out);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << text;
  EXPECT_LT(seconds, 60) << text;  // the config's comms_timeout_seconds
  EXPECT_NE(text.find("rank 1 was killed by signal 9"), std::string::npos) << text;
  // Rank 0's own error names the rank it lost.
  EXPECT_NE(text.find("[rank 0]"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 is gone"), std::string::npos) << text;
  // The last checkpoint loads.
  const std::string tag = ReadFileOrEmpty(ck + "/latest");
  const int saved = std::stoi(tag.substr(5));
  const CliRun resumed =
      Strata("train --nproc 2 --model tiny --quiet --config " + dir_ + "/full.json --data " + dir_ +
             "/data.txt --steps " + std::to_string(saved + 1) +
             " --micro-batch 2 --grad-accum 2 --resume " + ck);
  EXPECT_EQ(resumed.rc, 0) << resumed.out;
}

TEST_F(RanksCliTest, BadRendezvousFailsClearly) {
  Write("short.json", R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "strata": {"comms_timeout_seconds": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 0}})");
  const std::string train = std::string(STRATA_BINARY) + " train --model tiny --quiet --steps 1 " +
                            "--config " + dir_ + "/short.json --data " + dir_ + "/data.txt";
  // Nobody listens at MASTER_ADDR:MASTER_PORT.
  const int port = FreePort();
  const CliRun alone = Shell("RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                             std::to_string(port) + " " + train);
  EXPECT_NE(alone.rc, 0) << alone.out;
  EXPECT_NE(alone.out.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << alone.out;
  EXPECT_NE(alone.out.find("MASTER_ADDR"), std::string::npos) << alone.out;
  // Outside `--nproc` (torchrun, srun) every line a rank prints says which rank it is.
  EXPECT_NE(alone.out.find("[rank 1] strata train: unavailable"), std::string::npos) << alone.out;
  // Rank 0 waits for a rank that never comes (WORLD_SIZE too large).
  const CliRun waiting =
      Shell("RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
            std::to_string(FreePort()) + " " + train);
  EXPECT_NE(waiting.rc, 0) << waiting.out;
  EXPECT_NE(waiting.out.find("did not join"), std::string::npos) << waiting.out;
  // Two ranks that disagree on WORLD_SIZE.
  const std::string p = std::to_string(FreePort());
  const CliRun mismatch =
      Shell("(RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + p + " " +
            train + " & RANK=1 LOCAL_RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 " +
            "MASTER_PORT=" + p + " " + train + "; wait)");
  EXPECT_NE(mismatch.out.find("WORLD_SIZE=3"), std::string::npos) << mismatch.out;
  // Something on MASTER_PORT accepts connections but never answers: the rank gives up within
  // the timeout (3 s here, plus the 2 s margin), naming what it waited for.
  {
    const int lfd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ASSERT_EQ(listen(lfd, 16), 0);
    socklen_t len = sizeof(a);
    getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
    const int silent_port = ntohs(a.sin_port);
    std::vector<int> accepted;
    std::thread acceptor([&] {
      for (int i = 0; i < 4; ++i) {
        const int c = accept(lfd, nullptr, nullptr);
        if (c < 0) return;
        accepted.push_back(c);  // held open, never answered
      }
    });
    const auto start = std::chrono::steady_clock::now();
    const CliRun silent = Shell(
        "timeout 120 env RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 "
        "MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
        std::to_string(silent_port) + " " + train);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    shutdown(lfd, SHUT_RDWR);
    close(lfd);
    acceptor.join();
    for (int c : accepted) close(c);
    EXPECT_EQ(silent.rc, 1) << silent.out;  // not 124: `timeout` did not have to end it
    EXPECT_LT(seconds, 60) << silent.out;
    EXPECT_NE(silent.out.find("no answer at"), std::string::npos) << silent.out;
    EXPECT_NE(silent.out.find("127.0.0.1:" + std::to_string(silent_port)), std::string::npos)
        << silent.out;
    EXPECT_NE(silent.out.find(" while "), std::string::npos) << silent.out;
  }
  // RANK out of range.
  const CliRun bad =
      Shell("RANK=2 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1234 " + train);
  EXPECT_EQ(bad.rc, 2) << bad.out;
  EXPECT_NE(bad.out.find("RANK"), std::string::npos) << bad.out;
}

// Ranks started by hand (torchrun's variables) for different runs are refused when they meet,
// each naming the first difference, before any collective could disagree (no gloo abort).
TEST_F(RanksCliTest, RanksOfDifferentRunsAreRefusedNamingTheDifference) {
  Write("short.json", R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "strata": {"comms_timeout_seconds": 20}, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
      "zero_optimization": {"stage": 0}})");
  const std::string common =
      std::string(STRATA_BINARY) + " train --quiet --steps 2 --config " + dir_ + "/short.json";
  const std::string data = " --data " + dir_ + "/data.txt";
  struct Case {
    std::string rank0, rank1, key;
  } cases[] = {
      {"--model tiny" + data, "--model small" + data, "model is"},
      {"--model tiny --seed 1" + data, "--model tiny --seed 2" + data,
       "seed is 2 on rank 1 and 1 on rank 0"},
      {"--model tiny --lr 1e-3" + data, "--model tiny --lr 2e-3" + data, "lr is"},
      {"--model tiny --seq-len 32" + data, "--model tiny --seq-len 16" + data, "model is"},
      {"--model tiny" + data, "--model tiny --data " + dir_ + "/other.txt", "data is"},
  };
  {
    std::ofstream other(dir_ + "/other.txt");
    for (int i = 0; i < 400; ++i) other << "Another text " << i << " for another run.\n";
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.rank1);
    const std::string p = std::to_string(FreePort());
    const std::string env =
        " LOCAL_WORLD_SIZE=2 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + p;
    const CliRun r = Shell("(RANK=0 LOCAL_RANK=0" + env + " " + common + " " + c.rank0 +
                           "; echo \"rank0 rc=$?\") & (RANK=1 LOCAL_RANK=1" + env + " " + common +
                           " " + c.rank1 + "; echo \"rank1 rc=$?\"); wait");
    EXPECT_NE(r.out.find("rank0 rc=2"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("rank1 rc=2"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("were started for different runs"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(c.key), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("EnforceNotMet"), std::string::npos) << r.out;
  }
}

// A rank stopped (SIGSTOP) mid-run: the launcher ends the run within its comms timeout-based
// limits (3 s timeout: about 3 + 2.5 + 3 + 3 s), not after its fixed 30 s grace.
TEST_F(RanksCliTest, TheLauncherGivesUpOnAStoppedRankWithinTheTimeout) {
  Write("short.json", R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "strata": {"comms_timeout_seconds": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 0}})");
  const std::string log = dir_ + "/stopped.jsonl";
  const std::string script =
      std::string(STRATA_BINARY) +
      " train --model tiny --quiet --steps 1000000 --nproc 2 --config " + dir_ +
      "/short.json --data " + dir_ + "/data.txt --log-json " + log +
      " & l=$!; for i in $(seq 1 600); do [ -s " + log + " ] && break; sleep 0.1; done; " +
      "for c in $(pgrep -P $l); do if tr '\\0' '\\n' < /proc/$c/environ | grep -qx RANK=1; then "
      "kill -STOP $c; fi; done; s=$(date +%s); wait $l; echo \"rc=$? after $(( $(date +%s) - s "
      "))\"";
  const CliRun r = Shell(script);
  const size_t at = r.out.find("rc=");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rc=0"), std::string::npos) << r.out;
  const int seconds = std::stoi(r.out.substr(r.out.find(" after ", at) + 7));
  EXPECT_LT(seconds, 25) << r.out;
}

}  // namespace
