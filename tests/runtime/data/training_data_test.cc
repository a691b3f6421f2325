// TrainingData (runtime/data/training_data.h): both sources behind the one interface give the
// windows, training samples and evaluation batches of the functions they wrap (FillBatch for byte
// text, WindowSampler and FillTrainSamples/FillEvalBatch for token ids), and a fingerprint that
// names the length and the unit.
#include "runtime/data/training_data.h"

#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/data/text_data.h"
#include "runtime/data/token_data.h"
#include "runtime/data/windows.h"
#include "tests/runtime/data/iota_tokens.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using ::testing::ElementsAre;
using ::testing::StartsWith;

TEST(TrainingDataTest, ByteTextIsFillBatchForTrainingAndConsecutiveWindowsForEvaluation) {
  const std::string text = "abcdefghijklmnopqrstuvwxyz";
  std::unique_ptr<TrainingData> data = NewByteTextData(text, 7);
  EXPECT_EQ(data->Windows(3), 26u / 4);
  std::vector<int64_t> x(6), y(6);
  ASSERT_TRUE(data->Eval(2, 3, 1, x.data(), y.data()).ok());
  EXPECT_THAT(x, ElementsAre('e', 'f', 'g', 'i', 'j', 'k'));
  EXPECT_THAT(y, ElementsAre('f', 'g', 'h', 'j', 'k', 'l'));

  std::vector<int64_t> want_x(6), want_y(6);
  FillBatch(text, 2, 3, 7, 5, want_x.data(), want_y.data());
  ASSERT_TRUE(data->Train(2, 3, 5, x.data(), y.data()).ok());
  EXPECT_EQ(x, want_x);
  EXPECT_EQ(y, want_y);
  EXPECT_THAT(data->Fingerprint(), StartsWith("26 bytes, hash "));
}

TEST(TrainingDataTest, TokenIdsAreSampledWindowsForTrainingAndInOrderForEvaluation) {
  strata::testing::TempDir dir("strata-training-data-test");
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<TokenData> tokens = Iota(dir, 20);
  ASSERT_NE(tokens, nullptr);
  std::unique_ptr<TrainingData> data = NewTokenWindowData(std::move(tokens), 4, 11);
  EXPECT_EQ(data->Windows(4), 4u);  // 20 tokens in windows of 5
  std::vector<int64_t> x(4), y(4);
  ASSERT_TRUE(data->Eval(1, 4, 1, x.data(), y.data()).ok());
  EXPECT_THAT(x, ElementsAre(5, 6, 7, 8));
  EXPECT_THAT(y, ElementsAre(6, 7, 8, 9));

  // Sample k is window WindowSampler(4, seed).Sample(k).
  const WindowSampler sampler(4, 11);
  std::vector<int64_t> xs(12), ys(12);
  ASSERT_TRUE(data->Train(3, 4, 6, xs.data(), ys.data()).ok());
  for (int r = 0; r < 3; ++r) {
    const int64_t first = static_cast<int64_t>(sampler.Sample(6 + r)) * 5;
    EXPECT_THAT(std::vector<int64_t>(xs.begin() + 4 * r, xs.begin() + 4 * r + 4),
                ElementsAre(first, first + 1, first + 2, first + 3));
    EXPECT_EQ(ys[4 * r + 3], first + 4);
  }
  EXPECT_THAT(data->Fingerprint(), StartsWith("20 tokens, hash "));
}

}  // namespace
}  // namespace strata::runtime
