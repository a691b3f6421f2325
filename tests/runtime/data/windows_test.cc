// Packed windows: count, the one-token shift between inputs and targets, and the sampler's
// guarantees (a permutation per epoch, a function of (seed, epoch) only, so resuming is exact).
#include "runtime/data/windows.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/data/token_data.h"
#include "tests/runtime/data/iota_tokens.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using ::testing::HasSubstr;

class WindowsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }
  strata::testing::TempDir dir_{"strata-windows-test"};
};

TEST_F(WindowsTest, CountIsWholeWindowsOfSeqLenPlusOne) {
  EXPECT_EQ(WindowCount(10, 4), 2u);
  EXPECT_EQ(WindowCount(9, 4), 1u);
  EXPECT_EQ(WindowCount(5, 4), 1u);
  EXPECT_EQ(WindowCount(4, 4), 0u);
  EXPECT_EQ(WindowCount(0, 4), 0u);
  EXPECT_EQ(WindowCount(4097ull * 1000 + 4096, 4096), 1000u);

  std::unique_ptr<TokenData> data = Iota(dir_, 11);
  ASSERT_NE(data, nullptr);
  Result<uint64_t> n = CountWindows(*data, 4);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2u);
  n = CountWindows(*data, 11);  // needs 12 tokens
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kInvalidArgument);
  const std::string m(n.status().message());
  EXPECT_THAT(m, HasSubstr(data->path()));
  EXPECT_THAT(m, HasSubstr("11 tokens"));
  EXPECT_THAT(m, HasSubstr("seq_len + 1 = 12"));
  EXPECT_FALSE(CountWindows(*data, 0).ok());
}

TEST_F(WindowsTest, EvalBatchIsConsecutiveWindowsShiftedByOne) {
  std::unique_ptr<TokenData> data = Iota(dir_, 23);  // 4 windows of 5, 3 tokens left over
  ASSERT_NE(data, nullptr);
  std::vector<int64_t> in(2 * 4), tg(2 * 4);
  ASSERT_TRUE(
      FillEvalBatch(*data, /*batch=*/2, /*seq_len=*/4, /*first_window=*/1, in.data(), tg.data())
          .ok());
  EXPECT_EQ(in, std::vector<int64_t>({5, 6, 7, 8, 10, 11, 12, 13}));
  EXPECT_EQ(tg, std::vector<int64_t>({6, 7, 8, 9, 11, 12, 13, 14}));
  ASSERT_TRUE(FillEvalBatch(*data, 1, 4, 3, in.data(), tg.data()).ok());  // the last whole window
  EXPECT_EQ(std::vector<int64_t>(in.begin(), in.begin() + 4),
            std::vector<int64_t>({15, 16, 17, 18}));
  EXPECT_EQ(std::vector<int64_t>(tg.begin(), tg.begin() + 4),
            std::vector<int64_t>({16, 17, 18, 19}));
}

TEST_F(WindowsTest, TrainBatchRowsAreSampledWindows) {
  std::unique_ptr<TokenData> data = Iota(dir_, 70);  // 10 windows of 7
  ASSERT_NE(data, nullptr);
  const int seq = 6, batch = 3;
  WindowSampler sampler(WindowCount(data->size(), seq), /*seed=*/42);
  ASSERT_EQ(sampler.windows(), 10u);
  std::vector<int64_t> in(batch * seq), tg(batch * seq);
  for (uint64_t mb = 0; mb < 8; ++mb) {  // crosses two epoch boundaries
    ASSERT_TRUE(FillTrainBatch(*data, sampler, batch, seq, mb, in.data(), tg.data()).ok());
    for (int r = 0; r < batch; ++r) {
      const int64_t w = static_cast<int64_t>(sampler.Sample(mb * batch + r));
      for (int t = 0; t < seq; ++t) {
        EXPECT_EQ(in[r * seq + t], w * (seq + 1) + t) << "mb " << mb << " row " << r;
        EXPECT_EQ(tg[r * seq + t], w * (seq + 1) + t + 1) << "mb " << mb << " row " << r;
      }
    }
  }
}

TEST(WindowSamplerTest, EachEpochIsAPermutation) {
  for (uint64_t windows : {1ull, 2ull, 7ull, 1000ull}) {
    WindowSampler s(windows, 3);
    for (uint64_t epoch = 0; epoch < 4; ++epoch) {
      std::vector<uint64_t> seen;
      for (uint64_t i = 0; i < windows; ++i) seen.push_back(s.Sample(epoch * windows + i));
      EXPECT_EQ(seen, s.EpochOrder(epoch));
      std::sort(seen.begin(), seen.end());
      std::vector<uint64_t> all(windows);
      std::iota(all.begin(), all.end(), uint64_t{0});
      EXPECT_EQ(seen, all) << windows << " windows, epoch " << epoch;
    }
  }
}

TEST(WindowSamplerTest, OrderDependsOnSeedAndEpochOnly) {
  WindowSampler a(500, 7), b(500, 7), c(500, 8);
  EXPECT_EQ(a.EpochOrder(0), b.EpochOrder(0));
  EXPECT_EQ(a.EpochOrder(5), b.EpochOrder(5));
  EXPECT_NE(a.EpochOrder(0), a.EpochOrder(1));  // a fresh shuffle each epoch
  EXPECT_NE(a.EpochOrder(0), c.EpochOrder(0));  // and per seed
  std::vector<uint64_t> identity(500);
  std::iota(identity.begin(), identity.end(), uint64_t{0});
  EXPECT_NE(a.EpochOrder(0), identity);
  // Random access in any order agrees with a sequential walk (the cache is per epoch).
  for (uint64_t k : {1700ull, 3ull, 1701ull, 999ull, 4ull, 0ull, 2499ull}) {
    EXPECT_EQ(a.Sample(k), b.EpochOrder(k / 500)[k % 500]) << k;
  }
  // Epochs past 2^32 and large seeds mix all their bits.
  WindowSampler d(100, 1ull << 40);
  EXPECT_NE(d.EpochOrder(1ull << 33), d.EpochOrder(0));
  EXPECT_NE(d.EpochOrder(0), WindowSampler(100, 0).EpochOrder(0));
}

// The order is part of a checkpoint's meaning (a resumed run must see the same batches, even
// with a later strata), so it is pinned: std::mt19937_64 and std::seed_seq are specified by the
// standard and the bounded draw is ours.
TEST(WindowSamplerTest, OrderIsPinned) {
  WindowSampler s(10, 1234);
  EXPECT_EQ(s.EpochOrder(0), std::vector<uint64_t>({3, 1, 6, 5, 8, 4, 7, 0, 2, 9}));
  EXPECT_EQ(s.EpochOrder(1), std::vector<uint64_t>({2, 5, 4, 9, 6, 3, 0, 8, 7, 1}));
}

TEST_F(WindowsTest, ResumedRunSeesTheSameBatches) {
  std::unique_ptr<TokenData> data = Iota(dir_, 1000);
  ASSERT_NE(data, nullptr);
  const int seq = 8, batch = 5;
  const uint64_t windows = WindowCount(data->size(), seq);  // 111: batches straddle epochs
  std::vector<std::vector<int64_t>> straight;
  {
    WindowSampler s(windows, 99);
    for (uint64_t mb = 0; mb < 60; ++mb) {
      std::vector<int64_t> in(batch * seq), tg(batch * seq);
      ASSERT_TRUE(FillTrainBatch(*data, s, batch, seq, mb, in.data(), tg.data()).ok());
      in.insert(in.end(), tg.begin(), tg.end());
      straight.push_back(in);
    }
  }
  for (uint64_t resume_at : {1ull, 22ull, 23ull, 45ull}) {
    WindowSampler s(windows, 99);  // a new process: nothing cached
    for (uint64_t mb = resume_at; mb < 60; ++mb) {
      std::vector<int64_t> in(batch * seq), tg(batch * seq);
      ASSERT_TRUE(FillTrainBatch(*data, s, batch, seq, mb, in.data(), tg.data()).ok());
      in.insert(in.end(), tg.begin(), tg.end());
      ASSERT_EQ(in, straight[mb]) << "resumed at " << resume_at << ", micro-batch " << mb;
    }
  }
  // A different seed is a different run.
  WindowSampler other(windows, 100);
  std::vector<int64_t> in(batch * seq), tg(batch * seq);
  ASSERT_TRUE(FillTrainBatch(*data, other, batch, seq, 0, in.data(), tg.data()).ok());
  in.insert(in.end(), tg.begin(), tg.end());
  EXPECT_NE(in, straight[0]);
}

}  // namespace
}  // namespace strata::runtime
