// Orphaned swap directories through the binary: a `strata train` killed with SIGKILL leaves its run
// directory under the config's nvme_path; the next `strata train` on that path removes it and says
// so, while the directory of a run alive beside it (stopped with SIGSTOP for the whole check, so it
// cannot finish early) is untouched and that run then finishes normally. `strata clean --path`
// does the same on demand (--dry-run lists and removes nothing; --json for machines); bad paths
// are clear errors with exit code 2.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "tests/testing/cli_run.h"

namespace {

namespace fs = std::filesystem;
using strata::testing::CliRun;
using strata::testing::ReadFileOrEmpty;
using strata::testing::Strata;

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// `strata <args>` in the background, its output in `out`; exec keeps the pid the binary's.
pid_t Spawn(const std::string& args, const std::string& out) {
  const std::string line =
      "exec " + std::string(STRATA_BINARY) + " " + args + " > " + out + " 2>&1";
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Waits until `file` is non-empty (a run's first step is logged: its swap files exist) or the
// process ends; returns whether it got there.
bool WaitForStep(pid_t pid, const std::string& file) {
  for (int i = 0; i < 1200; ++i) {
    struct stat st {};
    if (stat(file.c_str(), &st) == 0 && st.st_size > 0) return true;
    if (waitpid(pid, nullptr, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// The run directory of process `pid` under `nvme` (strata-swap-PID-...), or "".
std::string RunDirOf(const std::string& nvme, pid_t pid) {
  const std::string prefix = "strata-swap-" + std::to_string(pid) + "-";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(nvme, ec)) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) return e.path().string();
  }
  return "";
}

class ReclaimCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata-reclaim-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    nvme_ = dir_ + "/nvme";
    std::ofstream data(dir_ + "/data.txt");
    for (int i = 0; i < 400; ++i)
      data << "The quick brown fox " << i << " jumps over the lazy dog.\n";
    std::ofstream cfg(dir_ + "/ds.json");
    cfg << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100,
        "offload_param": {"device": "nvme", "nvme_path": ")"
        << nvme_ << R"("},
        "offload_optimizer": {"device": "nvme", "nvme_path": ")"
        << nvme_ << R"("}}})";
  }
  void TearDown() override {
    for (pid_t pid : children_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }

  std::string Train(int steps, const std::string& log) const {
    return "train --model tiny --config " + dir_ + "/ds.json --data " + dir_ +
           "/data.txt --threads 1 --quiet --steps " + std::to_string(steps) + " --log-json " + log;
  }
  // Starts a long run, waits for its first step, kills it with SIGKILL; returns its directory.
  std::string KilledRun(const std::string& name) {
    const pid_t pid =
        Spawn(Train(1000000, dir_ + "/" + name + ".jsonl"), dir_ + "/" + name + ".out");
    children_.push_back(pid);
    EXPECT_TRUE(WaitForStep(pid, dir_ + "/" + name + ".jsonl"))
        << ReadFileOrEmpty(dir_ + "/" + name + ".out");
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    children_.pop_back();
    const std::string run = RunDirOf(nvme_, pid);
    EXPECT_FALSE(run.empty()) << "kill -9 left no directory behind: nothing to test";
    EXPECT_TRUE(fs::exists(run + "/strata.lock"));
    killed_pid_ = pid;
    return run;
  }

  std::string dir_, nvme_;
  std::vector<pid_t> children_;
  pid_t killed_pid_ = 0;
};

TEST_F(ReclaimCliTest, NextRunRemovesAKilledRunsDirectoryAndNotALiveOne) {
  // A run that stays alive throughout: stopped after its first step, so it cannot finish early.
  const pid_t live = Spawn(Train(40, dir_ + "/live.jsonl"), dir_ + "/live.out");
  children_.push_back(live);
  ASSERT_TRUE(WaitForStep(live, dir_ + "/live.jsonl")) << ReadFileOrEmpty(dir_ + "/live.out");
  ASSERT_EQ(kill(live, SIGSTOP), 0);
  const std::string live_dir = RunDirOf(nvme_, live);
  ASSERT_FALSE(live_dir.empty());
  std::vector<std::string> live_files;
  for (const auto& e : fs::directory_iterator(live_dir)) live_files.push_back(e.path());
  ASSERT_GE(live_files.size(), 2u);

  // A run killed with SIGKILL beside it.
  const std::string orphan = KilledRun("a");
  ASSERT_FALSE(orphan.empty());
  const pid_t dead = killed_pid_;
  uint64_t orphan_bytes = 0;
  for (const auto& e : fs::directory_iterator(orphan)) orphan_bytes += e.file_size();
  ASSERT_GT(orphan_bytes, 100000u) << "the orphan should hold the tiny model's swap files";

  // strata clean --dry-run lists both and removes nothing.
  CliRun dry = Strata("clean --path " + nvme_ + " --dry-run");
  ASSERT_EQ(dry.rc, 0) << dry.out;
  EXPECT_TRUE(Contains(dry.out, "would remove orphaned swap directory " + orphan)) << dry.out;
  EXPECT_TRUE(Contains(dry.out, "left by pid " + std::to_string(dead) + " (not running)"))
      << dry.out;
  EXPECT_TRUE(Contains(dry.out, "left " + live_dir)) << dry.out;
  EXPECT_TRUE(Contains(dry.out, "in use by pid " + std::to_string(live) + " (running)")) << dry.out;
  EXPECT_TRUE(Contains(dry.out, "dry run: would free")) << dry.out;
  EXPECT_TRUE(fs::exists(orphan + "/strata.lock")) << "--dry-run removed something";
  CliRun dry_json = Strata("clean --path " + nvme_ + " --dry-run --json");
  ASSERT_EQ(dry_json.rc, 0) << dry_json.out;
  nlohmann::json j = nlohmann::json::parse(dry_json.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << dry_json.out;
  EXPECT_EQ(j["dry_run"], true);
  EXPECT_EQ(j["removed"], 1);
  EXPECT_GE(j["bytes_freed"].get<uint64_t>(), orphan_bytes / 2);
  ASSERT_EQ(j["directories"].size(), 2u) << j.dump(1);
  for (const auto& d : j["directories"]) {
    if (d["path"] == orphan) {
      EXPECT_EQ(d["state"], "would_remove");
      EXPECT_EQ(d["owner"]["pid"], dead);
    } else {
      EXPECT_EQ(d["path"], live_dir);
      EXPECT_EQ(d["state"], "live");
      EXPECT_EQ(d["owner"]["pid"], live);
    }
  }
  ASSERT_TRUE(fs::exists(orphan));

  // The next run on the same path reclaims the orphan at start-up, and says so.
  CliRun next = Strata(Train(2, dir_ + "/next.jsonl"));
  ASSERT_EQ(next.rc, 0) << next.out;
  EXPECT_TRUE(Contains(next.out, "strata info: removed orphaned swap directory " + orphan + " ("))
      << next.out;
  EXPECT_TRUE(Contains(next.out, "left by pid " + std::to_string(dead) + " (not running)"))
      << next.out;
  EXPECT_FALSE(fs::exists(orphan)) << next.out;
  EXPECT_FALSE(Contains(next.out, live_dir)) << "live runs are not even mentioned";
  for (const std::string& f : live_files) EXPECT_TRUE(fs::exists(f)) << f << " was removed";
  EXPECT_EQ(waitpid(live, nullptr, WNOHANG), 0) << "the live run died";

  // The live run goes on and finishes normally, removing its own directory.
  ASSERT_EQ(kill(live, SIGCONT), 0);
  int status = 0;
  ASSERT_EQ(waitpid(live, &status, 0), live);
  children_.clear();
  const std::string live_out = ReadFileOrEmpty(dir_ + "/live.out");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << live_out;
  EXPECT_TRUE(Contains(live_out, "done after 40 steps")) << live_out;
  EXPECT_TRUE(fs::is_empty(nvme_)) << "a run directory was left behind";
}

TEST_F(ReclaimCliTest, CleanRemovesOrphansAndReportsThem) {
  const std::string orphan = KilledRun("a");
  ASSERT_FALSE(orphan.empty());
  const pid_t dead = killed_pid_;
  // Something that is not strata's, and an older strata's lockless directory: both untouched.
  fs::create_directories(nvme_ + "/datasets/x");
  fs::create_directories(nvme_ + "/strata-swap-1-2-3");
  CliRun r = Strata("clean --path " + nvme_ + " --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["removed"], 1);
  EXPECT_GT(j["bytes_freed"].get<uint64_t>(), 100000u);
  ASSERT_EQ(j["directories"].size(), 2u) << j.dump(1);
  EXPECT_EQ(j["directories"][0]["name"], "strata-swap-1-2-3");
  EXPECT_EQ(j["directories"][0]["state"], "no_lock");
  EXPECT_EQ(j["directories"][1]["path"], orphan);
  EXPECT_EQ(j["directories"][1]["state"], "removed");
  EXPECT_EQ(j["directories"][1]["owner"]["pid"], dead);
  EXPECT_FALSE(fs::exists(orphan));
  EXPECT_TRUE(fs::exists(nvme_ + "/datasets/x"));
  EXPECT_TRUE(fs::exists(nvme_ + "/strata-swap-1-2-3"));

  CliRun again = Strata("clean --path " + nvme_);
  ASSERT_EQ(again.rc, 0) << again.out;
  EXPECT_TRUE(Contains(again.out, "no orphaned swap directories under " + nvme_)) << again.out;
  EXPECT_TRUE(Contains(again.out, "strata-swap-1-2-3 (")) << again.out;
  EXPECT_TRUE(Contains(again.out, "alone: no lock file")) << again.out;
}

TEST_F(ReclaimCliTest, BadPathsAreClearErrors) {
  CliRun missing = Strata("clean --path " + dir_ + "/nope");
  EXPECT_EQ(missing.rc, 2) << missing.out;
  EXPECT_TRUE(
      Contains(missing.out, "strata clean: not_found: --path: " + dir_ + "/nope does not exist"))
      << missing.out;
  CliRun file = Strata("clean --path " + dir_ + "/ds.json --json");
  EXPECT_EQ(file.rc, 2) << file.out;
  EXPECT_TRUE(Contains(file.out, dir_ + "/ds.json is not a directory")) << file.out;
  EXPECT_FALSE(Contains(file.out, "{")) << "nothing on stdout when it fails";
  CliRun none = Strata("clean");
  EXPECT_EQ(none.rc, 2) << none.out;
  EXPECT_TRUE(Contains(none.out, "--path is required")) << none.out;
  if (geteuid() != 0) {  // root reads any directory
    fs::create_directories(dir_ + "/closed");
    fs::permissions(dir_ + "/closed", fs::perms::none);
    CliRun closed = Strata("clean --path " + dir_ + "/closed");
    EXPECT_EQ(closed.rc, 1) << closed.out;
    EXPECT_TRUE(Contains(closed.out, "Permission denied")) << closed.out;
    fs::permissions(dir_ + "/closed", fs::perms::owner_all);
  }
}

}  // namespace
