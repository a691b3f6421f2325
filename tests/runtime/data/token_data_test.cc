// TokenData: .bin files of both widths (read in place), text files tokenized as run_clm.py does,
// and an error naming file and position for every kind of bad input.
#include "runtime/data/token_data.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/data/tokenizer.h"
#include "tests/runtime/data/tiny_tokenizer.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using ::testing::HasSubstr;

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

template <typename T>
void WriteIds(const std::string& path, const std::vector<T>& ids) {
  std::string bytes(ids.size() * sizeof(T), '\0');
  std::memcpy(bytes.data(), ids.data(), bytes.size());
  WriteFile(path, bytes);
}

std::vector<int64_t> ReadAll(const TokenData& data) {
  std::vector<int64_t> out(data.size());
  EXPECT_TRUE(data.Copy(0, data.size(), out.data()).ok());
  return out;
}

std::string Message(const Status& s) { return std::string(s.message()); }

class TokenDataTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }
  Result<std::unique_ptr<TokenData>> Open(const std::string& name, int64_t vocab,
                                          const std::string& dtype = "") {
    TokenDataOptions o;
    o.path = dir_.File(name);
    o.vocab_size = vocab;
    o.dtype = dtype;
    return TokenData::Open(o);
  }
  strata::testing::TempDir dir_{"strata-tokdata-test"};
};

TEST_F(TokenDataTest, BinUint16ByDefaultForSmallVocabularies) {
  const std::vector<uint16_t> ids = {0, 1, 2, 65535, 300, 7};
  WriteIds(dir_.File("a.bin"), ids);
  Result<std::unique_ptr<TokenData>> data = Open("a.bin", 65536);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ((*data)->size(), ids.size());
  EXPECT_EQ((*data)->format(), "bin");
  EXPECT_EQ((*data)->dtype(), "uint16");
  EXPECT_EQ((*data)->records(), 0u);
  // Widened, not sign-extended: 65535 stays 65535.
  EXPECT_EQ(ReadAll(**data), std::vector<int64_t>({0, 1, 2, 65535, 300, 7}));
  int64_t middle[2];
  ASSERT_TRUE((*data)->Copy(3, 2, middle).ok());
  EXPECT_EQ(middle[0], 65535);
  EXPECT_EQ(middle[1], 300);
  EXPECT_EQ(DefaultBinDtype(65536), "uint16");
  EXPECT_EQ(DefaultBinDtype(65537), "uint32");
}

TEST_F(TokenDataTest, BinUint32ForLargeVocabularies) {
  const std::vector<uint32_t> ids = {128000, 5, 128255, 70000};
  WriteIds(dir_.File("a.bin"), ids);
  Result<std::unique_ptr<TokenData>> data = Open("a.bin", 128256);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ((*data)->dtype(), "uint32");
  EXPECT_EQ(ReadAll(**data), std::vector<int64_t>({128000, 5, 128255, 70000}));
}

TEST_F(TokenDataTest, DtypeOverridesTheDefault) {
  const std::vector<uint32_t> ids = {10, 20, 30};
  WriteIds(dir_.File("a.bin"), ids);
  // A uint32 file for a small vocabulary: read as uint16 it is six ids (low and high halves).
  Result<std::unique_ptr<TokenData>> as16 = Open("a.bin", 1000);
  ASSERT_TRUE(as16.ok()) << as16.status().ToString();
  EXPECT_EQ(ReadAll(**as16), std::vector<int64_t>({10, 0, 20, 0, 30, 0}));
  Result<std::unique_ptr<TokenData>> as32 = Open("a.bin", 1000, "uint32");
  ASSERT_TRUE(as32.ok()) << as32.status().ToString();
  EXPECT_EQ((*as32)->dtype(), "uint32");
  EXPECT_EQ(ReadAll(**as32), std::vector<int64_t>({10, 20, 30}));
  // And the other way round.
  WriteIds(dir_.File("b.bin"), std::vector<uint16_t>{4, 5, 6, 7});
  Result<std::unique_ptr<TokenData>> b = Open("b.bin", 100000, "uint16");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(ReadAll(**b), std::vector<int64_t>({4, 5, 6, 7}));

  Result<std::unique_ptr<TokenData>> bad = Open("a.bin", 1000, "int8");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(bad.status()), HasSubstr("int8"));
}

TEST_F(TokenDataTest, IdsWiderThanTheDefaultWidthAreRefusedNamingTheFlag) {
  std::vector<uint32_t> ids32(64);
  std::vector<uint64_t> ids64(64);
  for (size_t i = 0; i < ids32.size(); ++i) ids32[i] = ids64[i] = 1 + (i * 37) % 250;
  WriteIds(dir_.File("u32.bin"), ids32);
  WriteIds(dir_.File("i64.bin"), ids64);
  Result<std::unique_ptr<TokenData>> u32 = Open("u32.bin", 256);
  ASSERT_FALSE(u32.ok());
  EXPECT_EQ(u32.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(u32.status()), HasSubstr("u32.bin"));
  EXPECT_THAT(Message(u32.status()), HasSubstr("--data-dtype uint32"));
  EXPECT_THAT(Message(u32.status()), HasSubstr("64 of them, not 128"));
  // Chosen explicitly, the width is the user's (and uint32 reads the ids).
  EXPECT_TRUE(Open("u32.bin", 256, "uint16").ok());
  Result<std::unique_ptr<TokenData>> right = Open("u32.bin", 256, "uint32");
  ASSERT_TRUE(right.ok()) << right.status().ToString();
  EXPECT_EQ((*right)->size(), 64u);
  for (const char* vocab_case : {"small", "large"}) {
    SCOPED_TRACE(vocab_case);
    Result<std::unique_ptr<TokenData>> i64 =
        Open("i64.bin", std::string(vocab_case) == "small" ? 256 : 100000);
    ASSERT_FALSE(i64.ok());
    EXPECT_THAT(Message(i64.status()), HasSubstr("64-bit ids"));
  }
  // Real uint16 ids with zeros among them are not mistaken for wider ones.
  std::vector<uint16_t> ids16(64);
  for (size_t i = 0; i < ids16.size(); ++i) ids16[i] = i % 2 ? (i % 7 == 1 ? 9 : 0) : 3;
  WriteIds(dir_.File("u16.bin"), ids16);
  EXPECT_TRUE(Open("u16.bin", 256).ok());
}

TEST_F(TokenDataTest, OddSizeNamesTheFile) {
  WriteFile(dir_.File("odd.bin"), std::string(5, '\1'));
  Result<std::unique_ptr<TokenData>> data = Open("odd.bin", 1000);
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(data.status()), HasSubstr(dir_.File("odd.bin")));
  EXPECT_THAT(Message(data.status()), HasSubstr("5 bytes"));
  WriteFile(dir_.File("six.bin"), std::string(6, '\0'));
  data = Open("six.bin", 1000, "uint32");
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(Message(data.status()), HasSubstr("uint32"));
}

TEST_F(TokenDataTest, OutOfRangeIdNamesItsPosition) {
  // Past the first scan chunk, so the position is found inside a later one.
  std::vector<uint16_t> ids(200000, 999);
  ids[150001] = 1000;
  ids[150002] = 5000;
  WriteIds(dir_.File("big.bin"), ids);
  Result<std::unique_ptr<TokenData>> data = Open("big.bin", 1000);
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kInvalidArgument);
  const std::string m = Message(data.status());
  EXPECT_THAT(m, HasSubstr(dir_.File("big.bin")));
  EXPECT_THAT(m, HasSubstr("token 150001 "));
  EXPECT_THAT(m, HasSubstr("byte offset 300002"));
  EXPECT_THAT(m, HasSubstr("is 1000"));
  EXPECT_THAT(m, HasSubstr("vocab_size 1000"));
  // uint32: byte offsets are 4 per token.
  WriteIds(dir_.File("c.bin"), std::vector<uint32_t>{1, 2, 3000000000u});
  data = Open("c.bin", 70000);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(Message(data.status()), HasSubstr("token 2 (byte offset 8) is 3000000000"));
  // Exactly vocab_size - 1 is fine.
  ids[150001] = ids[150002] = 999;
  WriteIds(dir_.File("big.bin"), ids);
  EXPECT_TRUE(Open("big.bin", 1000).ok());
}

TEST_F(TokenDataTest, EmptyBinHasNoTokens) {
  WriteFile(dir_.File("empty.bin"), "");
  Result<std::unique_ptr<TokenData>> data = Open("empty.bin", 1000);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ((*data)->size(), 0u);
}

TEST_F(TokenDataTest, MissingFileAndUnknownExtension) {
  Result<std::unique_ptr<TokenData>> data = Open("absent.bin", 1000);
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(Message(data.status()), HasSubstr(dir_.File("absent.bin")));
  WriteFile(dir_.File("x.csv"), "1,2,3\n");
  data = Open("x.csv", 1000);
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kInvalidArgument);
  for (const char* ext : {".csv", ".bin", ".jsonl", ".txt"}) {
    EXPECT_THAT(Message(data.status()), HasSubstr(ext));
  }
  data = Open("", 1000);
  EXPECT_FALSE(data.ok());
  WriteFile(dir_.File("a.bin"), "");
  data = Open("a.bin", 0);
  EXPECT_FALSE(data.ok());
}

// ---- Text: .jsonl and .txt through a tiny SentencePiece model ---------------------------------

class TextDataTest : public TokenDataTest {
 protected:
  static void SetUpTestSuite() {
    model_ = new strata::testing::TempDir("strata-tokdata-model");
    ASSERT_TRUE(model_->ok());
    ASSERT_EQ(strata::testing::TrainTinyTokenizer(model_->path()), "");
    sp_ = new sentencepiece::SentencePieceProcessor();
    ASSERT_TRUE(sp_->Load(model_->File("tokenizer.model")).ok());
  }
  static void TearDownTestSuite() {
    delete sp_;
    delete model_;
  }
  Result<std::unique_ptr<TokenData>> OpenText(const std::string& name,
                                              int64_t vocab = strata::testing::kTinyVocab,
                                              TokenizeProgress progress = {}) {
    TokenDataOptions o;
    o.path = dir_.File(name);
    o.vocab_size = vocab;
    o.model_dir = model_->path();
    o.progress = std::move(progress);
    return TokenData::Open(o);
  }
  // What run_clm.py gets for these records: [BOS] + SentencePiece ids, concatenated.
  static std::vector<int64_t> Expected(const std::vector<std::string>& records) {
    std::vector<int64_t> out;
    for (const std::string& r : records) {
      std::vector<int> ids;
      EXPECT_TRUE(sp_->Encode(r, &ids).ok());
      out.push_back(1);
      out.insert(out.end(), ids.begin(), ids.end());
    }
    return out;
  }
  static strata::testing::TempDir* model_;
  static sentencepiece::SentencePieceProcessor* sp_;
};
strata::testing::TempDir* TextDataTest::model_ = nullptr;
sentencepiece::SentencePieceProcessor* TextDataTest::sp_ = nullptr;

TEST_F(TextDataTest, JsonlRecordsAreTokenizedAndConcatenated) {
  WriteFile(dir_.File("d.jsonl"),
            "{\"text\": \"the quick brown fox\", \"id\": 1}\n"
            "\n"
            "   \n"
            "{\"id\": 2, \"text\": \"caf\\u00e9 line\\nbreak \\ud83d\\ude42\"}\r\n"
            "{\"text\": \"\"}\n"
            "{\"text\": \"last line without newline\"}");
  Result<std::unique_ptr<TokenData>> data = OpenText("d.jsonl");
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ((*data)->format(), "jsonl");
  EXPECT_EQ((*data)->dtype(), "");
  EXPECT_EQ((*data)->records(), 4u);
  const std::vector<int64_t> expected =
      Expected({"the quick brown fox", "café line\nbreak 🙂", "", "last line without newline"});
  EXPECT_EQ(ReadAll(**data), expected);
  EXPECT_EQ((*data)->size(), expected.size());
}

TEST_F(TextDataTest, JsonlErrorsNameFileAndLine) {
  WriteFile(dir_.File("nofield.jsonl"), "{\"text\": \"a\"}\n\n{\"content\": \"b\"}\n");
  Result<std::unique_ptr<TokenData>> data = OpenText("nofield.jsonl");
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(data.status()), HasSubstr(dir_.File("nofield.jsonl") + " line 3"));
  EXPECT_THAT(Message(data.status()), HasSubstr("no \"text\" field"));

  WriteFile(dir_.File("bad.jsonl"), "{\"text\": \"a\"}\n{\"text\": \"b\"\n");
  data = OpenText("bad.jsonl");
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(data.status()),
              HasSubstr(dir_.File("bad.jsonl") + " line 2: not valid JSON"));

  WriteFile(dir_.File("type.jsonl"), "{\"text\": [\"a\"]}\n");
  data = OpenText("type.jsonl");
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(Message(data.status()), HasSubstr("line 1: \"text\" is an array"));

  WriteFile(dir_.File("array.jsonl"), "[1, 2]\n");
  data = OpenText("array.jsonl");
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(Message(data.status()), HasSubstr("line 1: expected a JSON object"));
}

TEST_F(TextDataTest, TxtLinesKeepTheirLineBreak) {
  WriteFile(dir_.File("d.txt"), "first line\n\nsecond line\r\n  indented\nno newline at end");
  Result<std::unique_ptr<TokenData>> data = OpenText("d.txt");
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ((*data)->format(), "txt");
  EXPECT_EQ((*data)->records(), 4u);
  EXPECT_EQ(ReadAll(**data),
            Expected({"first line\n", "second line\n", "  indented\n", "no newline at end"}));
}

TEST_F(TextDataTest, IdsBeyondTheModelVocabularyAreRejected) {
  WriteFile(dir_.File("d.txt"), "the lazy dog\nthe quick brown fox\n");
  Result<std::unique_ptr<TokenData>> data = OpenText("d.txt", /*vocab=*/5);
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(data.status()), HasSubstr(dir_.File("d.txt") + " line 1: token 1 is"));
  EXPECT_THAT(Message(data.status()), HasSubstr("vocab_size 5"));
}

TEST_F(TextDataTest, TextNeedsAModelDirectoryAndNoDtype) {
  WriteFile(dir_.File("d.txt"), "the lazy dog\n");
  TokenDataOptions o;
  o.path = dir_.File("d.txt");
  o.vocab_size = 1000;
  Result<std::unique_ptr<TokenData>> data = TokenData::Open(o);
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(data.status()), HasSubstr("tokenizer.model"));
  o.model_dir = model_->path();
  o.dtype = "uint16";
  data = TokenData::Open(o);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(Message(data.status()), HasSubstr(".bin"));
}

TEST_F(TextDataTest, ProgressReachesTheEnd) {
  std::string text;
  for (const std::string& line : strata::testing::TinyCorpusLines(200)) text += line + "\n";
  WriteFile(dir_.File("d.txt"), text);
  uint64_t last_done = 0, last_total = 0;
  int calls = 0;
  Result<std::unique_ptr<TokenData>> data =
      OpenText("d.txt", strata::testing::kTinyVocab, [&](uint64_t done, uint64_t total) {
        EXPECT_GE(done, last_done);
        last_done = done;
        last_total = total;
        ++calls;
      });
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_GE(calls, 1);
  EXPECT_EQ(last_done, text.size());
  EXPECT_EQ(last_total, text.size());
  EXPECT_EQ((*data)->records(), 200u);
}

TEST_F(TextDataTest, TokenizeTextFileMatchesTokenData) {
  WriteFile(dir_.File("d.jsonl"), "{\"text\": \"one\"}\n{\"text\": \"two three\"}\n");
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::Open(model_->path());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  Result<TextTokens> text = TokenizeTextFile(dir_.File("d.jsonl"), **tok, 0);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(text->records, 2u);
  const std::vector<int64_t> expected = Expected({"one", "two three"});
  EXPECT_EQ(std::vector<int64_t>(text->ids.begin(), text->ids.end()), expected);
  Result<TextTokens> bin = TokenizeTextFile(dir_.File("d.bin"), **tok, 0);
  ASSERT_FALSE(bin.ok());
  EXPECT_EQ(bin.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(TextDataTest, ThreadsDoNotChangeTheResult) {
  std::vector<std::string> records;
  std::string text;
  const std::vector<std::string> lines = strata::testing::TinyCorpusLines(600);
  while (text.size() < (1500u << 10)) {  // several 256 KiB ranges
    const std::string& line = lines[records.size() % lines.size()];
    records.push_back(line + " " + std::to_string(records.size()) + "\n");
    text += records.back();
  }
  WriteFile(dir_.File("big.txt"), text);
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::Open(model_->path());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  Result<TextTokens> one = TokenizeTextFile(dir_.File("big.txt"), **tok, 0, {}, 1);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->records, records.size());
  EXPECT_EQ(std::vector<int64_t>(one->ids.begin(), one->ids.end()), Expected(records));
  for (int threads : {2, 5, 64}) {
    Result<TextTokens> many = TokenizeTextFile(dir_.File("big.txt"), **tok, 0, {}, threads);
    ASSERT_TRUE(many.ok()) << many.status().ToString();
    EXPECT_EQ(many->records, one->records) << threads;
    EXPECT_TRUE(many->ids == one->ids) << threads << " threads";
  }
}

TEST_F(TextDataTest, ThreadsReportTheFirstErrorInTheFile) {
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::Open(model_->path());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  // Short records with small ids, and one late record with a larger id than any before it.
  const std::string small = "the";
  Result<std::vector<int32_t>> small_ids = (*tok)->Encode(small);
  ASSERT_TRUE(small_ids.ok());
  const int32_t limit = *std::max_element(small_ids->begin(), small_ids->end()) + 1;
  std::string large;
  std::vector<int32_t> large_ids;
  for (const std::string& candidate : strata::testing::TinyCorpusLines(50)) {
    Result<std::vector<int32_t>> ids = (*tok)->Encode(candidate);
    ASSERT_TRUE(ids.ok());
    if (*std::max_element(ids->begin(), ids->end()) >= limit) {
      large = candidate;
      large_ids = *ids;
      break;
    }
  }
  ASSERT_FALSE(large.empty());
  const int kLines = 100000, kBadLine = 80000, kBrokenLine = 95000;  // 1-based
  std::string text;
  for (int i = 1; i <= kLines; ++i) {
    if (i == kBrokenLine) {
      text += "{\"text\": oops}\n";
    } else {
      text += nlohmann::json{{"text", i == kBadLine ? large : small}}.dump() + "\n";
    }
  }
  WriteFile(dir_.File("big.jsonl"), text);
  const uint64_t bad_token =
      static_cast<uint64_t>(kBadLine - 1) * small_ids->size() +
      (std::find_if(large_ids.begin(), large_ids.end(), [&](int32_t id) { return id >= limit; }) -
       large_ids.begin());
  const std::string expected = dir_.File("big.jsonl") + " line " + std::to_string(kBadLine) +
                               ": token " + std::to_string(bad_token) + " is ";
  for (int threads : {1, 3, 8}) {
    Result<TextTokens> r = TokenizeTextFile(dir_.File("big.jsonl"), **tok, limit, {}, threads);
    ASSERT_FALSE(r.ok()) << threads;
    EXPECT_THAT(Message(r.status()), HasSubstr(expected)) << threads << " threads";
    // Without the vocabulary check the broken line is the first error.
    r = TokenizeTextFile(dir_.File("big.jsonl"), **tok, 0, {}, threads);
    ASSERT_FALSE(r.ok()) << threads;
    EXPECT_THAT(Message(r.status()), HasSubstr(dir_.File("big.jsonl") + " line " +
                                               std::to_string(kBrokenLine) + ": not valid JSON"))
        << threads << " threads";
  }
}

}  // namespace
}  // namespace strata::runtime
