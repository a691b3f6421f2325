// Runs the built `strata tokenize` on a model directory with a tiny SentencePiece model and checks
// the .bin it writes against SentencePiece itself (linked here as the oracle) and against
// TokenData reading it back; bad inputs exit 2 naming the file and leave no output behind. The
// strata binary links libtorch, so this also covers SentencePiece loading beside libprotobuf
// (Note [SentencePiece is loaded apart] in runtime/data/sentencepiece_shim.h).
#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/data/token_data.h"
#include "tests/runtime/data/tiny_tokenizer.h"
#include "tests/testing/cli_run.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using strata::testing::CliRun;
using strata::testing::Shell;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

template <typename T>
std::vector<int64_t> ReadIds(const std::string& path) {
  const std::string bytes = ReadFile(path);
  std::vector<T> ids(bytes.size() / sizeof(T));
  std::memcpy(ids.data(), bytes.data(), ids.size() * sizeof(T));
  return std::vector<int64_t>(ids.begin(), ids.end());
}

CliRun Tokenize(const std::string& args) {
  return Shell(std::string(STRATA_BINARY) + " tokenize " + args);
}

class TokenizeCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new strata::testing::TempDir("strata-tokcli-model");
    ASSERT_TRUE(model_->ok());
    ASSERT_EQ(strata::testing::TrainTinyTokenizer(model_->path()), "");
    sp_ = new sentencepiece::SentencePieceProcessor();
    ASSERT_TRUE(sp_->Load(model_->File("tokenizer.model")).ok());
    // A sanitizer build of strata refuses to load SentencePiece beside libtorch's libprotobuf
    // (Note [SentencePiece is loaded apart]) and says so; then there is nothing to test here.
    strata::testing::TempDir probe("strata-tokcli-probe");
    ASSERT_TRUE(probe.ok());
    fs::copy_file(model_->File("tokenizer.model"), probe.File("tokenizer.model"));
    WriteFile(probe.File("config.json"), "{\"vocab_size\": 400}");
    WriteFile(probe.File("d.txt"), "probe\n");
    const CliRun run = Tokenize("--model " + probe.path() + " --input " + probe.File("d.txt") +
                                " --output " + probe.File("d.bin"));
    if (run.out.find("sanitizer build") != std::string::npos) refused_ = new std::string(run.out);
  }
  static void TearDownTestSuite() {
    delete sp_;
    delete model_;
    delete refused_;
  }
  void SetUp() override {
    if (refused_ != nullptr) GTEST_SKIP() << *refused_;
    ASSERT_TRUE(dir_.ok());
  }

  // A model directory: the tiny tokenizer.model and a config.json with `vocab_size`.
  std::string ModelDir(int64_t vocab_size) {
    const std::string dir = dir_.File("model");
    fs::create_directories(dir);
    fs::copy_file(model_->File("tokenizer.model"), dir + "/tokenizer.model",
                  fs::copy_options::overwrite_existing);
    WriteFile(dir + "/config.json",
              "{\"model_type\": \"llama\", \"vocab_size\": " + std::to_string(vocab_size) + "}");
    return dir;
  }
  // [BOS] + SentencePiece's ids of each record, concatenated (run_clm.py with LlamaTokenizer).
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
  static std::string* refused_;  // why strata cannot tokenize here, or null
  strata::testing::TempDir dir_{"strata-tokcli-test"};
};
strata::testing::TempDir* TokenizeCliTest::model_ = nullptr;
sentencepiece::SentencePieceProcessor* TokenizeCliTest::sp_ = nullptr;
std::string* TokenizeCliTest::refused_ = nullptr;

const std::vector<std::string> kRecords = {"the quick brown fox jumps over the lazy dog.",
                                           "café 2024\nnaïve über 🙂", "strata offload"};

std::string Jsonl(const std::vector<std::string>& records) {
  std::string out;
  for (const std::string& r : records) out += nlohmann::json{{"text", r}}.dump() + "\n\n";
  return out;
}

TEST_F(TokenizeCliTest, JsonlToUint16BinMatchesSentencePiece) {
  const std::string model = ModelDir(strata::testing::kTinyVocab);
  WriteFile(dir_.File("data.jsonl"), Jsonl(kRecords));
  const std::string out = dir_.File("data.bin");
  const CliRun run = Tokenize("--model " + model + " --input " + dir_.File("data.jsonl") +
                              " --output " + out + " --json 2>/dev/null");
  ASSERT_EQ(run.rc, 0) << run.out;
  const nlohmann::json j = nlohmann::json::parse(run.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << run.out;
  const std::vector<int64_t> expected = Expected(kRecords);
  EXPECT_EQ(j.at("output").get<std::string>(), out);
  EXPECT_EQ(j.at("tokens").get<uint64_t>(), expected.size());
  EXPECT_EQ(j.at("dtype").get<std::string>(), "uint16");
  EXPECT_EQ(j.at("records").get<uint64_t>(), kRecords.size());
  EXPECT_GE(j.at("seconds").get<double>(), 0.0);
  EXPECT_EQ(fs::file_size(out), expected.size() * 2);
  EXPECT_EQ(ReadIds<uint16_t>(out), expected);
  EXPECT_FALSE(fs::exists(out + ".tmp"));

  // strata's own reader agrees, with no dtype given.
  TokenDataOptions o;
  o.path = out;
  o.vocab_size = strata::testing::kTinyVocab;
  Result<std::unique_ptr<TokenData>> data = TokenData::Open(o);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  std::vector<int64_t> back(expected.size());
  ASSERT_EQ((*data)->size(), expected.size());
  ASSERT_TRUE((*data)->Copy(0, back.size(), back.data()).ok());
  EXPECT_EQ(back, expected);
}

TEST_F(TokenizeCliTest, LargeVocabularyWritesUint32AndTextSaysOneLine) {
  const std::string model = ModelDir(128256);
  WriteFile(dir_.File("data.txt"), "first line\n\nsecond line\n");
  const std::string out = dir_.File("data.bin");
  const CliRun run = Tokenize("--model " + model + " --input " + dir_.File("data.txt") +
                              " --output " + out + " 2>/dev/null");
  ASSERT_EQ(run.rc, 0) << run.out;
  EXPECT_EQ(std::count(run.out.begin(), run.out.end(), '\n'), 1) << run.out;
  EXPECT_THAT(run.out, HasSubstr(out));
  EXPECT_THAT(run.out, HasSubstr("uint32"));
  EXPECT_THAT(run.out, HasSubstr("2 records"));
  EXPECT_EQ(ReadIds<uint32_t>(out), Expected({"first line\n", "second line\n"}));
}

TEST_F(TokenizeCliTest, BadJsonlExitsTwoNamingFileAndLine) {
  const std::string model = ModelDir(strata::testing::kTinyVocab);
  WriteFile(dir_.File("bad.jsonl"), "{\"text\": \"fine\"}\n{\"body\": \"no text\"}\n");
  const std::string out = dir_.File("bad.bin");
  const CliRun run =
      Tokenize("--model " + model + " --input " + dir_.File("bad.jsonl") + " --output " + out);
  EXPECT_EQ(run.rc, 2) << run.out;
  EXPECT_THAT(run.out, HasSubstr(dir_.File("bad.jsonl") + " line 2"));
  EXPECT_THAT(run.out, HasSubstr("\"text\""));
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp"));

  WriteFile(dir_.File("broken.jsonl"), "{\"text\": \"fine\"}\n{\"text\": \"unterminated}\n");
  const CliRun broken =
      Tokenize("--model " + model + " --input " + dir_.File("broken.jsonl") + " --output " + out);
  EXPECT_EQ(broken.rc, 2) << broken.out;
  EXPECT_THAT(broken.out, HasSubstr(dir_.File("broken.jsonl") + " line 2: not valid JSON"));
}

TEST_F(TokenizeCliTest, IdsBeyondConfigVocabExitTwo) {
  const std::string model = ModelDir(100);  // the tokenizer has 400 pieces
  WriteFile(dir_.File("d.txt"), "the lazy dog\n");
  const CliRun run = Tokenize("--model " + model + " --input " + dir_.File("d.txt") + " --output " +
                              dir_.File("d.bin"));
  EXPECT_EQ(run.rc, 2) << run.out;
  EXPECT_THAT(run.out, HasSubstr(dir_.File("d.txt") + " line 1"));
  EXPECT_THAT(run.out, HasSubstr("vocab_size 100"));
  EXPECT_FALSE(fs::exists(dir_.File("d.bin")));
}

TEST_F(TokenizeCliTest, MissingOrUnreadableInputsExitTwoNamingThem) {
  const std::string model = ModelDir(strata::testing::kTinyVocab);
  WriteFile(dir_.File("data.jsonl"), Jsonl(kRecords));
  const std::string out = " --output " + dir_.File("o.bin");

  CliRun run = Tokenize("--model " + model + " --input " + dir_.File("absent.jsonl") + out);
  EXPECT_EQ(run.rc, 2) << run.out;
  EXPECT_THAT(run.out, HasSubstr(dir_.File("absent.jsonl")));

  WriteFile(dir_.File("data.csv"), "a,b\n");
  run = Tokenize("--model " + model + " --input " + dir_.File("data.csv") + out);
  EXPECT_EQ(run.rc, 2) << run.out;
  EXPECT_THAT(run.out, HasSubstr(dir_.File("data.csv")));
  EXPECT_THAT(run.out, HasSubstr(".jsonl"));

  run = Tokenize("--model " + model + " --input " + dir_.File("data.jsonl") + " --output " +
                 dir_.File("o.npy"));
  EXPECT_EQ(run.rc, 2) << run.out;
  EXPECT_THAT(run.out, HasSubstr(".bin"));

  WriteFile(dir_.File("blank.txt"), "\n\n");
  run = Tokenize("--model " + model + " --input " + dir_.File("blank.txt") + out);
  EXPECT_EQ(run.rc, 2) << run.out;
  EXPECT_THAT(run.out, HasSubstr("no records"));

  // A model directory without config.json, and one whose tokenizer.json transformers refuses.
  fs::remove(model + "/config.json");
  run = Tokenize("--model " + model + " --input " + dir_.File("data.jsonl") + out);
  EXPECT_EQ(run.rc, 2) << run.out;
  EXPECT_THAT(run.out, HasSubstr(model + "/config.json"));
  WriteFile(model + "/config.json", "{\"vocab_size\": 128256}");
  fs::remove(model + "/tokenizer.model");
  WriteFile(model + "/tokenizer.json", "{}");
  run = Tokenize("--model " + model + " --input " + dir_.File("data.jsonl") + out);
  // Bad input (2) where a Python with transformers runs it; where none is found (a build without
  // the project venv, as the sanitizer builds are), a failure (1) that says how to install it.
  if (run.out.find("pip install transformers tokenizers") != std::string::npos) {
    EXPECT_EQ(run.rc, 1) << run.out;
  } else {
    EXPECT_EQ(run.rc, 2) << run.out;
    EXPECT_THAT(run.out, HasSubstr("AutoTokenizer"));
  }
  EXPECT_THAT(run.out, HasSubstr(model));
  EXPECT_FALSE(fs::exists(dir_.File("o.bin")));

  run = Tokenize("--input " + dir_.File("data.jsonl") + out);  // --model is required
  EXPECT_EQ(run.rc, 2) << run.out;
  EXPECT_THAT(run.out, Not(HasSubstr("Segmentation")));
}

}  // namespace
}  // namespace strata::runtime
