// LaunchLocalRanks with /bin/sh as the rank program: the environment each rank gets, stdout and
// the prefixed stderr, exit codes, and how the others are ended after one rank fails.
#include "runtime/comm/launcher.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

// Runs `fn` with fd 2 redirected to a temporary file and returns what was written there.
template <typename Fn>
std::string CaptureStderr(Fn&& fn) {
  std::fflush(stderr);
  FILE* tmp = std::tmpfile();
  const int saved = ::dup(2);
  ::dup2(::fileno(tmp), 2);
  fn();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::string out;
  std::rewind(tmp);
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), tmp)) > 0;) out.append(buf, n);
  std::fclose(tmp);
  return out;
}

// A shell fragment that waits until `path` exists (a handshake between ranks), 60 s at most.
std::string WaitForFileSh(const std::string& path) {
  return "i=0; until [ -e " + path + " ] || [ $i -ge 6000 ]; do sleep 0.01; i=$((i+1)); done; ";
}

LaunchOptions Sh() {
  LaunchOptions o;
  o.executable = "/bin/sh";
  return o;
}

TEST(LauncherTest, RanksGetTheContractAndTheirOutputIsRelayed) {
  std::string out;
  LaunchOptions o = Sh();
  o.rank0_stdout = &out;
  Result<int> code = 0;
  const std::string err = CaptureStderr([&] {
    code = LaunchLocalRanks(
        3,
        {"sh", "-c",
         "echo \"env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR\" >&2; "
         "printf 'partial' >&2; echo out$RANK; test \"$MASTER_PORT\" -gt 0"},
        o);
  });
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 0) << err;
  EXPECT_EQ(out, "out0\n");  // only rank 0's stdout
  for (int r = 0; r < 3; ++r) {
    const std::string p = "[rank " + std::to_string(r) + "] ";
    EXPECT_NE(
        err.find(p + "env " + std::to_string(r) + " 3 " + std::to_string(r) + " 3 127.0.0.1\n"),
        std::string::npos)
        << err;
  }
  // A line every rank writes alike (here an unterminated one, ended at exit) is relayed once,
  // under the prefix of the rank that wrote it first.
  size_t partials = 0;
  for (size_t at = err.find("] partial\n"); at != std::string::npos;
       at = err.find("] partial\n", at + 1)) {
    ++partials;
  }
  EXPECT_EQ(partials, 1u) << err;
}

TEST(LauncherTest, AFailedRankEndsTheOthersAfterTheGracePeriod) {
  LaunchOptions o = Sh();
  o.grace = std::chrono::milliseconds(300);
  strata::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  // Rank 1 fails once ranks 0 and 2 are running.
  const std::string script = "if [ $RANK = 1 ]; then " + WaitForFileSh(dir.File("up0")) +
                             WaitForFileSh(dir.File("up2")) + "exit 3; fi; touch " +
                             dir.File("up") + "$RANK; exec sleep 60";
  Result<int> code = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string err = CaptureStderr([&] {
    code = LaunchLocalRanks(3, {"sh", "-c", script}, o);
  });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 3);
  EXPECT_LT(took, 5);
  EXPECT_NE(err.find("strata: rank 1 exited with code 3\n"), std::string::npos) << err;
  // The others were ended by the launcher's SIGTERM, after rank 1's failure.
  EXPECT_NE(err.find("strata: rank 0 was killed by signal 15 (SIGTERM)\n"), std::string::npos)
      << err;
  EXPECT_LT(err.find("rank 1 exited"), err.find("rank 0 was killed")) << err;
}

TEST(LauncherTest, SignalsGiveTheirCode) {
  LaunchOptions o = Sh();
  o.grace = std::chrono::milliseconds(100);
  Result<int> code = 0;
  const std::string err = CaptureStderr([&] {
    code = LaunchLocalRanks(2, {"sh", "-c", "if [ $RANK = 1 ]; then kill -9 $$; fi"}, o);
  });
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 128 + 9);
  EXPECT_NE(err.find("strata: rank 1 was killed by signal 9 (SIGKILL)\n"), std::string::npos)
      << err;
}

TEST(LauncherTest, SigtermIsKilledAfterKillAfter) {
  LaunchOptions o = Sh();
  o.grace = std::chrono::milliseconds(100);
  o.kill_after = std::chrono::milliseconds(300);
  strata::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  // Rank 0 ignores SIGTERM (its exec'd sleep too) before rank 1 fails; only SIGKILL ends it.
  const std::string script = "if [ $RANK = 1 ]; then " + WaitForFileSh(dir.File("ignoring")) +
                             "exit 1; fi; trap '' TERM; touch " + dir.File("ignoring") +
                             "; exec sleep 60";
  Result<int> code = 0;
  const std::string err = CaptureStderr([&] {
    code = LaunchLocalRanks(2, {"sh", "-c", script}, o);
  });
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 1);
  EXPECT_NE(err.find("strata: rank 0 was killed by signal 9 (SIGKILL)"), std::string::npos) << err;
}

TEST(LauncherTest, RemoveNprocFlag) {
  auto r = RemoveNprocFlag({"strata", "train", "--nproc", "4", "--steps", "2", "--nproc=3"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<std::string>{"strata", "train", "--steps", "2"}));
  EXPECT_FALSE(RemoveNprocFlag({"strata", "--nproc"}).ok());
}

TEST(LauncherTest, FreeLoopbackPort) {
  Result<int> p = FreeLoopbackPort();
  ASSERT_TRUE(p.ok());
  EXPECT_GT(*p, 0);
  EXPECT_LT(*p, 65536);
}

}  // namespace
}  // namespace strata::runtime
