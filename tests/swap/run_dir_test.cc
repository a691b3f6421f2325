// Run directory locks and orphan reclaim (swap/run_dir.h): a SIGKILLed run's directory is removed
// by the next SwapSpace::Create on the same nvme_path; a live run's, a kept one, an older strata's
// (no lock), one holding anything strata did not put there, one locked on another host and
// unrelated directories are not; dry runs remove nothing; creation and reclaim racing in many
// processes never take a live run's directory.
#include "swap/run_dir.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "swap/swap_space.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using State = RunDirVerdict::State;
using testing::TempDir;

bool Exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

// A SwapSpace in a child process, as a training run holds one: files reserved, extents allocated.
// The child reports its run directory, then waits until release() (or a signal) ends it.
class ChildRun {
 public:
  ChildRun(const std::string& nvme_path, bool keep = false, std::string run_name = "") {
    int ready[2], hold[2];
    if (pipe(ready) != 0 || pipe(hold) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(ready[0]);
      close(hold[1]);
      int code = 0;
      {
        auto s = SwapSpace::Create(
            {.nvme_path = nvme_path, .run_name = run_name, .handle_signals = false});
        if (!s.ok()) _exit(3);
        if (!(*s)->Reserve("params", 1 << 20).ok()) _exit(4);
        if (!(*s)->Allocate("blocks.0/exp_avg", "optimizer", 3 << 20).ok()) _exit(5);
        if (keep) {
          (*s)->set_keep_files(true);
          if (!(*s)->SaveManifest().ok()) _exit(6);
        }
        const std::string line = (*s)->dir() + "\n";
        if (write(ready[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
          _exit(7);
        }
        char c;
        while (read(hold[0], &c, 1) > 0) {
        }
        // Still its own: nobody removed it while it lived.
        struct stat st {};
        if (stat(((*s)->dir() + "/params.swp").c_str(), &st) != 0) code = 8;
      }
      _exit(code);
    }
    close(ready[1]);
    close(hold[0]);
    hold_ = hold[1];
    char buf[2048] = {};
    size_t n = 0;
    while (n < sizeof(buf) - 1) {
      const ssize_t r = read(ready[0], buf + n, sizeof(buf) - 1 - n);
      if (r <= 0) break;
      n += static_cast<size_t>(r);
      if (buf[n - 1] == '\n') break;
    }
    close(ready[0]);
    if (n > 0 && buf[n - 1] == '\n') dir_ = std::string(buf, n - 1);
  }
  ~ChildRun() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (hold_ >= 0) close(hold_);
  }
  bool ok() const { return pid_ > 0 && !dir_.empty(); }
  const std::string& dir() const { return dir_; }
  std::string name() const { return fs::path(dir_).filename(); }
  pid_t pid() const { return pid_; }

  // kill -9, and wait until it is gone.
  void Kill() {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
  }
  // Lets it finish normally; returns its exit code (0: its directory was intact to the end).
  int Release() {
    close(hold_);
    hold_ = -1;
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int hold_ = -1;
  bool reaped_ = false;
  std::string dir_;
};

const RunDirVerdict* Find(const ReclaimReport& r, const std::string& name) {
  for (const RunDirVerdict& v : r.dirs) {
    if (v.name == name) return &v;
  }
  return nullptr;
}

std::string Listing(const ReclaimReport& r) {
  std::string s;
  for (const RunDirVerdict& v : r.dirs) s += DescribeVerdict(r.path, v) + "\n";
  return s;
}

TEST(RunDirTest, KilledRunIsReclaimedByTheNextCreateAndALiveOneIsNot) {
  TempDir parent;
  ChildRun dead(parent.path());
  ChildRun live(parent.path());
  ASSERT_TRUE(dead.ok() && live.ok());
  ASSERT_TRUE(Exists(dead.dir() + "/" + kRunLockFile));
  dead.Kill();
  ASSERT_TRUE(Exists(dead.dir() + "/optimizer.swp")) << "kill -9 leaves the directory behind";

  auto next = SwapSpace::Create({.nvme_path = parent.path(), .handle_signals = false});
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_FALSE(Exists(dead.dir())) << "the orphan is still there";
  EXPECT_TRUE(Exists(live.dir() + "/params.swp"));
  EXPECT_TRUE(Exists(live.dir() + "/optimizer.swp"));
  EXPECT_TRUE(Exists((*next)->dir()));
  EXPECT_EQ(live.Release(), 0) << "the live run lost files while it ran";
  EXPECT_FALSE(Exists(live.dir())) << "a normal end removes its own directory";
}

TEST(RunDirTest, ReportNamesTheDeadOwnerAndTheBytesFreed) {
  TempDir parent;
  ChildRun dead(parent.path());
  ChildRun live(parent.path());
  ASSERT_TRUE(dead.ok() && live.ok());
  dead.Kill();
  Result<ReclaimReport> r = ReclaimOrphans(parent.path());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->dirs.size(), 2u) << Listing(*r);
  const RunDirVerdict* d = Find(*r, dead.name());
  ASSERT_NE(d, nullptr) << Listing(*r);
  EXPECT_EQ(d->state, State::kRemoved) << Listing(*r);
  EXPECT_EQ(d->owner.pid, dead.pid());
  EXPECT_GT(d->owner.started, 0);
  EXPECT_GE(d->bytes, 4u << 20) << "1 MiB reserved + 3 MiB allocated";
  EXPECT_EQ(r->bytes_freed, d->bytes);
  EXPECT_EQ(r->removed, 1);
  const std::string line = DescribeVerdict(r->path, *d);
  EXPECT_NE(line.find("removed orphaned swap directory " + dead.dir()), std::string::npos) << line;
  EXPECT_NE(line.find("left by pid " + std::to_string(dead.pid()) + " (not running)"),
            std::string::npos)
      << line;
  const RunDirVerdict* l = Find(*r, live.name());
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->state, State::kLive);
  EXPECT_EQ(l->owner.pid, live.pid());
  EXPECT_NE(DescribeVerdict(r->path, *l).find("in use by pid " + std::to_string(live.pid())),
            std::string::npos);
  EXPECT_EQ(live.Release(), 0);
}

TEST(RunDirTest, DryRunRemovesNothing) {
  TempDir parent;
  ChildRun dead(parent.path());
  ASSERT_TRUE(dead.ok());
  dead.Kill();
  Result<ReclaimReport> r = ReclaimOrphans(parent.path(), {.dry_run = true});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->dirs.size(), 1u);
  EXPECT_EQ(r->dirs[0].state, State::kWouldRemove);
  EXPECT_GE(r->bytes_freed, 4u << 20);
  EXPECT_TRUE(Exists(dead.dir() + "/params.swp"));
  EXPECT_TRUE(Exists(dead.dir() + "/" + kRunLockFile));
  // And the real one then does.
  r = ReclaimOrphans(parent.path());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->dirs[0].state, State::kRemoved);
  EXPECT_FALSE(Exists(dead.dir()));
}

TEST(RunDirTest, KeptDirectoriesAreNeverReclaimed) {
  TempDir parent;
  ChildRun killed(parent.path(), /*keep=*/true);
  ASSERT_TRUE(killed.ok());
  killed.Kill();
  std::string ended;
  {
    auto s = SwapSpace::Create(
        {.nvme_path = parent.path(), .run_name = "ckpt", .handle_signals = false});
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->Reserve("params", 4096).ok());
    ASSERT_TRUE((*s)->SaveManifest().ok());
    (*s)->set_keep_files(true);
    ended = (*s)->dir();
  }
  ASSERT_TRUE(Exists(ended + "/" + kRunKeepFile));
  auto next = SwapSpace::Create({.nvme_path = parent.path(), .handle_signals = false});
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(Exists(killed.dir() + "/params.swp"));
  EXPECT_TRUE(Exists(ended + "/params.swp"));
  Result<ReclaimReport> r = ReclaimOrphans(parent.path());
  ASSERT_TRUE(r.ok());
  ASSERT_NE(Find(*r, killed.name()), nullptr);
  EXPECT_EQ(Find(*r, killed.name())->state, State::kKept);
  EXPECT_EQ(Find(*r, "ckpt")->state, State::kKept);

  // Reopened without keep_files it is an ordinary run directory again: while open it is live,
  // and a second Open is refused naming the holder.
  {
    auto s = SwapSpace::Open(ended, {.handle_signals = false});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_FALSE(Exists(ended + "/" + kRunKeepFile));
    r = ReclaimOrphans(parent.path());
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(Find(*r, "ckpt")->state, State::kLive);
    EXPECT_EQ(Find(*r, "ckpt")->owner.pid, getpid());
    auto again = SwapSpace::Open(ended, {.handle_signals = false});
    EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(again.status().message().find("in use by pid " + std::to_string(getpid())),
              std::string::npos)
        << again.status().ToString();
    EXPECT_TRUE(Exists(ended + "/params.swp")) << "a refused Open removed files";
  }
  EXPECT_FALSE(Exists(ended));
}

TEST(RunDirTest, FailedOpenRemovesNothing) {
  TempDir parent;
  std::string dir;
  {
    auto s = SwapSpace::Create(
        {.nvme_path = parent.path(), .keep_files = true, .handle_signals = false});
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->Reserve("params", 4096).ok());
    ASSERT_TRUE((*s)->Reserve("optimizer", 4096).ok());
    ASSERT_TRUE((*s)->SaveManifest().ok());
    dir = (*s)->dir();
  }
  // The second file's size no longer matches the manifest: Load fails after opening the first.
  ASSERT_EQ(truncate((dir + "/optimizer.swp").c_str(), 0), 0);
  auto s = SwapSpace::Open(dir, {.handle_signals = false});
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss) << s.status().ToString();
  EXPECT_TRUE(Exists(dir + "/params.swp"));
  EXPECT_TRUE(Exists(dir + "/manifest.json"));
  EXPECT_TRUE(Exists(dir + "/" + kRunKeepFile));
}

TEST(RunDirTest, WhatIsNotProvablyAnOrphanOfOursIsLeftAlone) {
  TempDir parent;
  const std::string p = parent.path();
  // Unrelated: a directory with data, a file, a symlink to a dead run elsewhere.
  fs::create_directories(p + "/data/sub");
  std::ofstream(p + "/data/x.bin") << "keep me";
  std::ofstream(p + "/notes.txt") << "keep me";
  TempDir elsewhere;
  ChildRun target(elsewhere.path());
  ASSERT_TRUE(target.ok());
  target.Kill();
  fs::create_directory_symlink(target.dir(), p + "/strata-swap-link");
  // An older strata's run directory: no lock file.
  fs::create_directories(p + "/strata-swap-1-2-0");
  std::ofstream(p + "/strata-swap-1-2-0/params.swp") << "old";
  // Dead runs holding something strata does not create: a file, a subdirectory, a symlink.
  ChildRun extra_file(p), extra_dir(p), extra_link(p);
  ASSERT_TRUE(extra_file.ok() && extra_dir.ok() && extra_link.ok());
  extra_file.Kill();
  extra_dir.Kill();
  extra_link.Kill();
  std::ofstream(extra_file.dir() + "/results.csv") << "1,2";
  fs::create_directories(extra_dir.dir() + "/logs");
  fs::create_symlink(p + "/notes.txt", extra_link.dir() + "/manifest.json");
  // A dead run on another host (the lock file names it).
  ChildRun remote(p);
  ASSERT_TRUE(remote.ok());
  remote.Kill();
  std::ofstream(remote.dir() + "/" + kRunLockFile, std::ios::trunc)
      << "pid=77\nhost=some-other-host.invalid\nstarted=1\n";

  for (const bool dry_run : {true, false}) {
    Result<ReclaimReport> r = ReclaimOrphans(p, {.dry_run = dry_run});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->removed, 0) << Listing(*r);
    EXPECT_EQ(r->bytes_freed, 0u);
    EXPECT_EQ(Find(*r, "data"), nullptr) << "unrelated directories are not listed";
    EXPECT_EQ(Find(*r, "notes.txt"), nullptr);
    EXPECT_EQ(Find(*r, "strata-swap-link"), nullptr) << "symlinks are not followed";
    ASSERT_NE(Find(*r, "strata-swap-1-2-0"), nullptr) << Listing(*r);
    EXPECT_EQ(Find(*r, "strata-swap-1-2-0")->state, State::kNoLock);
    EXPECT_EQ(Find(*r, extra_file.name())->state, State::kForeign);
    EXPECT_NE(Find(*r, extra_file.name())->detail.find("results.csv"), std::string::npos);
    EXPECT_EQ(Find(*r, extra_dir.name())->state, State::kForeign);
    EXPECT_NE(Find(*r, extra_dir.name())->detail.find("logs (a directory)"), std::string::npos);
    EXPECT_EQ(Find(*r, extra_link.name())->state, State::kForeign);
    EXPECT_EQ(Find(*r, remote.name())->state, State::kOtherHost);
    EXPECT_NE(DescribeVerdict(p, *Find(*r, remote.name())).find("some-other-host.invalid"),
              std::string::npos);
  }
  EXPECT_TRUE(Exists(p + "/data/x.bin"));
  EXPECT_TRUE(Exists(p + "/data/sub"));
  EXPECT_TRUE(Exists(p + "/notes.txt"));
  EXPECT_TRUE(Exists(target.dir() + "/params.swp")) << "reclaim followed a symlink";
  EXPECT_TRUE(Exists(p + "/strata-swap-1-2-0/params.swp"));
  for (const ChildRun* c : {&extra_file, &extra_dir, &extra_link, &remote}) {
    EXPECT_TRUE(Exists(c->dir() + "/params.swp")) << c->dir();
    EXPECT_TRUE(Exists(c->dir() + "/" + kRunLockFile)) << c->dir();
  }
  // Once the foreign file is gone, the orphan is an orphan.
  fs::remove(extra_file.dir() + "/results.csv");
  Result<ReclaimReport> r = ReclaimOrphans(p);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->removed, 1) << Listing(*r);
  EXPECT_FALSE(Exists(extra_file.dir()));
}

// A run between mkdir and its lock file's rename: the directory holds only strata.lock.tmp, locked.
// Reclaim must not take it; and the lock file never appears under its name unlocked.
TEST(RunDirTest, ADirectoryBeingCreatedIsNotTaken) {
  TempDir parent;
  const std::string dir = parent.File("strata-swap-9-9-0");
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  const int tmp = open((dir + "/" + kRunLockTmpFile).c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(tmp, 0);
  ASSERT_EQ(flock(tmp, LOCK_EX), 0);
  Result<ReclaimReport> r = ReclaimOrphans(parent.path());
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->dirs.size(), 1u);
  EXPECT_EQ(r->dirs[0].state, State::kNoLock);
  EXPECT_TRUE(Exists(dir + "/" + kRunLockTmpFile));
  close(tmp);

  ASSERT_EQ(unlink((dir + "/" + kRunLockTmpFile).c_str()), 0);
  Result<UniqueFd> lock = CreateRunLock(dir);
  ASSERT_TRUE(lock.ok()) << lock.status().ToString();
  const int other = open((dir + "/" + kRunLockFile).c_str(), O_RDWR);
  ASSERT_GE(other, 0);
  EXPECT_NE(flock(other, LOCK_EX | LOCK_NB), 0) << "the lock file appeared unlocked";
  EXPECT_EQ(ReadRunOwner(other).pid, getpid());
  close(other);
  EXPECT_FALSE(Exists(dir + "/" + kRunLockTmpFile));
}

// Many processes creating and ending runs while others are killed and others reclaim, on one
// nvme_path: no run ever loses its directory or fails to start, and in the end no orphan is left.
TEST(RunDirTest, ConcurrentCreateKillAndReclaimNeverTakeALiveRun) {
  TempDir parent;
  const std::string p = parent.path();
  constexpr int kWorkers = 4, kRounds = 25;
  std::vector<pid_t> workers;
  for (int w = 0; w < kWorkers; ++w) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (int i = 0; i < kRounds; ++i) {
        auto s = SwapSpace::Create({.nvme_path = p, .handle_signals = false});
        if (!s.ok()) _exit(10);
        if (!(*s)->Reserve("params", 64 << 10).ok()) _exit(11);
        if (!(*s)->Allocate("a", "optimizer", 8192).ok()) _exit(12);
        usleep(2000);  // a run's life, during which the others reclaim
        struct stat st {};
        if (stat(((*s)->dir() + "/params.swp").c_str(), &st) != 0) _exit(13);
        if (stat(((*s)->dir() + "/" + kRunLockFile).c_str(), &st) != 0) _exit(14);
        // Every third round dies like kill -9 would leave it (no destructor, no cleanup).
        if (i % 3 == 2) {
          const pid_t victim = fork();
          if (victim == 0) {
            auto v = SwapSpace::Create({.nvme_path = p, .handle_signals = false});
            if (v.ok()) (void)(*v)->Reserve("params", 64 << 10);
            raise(SIGKILL);
          }
          waitpid(victim, nullptr, 0);
        }
      }
      _exit(0);
    }
    workers.push_back(pid);
  }
  int reclaims = 0;
  std::vector<int> status(kWorkers, -1);
  for (int running = kWorkers; running > 0;) {
    Result<ReclaimReport> r = ReclaimOrphans(p);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (const RunDirVerdict& v : r->dirs) {
      EXPECT_NE(v.state, State::kError) << DescribeVerdict(p, v);
      EXPECT_NE(v.state, State::kForeign) << DescribeVerdict(p, v);
    }
    ++reclaims;
    for (int w = 0; w < kWorkers; ++w) {
      if (status[w] == -1 && waitpid(workers[w], &status[w], WNOHANG) == workers[w]) --running;
    }
  }
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_TRUE(WIFEXITED(status[w]) && WEXITSTATUS(status[w]) == 0)
        << "worker " << w << " status " << status[w] << " (10: Create failed, 13/14: its "
        << "directory lost files while it lived)";
  }
  EXPECT_GT(reclaims, 1);
  Result<ReclaimReport> last = ReclaimOrphans(p);
  ASSERT_TRUE(last.ok());
  for (const RunDirVerdict& v : last->dirs) {
    EXPECT_TRUE(v.state == State::kRemoved) << DescribeVerdict(p, v);
  }
  std::error_code ec;
  EXPECT_TRUE(fs::is_empty(p, ec)) << "orphans left";
}

TEST(RunDirTest, BadPathsAreClearErrors) {
  TempDir parent;
  Result<ReclaimReport> r = ReclaimOrphans(parent.File("missing"));
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(parent.File("missing")), std::string::npos);
  std::ofstream(parent.File("file")) << "x";
  r = ReclaimOrphans(parent.File("file"));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("is not a directory"), std::string::npos);
  if (geteuid() != 0) {  // root reads any directory
    ASSERT_EQ(mkdir(parent.File("closed").c_str(), 0), 0);
    r = ReclaimOrphans(parent.File("closed"));
    EXPECT_EQ(r.status().code(), StatusCode::kIoError);
    EXPECT_NE(r.status().message().find("Permission denied"), std::string::npos)
        << r.status().ToString();
    chmod(parent.File("closed").c_str(), 0700);
  }
}

}  // namespace
}  // namespace strata
