// SFT data (runtime/data/sft_data.h): which files are SFT records, the rows and masked targets of
// the padded and packed layouts, the epoch's samples, the training order, and the summary.
#include "runtime/data/sft_data.h"

#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/data/windows.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t I = kIgnoredTarget;

class SftDataTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_.File(name);
    std::ofstream(path) << text;
    return path;
  }
  testing::TempDir dir_{"strata-sft-data"};
};

TEST_F(SftDataTest, OnlyJsonlFilesWhoseFirstRecordHasPromptKeysAreSft) {
  const std::string ids = Write("a.jsonl", "\n{\"prompt_ids\": [1], \"completion_ids\": [2]}\n");
  const std::string text = Write("b.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n");
  const std::string plain = Write("c.jsonl", "{\"text\": \"a\"}\n");
  const std::string not_json = Write("d.jsonl", "hello\n");
  const std::string txt = Write("e.txt", "{\"prompt\": \"a\", \"completion\": \"b\"}\n");
  EXPECT_TRUE(*IsSftFile(ids));
  EXPECT_TRUE(*IsSftFile(text));
  EXPECT_FALSE(*IsSftFile(plain));
  EXPECT_FALSE(*IsSftFile(not_json));
  EXPECT_FALSE(*IsSftFile(txt));
  EXPECT_EQ(IsSftFile(dir_.File("missing.jsonl")).status().code(), StatusCode::kNotFound);
}

TEST_F(SftDataTest, PaddedRowsMaskThePromptAndThePaddingAndTruncate) {
  const std::string path =
      Write("p.jsonl",
            "{\"prompt_ids\": [10, 11], \"completion_ids\": [12, 13]}\n"
            "{\"prompt_ids\": [20, 21, 22], \"completion_ids\": [23, 24, 25]}\n");
  SftDataOptions o{.path = path, .vocab_size = 100, .seq_len = 4, .seed = 3, .pad_id = 9};
  SftSummary s;
  auto data = OpenSftData(o, &s);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_TRUE((*data)->Masked());
  EXPECT_EQ((*data)->Windows(4), 2u);  // one sample per record
  std::vector<int64_t> x(8), y(8);
  ASSERT_TRUE((*data)->Eval(2, 4, 0, x.data(), y.data()).ok());
  // Record 0: 4 tokens in a row of 5, padded; record 1: 6 tokens truncated to 5.
  EXPECT_THAT(x, ElementsAre(10, 11, 12, 13, 20, 21, 22, 23));
  EXPECT_THAT(y, ElementsAre(I, 12, 13, I, I, I, 23, 24));
  EXPECT_EQ(s.records, 2u);
  EXPECT_EQ(s.tokens, 10u);
  EXPECT_EQ(s.completion_tokens, 5u);
  EXPECT_EQ(s.trained_tokens, 4u);
  EXPECT_EQ(s.truncated, 1u);
  EXPECT_EQ(s.truncated_completion_tokens, 1u);
  EXPECT_EQ(s.kind, "prompt_ids/completion_ids");

  // A shorter record is padded with the pad id, never a target.
  o.seq_len = 6;
  auto wide = OpenSftData(o, nullptr);
  ASSERT_TRUE(wide.ok());
  std::vector<int64_t> x6(6), y6(6);
  ASSERT_TRUE((*wide)->Eval(1, 6, 0, x6.data(), y6.data()).ok());
  EXPECT_THAT(x6, ElementsAre(10, 11, 12, 13, 9, 9));
  EXPECT_THAT(y6, ElementsAre(I, 12, 13, I, I, I));

  // Training sample k is record WindowSampler(records, seed).Sample(k).
  const WindowSampler sampler(2, 3);
  for (uint64_t k = 0; k < 6; ++k) {
    std::vector<int64_t> tx(4), ty(4), ex(4), ey(4);
    ASSERT_TRUE((*data)->Train(1, 4, k, tx.data(), ty.data()).ok());
    ASSERT_TRUE((*data)->Eval(1, 4, sampler.Sample(k), ex.data(), ey.data()).ok());
    EXPECT_EQ(tx, ex) << k;
    EXPECT_EQ(ty, ey) << k;
  }
}

TEST_F(SftDataTest, PackedWindowsKeepTheCompletionFlags) {
  const std::string path = Write("k.jsonl",
                                 "{\"prompt_ids\": [1, 2], \"completion_ids\": [3]}\n"
                                 "{\"prompt_ids\": [4], \"completion_ids\": [5, 6]}\n"
                                 "{\"prompt_ids\": [7], \"completion_ids\": [8]}\n");
  SftDataOptions o{.path = path, .vocab_size = 10, .seq_len = 2, .packing = true, .seed = 1};
  SftSummary s;
  auto data = OpenSftData(o, &s);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ((*data)->Windows(2), 2u);  // 8 tokens: 2 windows of 3, 2 dropped
  std::vector<int64_t> x(4), y(4);
  ASSERT_TRUE((*data)->Eval(2, 2, 0, x.data(), y.data()).ok());
  EXPECT_THAT(x, ElementsAre(1, 2, 4, 5));
  EXPECT_THAT(y, ElementsAre(I, 3, 5, 6));
  EXPECT_EQ(s.samples, 2u);
  EXPECT_EQ(s.dropped_tokens, 2u);
  EXPECT_EQ(s.trained_tokens, 3u);
}

TEST_F(SftDataTest, BadFilesAreRefusedNamingTheLine) {
  auto open = [&](const std::string& text) {
    SftDataOptions o{.path = Write("bad.jsonl", text), .vocab_size = 10, .seq_len = 4};
    return OpenSftData(o, nullptr).status();
  };
  EXPECT_THAT(std::string(open("{\"prompt_ids\": [1], \"completion_ids\": [2]}\n\n"
                               "{\"prompt_ids\": [1]}\n")
                              .message()),
              HasSubstr("bad.jsonl line 3: no \"completion_ids\" field"));
  EXPECT_THAT(std::string(open("{\"prompt_ids\": [1], \"completion_ids\": [10]}\n").message()),
              HasSubstr("line 1: \"completion_ids\"[0] is 10"));
  EXPECT_THAT(std::string(open("{\"prompt\": \"a\", \"completion\": \"b\"}\n").message()),
              HasSubstr("needs the model's tokenizer"));
  EXPECT_THAT(std::string(open("").message()), HasSubstr("no records"));
  // Nothing left to train on: every completion is beyond the row.
  EXPECT_THAT(
      std::string(open("{\"prompt_ids\": [1, 1, 1, 1, 1], \"completion_ids\": [2]}\n").message()),
      HasSubstr("no completion token is left to train on"));
}

}  // namespace
}  // namespace strata::runtime
