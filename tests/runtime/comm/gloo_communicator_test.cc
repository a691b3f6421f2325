// ConnectGloo and the Gloo communicator across forked processes on loopback: every collective
// against known values (2 and 4 ranks), a lost rank named by the survivors, WORLD_SIZE mismatches,
// ranks that never join, and an unreachable MASTER_ADDR:MASTER_PORT.
#include "runtime/comm/gloo_communicator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/comm/launcher.h"
#include "tests/runtime/comm/rank_fork.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using strata::testing::HoldUntilExit;
using strata::testing::RunRanks;
using strata::testing::TempDir;
using strata::testing::WaitUntilGone;

DistEnv Env(int rank, int world, int port) {
  DistEnv e;
  e.rank = rank;
  e.world_size = world;
  e.local_rank = rank;
  e.local_world_size = world;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  return e;
}

int Port() {
  Result<int> p = FreeLoopbackPort();
  return p.ok() ? *p : 0;
}

bool Contains(const Status& s, const std::string& needle) {
  return s.message().find(needle) != std::string_view::npos;
}

uint8_t Byte(int rank, size_t i) { return static_cast<uint8_t>((rank * 7 + i) % 251); }

int AllOps(int rank, int n, int port) {
  auto comms = ConnectGloo(Env(rank, n, port), 2, std::chrono::seconds(15));
  RANK_OK(comms.status());
  RANK_CHECK(comms->size() == 2);
  Communicator& c = *(*comms)[0];
  RANK_CHECK(c.rank() == rank && c.world_size() == n && c.backend() == "gloo");

  // AllGather, separate buffers (an odd size) and in place.
  const size_t bytes = 1003;
  std::vector<uint8_t> send(bytes), recv(bytes * n, 0);
  for (size_t i = 0; i < bytes; ++i) send[i] = Byte(rank, i);
  RANK_OK(c.AllGather(send.data(), recv.data(), bytes));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < bytes; ++i) RANK_CHECK(recv[r * bytes + i] == Byte(r, i));
  }
  std::vector<uint8_t> inplace(bytes * n, 0xEE);
  std::memcpy(inplace.data() + rank * bytes, send.data(), bytes);
  RANK_OK(c.AllGather(inplace.data() + rank * bytes, inplace.data(), bytes));
  RANK_CHECK(inplace == recv);

  // ReduceScatterSum: send[j] = rank + j; block `rank` sums to n(n-1)/2 + n*(rank*count + i).
  const size_t count = 257;
  std::vector<float> rs_send(count * n), rs_recv(count, -1.0f);
  for (size_t j = 0; j < rs_send.size(); ++j) rs_send[j] = static_cast<float>(rank + j);
  const std::vector<float> rs_copy = rs_send;
  RANK_OK(c.ReduceScatterSum(rs_send.data(), rs_recv.data(), count));
  RANK_CHECK(rs_send == rs_copy);  // `send` is not modified
  for (size_t i = 0; i < count; ++i) {
    RANK_CHECK(rs_recv[i] == static_cast<float>(n * (n - 1) / 2 + n * (rank * count + i)));
  }
  // recv aliasing block `rank` of send.
  RANK_OK(c.ReduceScatterSum(rs_send.data(), rs_send.data() + rank * count, count));
  for (size_t i = 0; i < count; ++i) RANK_CHECK(rs_send[rank * count + i] == rs_recv[i]);

  // AllReduceSum (double and float), on the second group too.
  std::vector<double> d(100);
  for (size_t i = 0; i < d.size(); ++i) d[i] = rank + 0.5 * i;
  RANK_OK(c.AllReduceSum(d.data(), d.size()));
  for (size_t i = 0; i < d.size(); ++i) RANK_CHECK(d[i] == n * (n - 1) / 2.0 + n * 0.5 * i);
  std::vector<float> f(100);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(rank + 0.25 * i);
  RANK_OK((*comms)[1]->AllReduceSumFloat(f.data(), f.size()));
  for (size_t i = 0; i < f.size(); ++i) {
    RANK_CHECK(f[i] == static_cast<float>(n * (n - 1) / 2.0 + n * 0.25 * i));
  }

  // Broadcast from the last rank; BroadcastString from rank 1.
  std::vector<uint8_t> b(4096);
  for (size_t i = 0; i < b.size(); ++i) b[i] = rank == n - 1 ? Byte(99, i) : 0;
  RANK_OK(c.Broadcast(b.data(), b.size(), n - 1));
  for (size_t i = 0; i < b.size(); ++i) RANK_CHECK(b[i] == Byte(99, i));
  std::string text = rank == 1 ? "hello from rank 1" : "";
  RANK_OK(BroadcastString(c, text, 1));
  RANK_CHECK(text == "hello from rank 1");
  RANK_OK(c.Barrier());
  RANK_OK((*comms)[1]->Barrier());
  return 0;
}

class GlooAllOpsTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooAllOpsTest, EveryCollectiveGivesKnownValues) {
  const int n = GetParam();
  const int port = Port();
  ASSERT_NE(port, 0);
  const std::vector<int> codes = RunRanks(n, [&](int rank) { return AllOps(rank, n, port); });
  EXPECT_EQ(codes, std::vector<int>(n, 0));
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooAllOpsTest, ::testing::Values(2, 4));

// Rank 1 ends abruptly after meeting; rank 0's next collective fails within a few seconds with
// kUnavailable naming rank 1.
TEST(GlooFailureTest, LostRankIsNamed) {
  const int port = Port();
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string gone = dir.File("rank1");
  const std::vector<int> codes = RunRanks(2, [&](int rank) {
    if (rank == 1) HoldUntilExit(gone);
    auto comms = ConnectGloo(Env(rank, 2, port), 1, std::chrono::seconds(5));
    RANK_OK(comms.status());
    Communicator& c = *(*comms)[0];
    RANK_OK(c.Barrier());
    if (rank == 1) ::_exit(0);
    RANK_CHECK(WaitUntilGone(gone));  // rank 1's process has ended
    const auto t0 = std::chrono::steady_clock::now();
    double v = 1;
    const Status s = c.AllReduceSum(&v, 1);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "rank 0 after %.1f s: %s\n", took, s.ToString().c_str());
    RANK_CHECK(s.code() == StatusCode::kUnavailable);
    RANK_CHECK(Contains(s, "all_reduce over gloo failed: rank 1 is gone (no heartbeat for 2.5 s)"));
    RANK_CHECK(took < 8);
    // The communicator stays failed.
    RANK_CHECK(c.Barrier().code() == StatusCode::kUnavailable);
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// Rank 0 (the store's host) ends abruptly; rank 1 names it.
TEST(GlooFailureTest, LostRankZeroIsNamed) {
  const int port = Port();
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string gone = dir.File("rank0");
  const std::vector<int> codes = RunRanks(2, [&](int rank) {
    if (rank == 0) HoldUntilExit(gone);
    auto comms = ConnectGloo(Env(rank, 2, port), 1, std::chrono::seconds(5));
    RANK_OK(comms.status());
    Communicator& c = *(*comms)[0];
    RANK_OK(c.Barrier());
    if (rank == 0) ::_exit(0);
    RANK_CHECK(WaitUntilGone(gone));  // rank 0's process (and the store it hosts) has ended
    std::vector<uint8_t> buf(2048);
    const Status s = c.AllGather(buf.data(), buf.data(), 1024);
    std::fprintf(stderr, "rank 1: %s\n", s.ToString().c_str());
    RANK_CHECK(s.code() == StatusCode::kUnavailable);
    RANK_CHECK(Contains(s, "all_gather over gloo failed: rank 0 is gone"));
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// Both ranks refuse the other. Rank 0 hosts the store: ConnectGloo keeps it until rank 1 has
// refused too (its strata/refused/1 key), so rank 1 gets the difference, not a lost store.
TEST(GlooJoinTest, WorldSizeMismatchIsNamed) {
  const int port = Port();
  const std::vector<int> codes = RunRanks(2, [&](int rank) {
    const int world = rank == 0 ? 2 : 3;
    auto comms = ConnectGloo(Env(rank, world, port), 1, std::chrono::seconds(5));
    RANK_CHECK(!comms.ok());
    std::fprintf(stderr, "rank %d: %s\n", rank, comms.status().ToString().c_str());
    RANK_CHECK(comms.status().code() == StatusCode::kInvalidArgument);
    if (rank == 1) {
      RANK_CHECK(Contains(comms.status(),
                          "rank 0 was started with WORLD_SIZE=2, rank 1 with WORLD_SIZE=3"));
    } else {
      RANK_CHECK(Contains(comms.status(),
                          "rank 1 was started with WORLD_SIZE=3, rank 0 with WORLD_SIZE=2"));
    }
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(GlooJoinTest, MissingRanksAreNamed) {
  const int port = Port();
  const std::vector<int> codes = RunRanks(1, [&](int rank) {
    const auto t0 = std::chrono::steady_clock::now();
    auto comms = ConnectGloo(Env(0, 3, port), 1, std::chrono::seconds(2));
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    RANK_CHECK(!comms.ok());
    std::fprintf(stderr, "%s\n", comms.status().ToString().c_str());
    RANK_CHECK(comms.status().code() == StatusCode::kUnavailable);
    RANK_CHECK(Contains(comms.status(),
                        "ranks 1, 2 did not join within 2 s (WORLD_SIZE=3, "
                        "MASTER_ADDR:MASTER_PORT=127.0.0.1:" +
                            std::to_string(port) + ")"));
    RANK_CHECK(took < 6);
    return 0;
  });
  EXPECT_EQ(codes, std::vector<int>{0});
}

TEST(GlooJoinTest, UnreachableMasterIsNamed) {
  const int port = Port();  // nobody listens on it
  const std::vector<int> codes = RunRanks(1, [&](int rank) {
    const auto t0 = std::chrono::steady_clock::now();
    auto comms = ConnectGloo(Env(1, 2, port), 1, std::chrono::seconds(2));
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    RANK_CHECK(!comms.ok());
    std::fprintf(stderr, "after %.1f s: %s\n", took, comms.status().ToString().c_str());
    RANK_CHECK(comms.status().code() == StatusCode::kUnavailable);
    RANK_CHECK(
        Contains(comms.status(), "MASTER_ADDR:MASTER_PORT=127.0.0.1:" + std::to_string(port)));
    RANK_CHECK(Contains(comms.status(), "MASTER_ADDR and MASTER_PORT environment variables"));
    RANK_CHECK(took < 10);
    return 0;
  });
  EXPECT_EQ(codes, std::vector<int>{0});
}

}  // namespace
}  // namespace strata::runtime
