// Tokenizer against SentencePiece itself (linked here directly, as the oracle), with the BOS/EOS
// rules of Hugging Face's slow tokenizers, and the errors for directories it cannot read.
#include "runtime/data/tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/data/hf_tokenizer.h"
#include "tests/runtime/data/tiny_tokenizer.h"
#include "tests/testing/scoped_env.h"
#include "tests/testing/temp_dir.h"

namespace strata::runtime {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// One tiny model for the suite; each test copies it into its own directory.
class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    trained_ = new strata::testing::TempDir("strata-tok-model");
    ASSERT_TRUE(trained_->ok());
    const std::string error = strata::testing::TrainTinyTokenizer(trained_->path());
    ASSERT_EQ(error, "");
    sp_ = new sentencepiece::SentencePieceProcessor();
    ASSERT_TRUE(sp_->Load(ModelFile()).ok());
  }
  static void TearDownTestSuite() {
    delete sp_;
    delete trained_;
  }
  static std::string ModelFile() { return trained_->File("tokenizer.model"); }

  void SetUp() override { ASSERT_TRUE(dir_.ok()); }
  // dir_ with tokenizer.model and, unless empty, tokenizer_config.json.
  std::string ModelDir(const std::string& tokenizer_config = "") {
    fs::copy_file(ModelFile(), dir_.File("tokenizer.model"), fs::copy_options::overwrite_existing);
    if (!tokenizer_config.empty()) WriteFile(dir_.File("tokenizer_config.json"), tokenizer_config);
    return dir_.path();
  }
  static std::vector<int32_t> Direct(const std::string& text) {
    std::vector<int> ids;
    EXPECT_TRUE(sp_->Encode(text, &ids).ok());
    return std::vector<int32_t>(ids.begin(), ids.end());
  }
  static std::vector<int32_t> Cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  static strata::testing::TempDir* trained_;
  static sentencepiece::SentencePieceProcessor* sp_;
  strata::testing::TempDir dir_{"strata-tok-test"};
};
strata::testing::TempDir* TokenizerTest::trained_ = nullptr;
sentencepiece::SentencePieceProcessor* TokenizerTest::sp_ = nullptr;

const char* const kTexts[] = {
    "the quick brown fox jumps over the lazy dog.",
    "café naïve über 2024, strata offload\n",
    "  leading spaces and a tab\there",
    "bytes the model never saw: ß → 🙂 and <s> spelled out",
    "",
};

TEST_F(TokenizerTest, EncodeIsSentencePieceWithBosByDefault) {
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::Open(ModelDir());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.vocab_size(), strata::testing::kTinyVocab);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_TRUE(t.add_bos());   // Llama tokenizers: add_bos_token defaults to true
  EXPECT_FALSE(t.add_eos());  // and add_eos_token to false
  EXPECT_EQ(t.model_path(), dir_.File("tokenizer.model"));
  for (const char* text : kTexts) {
    Result<std::vector<int32_t>> ids = t.Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(*ids, Cat({1}, Direct(text))) << text;
    // Byte fallback: everything decodes back, newline and emoji included.
    std::string decoded;
    ASSERT_TRUE(sp_->Decode(std::vector<int>(ids->begin() + 1, ids->end()), &decoded).ok());
    EXPECT_EQ(decoded, text);
  }
  // Special-token text is ordinary text (SentencePiece's behaviour): no id 1 past the front.
  Result<std::vector<int32_t>> ids = t.Encode("<s>");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(std::count(ids->begin(), ids->end(), 1), 1);
}

TEST_F(TokenizerTest, EncodeAppendAppends) {
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::Open(ModelDir());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  std::vector<int32_t> ids = {7};
  ASSERT_TRUE((*tok)->EncodeAppend("the dog", &ids).ok());
  ASSERT_TRUE((*tok)->EncodeAppend("the fox", &ids).ok());
  EXPECT_EQ(ids, Cat(Cat(Cat({7, 1}, Direct("the dog")), {1}), Direct("the fox")));
}

TEST_F(TokenizerTest, TokenizerConfigDecidesBosAndEos) {
  Result<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::Open(ModelDir(R"({"add_bos_token": false, "add_eos_token": true})"));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_FALSE((*tok)->add_bos());
  EXPECT_TRUE((*tok)->add_eos());
  Result<std::vector<int32_t>> ids = (*tok)->Encode("the lazy dog");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, Cat(Direct("the lazy dog"), {2}));

  // Null flags are absent flags; an AddedToken object names the BOS piece.
  tok = Tokenizer::Open(
      ModelDir(R"({"add_bos_token": null, "bos_token": {"content": "<s>", "lstrip": false}})"));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_TRUE((*tok)->add_bos());
  EXPECT_EQ((*tok)->bos_id(), 1);
}

TEST_F(TokenizerTest, BosTokenNullMeansNoBos) {
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::Open(ModelDir(R"({"bos_token": null})"));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->bos_id(), -1);
  EXPECT_FALSE((*tok)->add_bos());
  Result<std::vector<int32_t>> ids = (*tok)->Encode("the dog");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, Direct("the dog"));
}

TEST_F(TokenizerTest, SpecialTokensResolveThroughPiecesOrAddedTokens) {
  // An EOS that is an added token (outside the SentencePiece vocabulary), as in fine-tuned chats.
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::Open(ModelDir(R"({
      "eos_token": "<|end|>", "add_eos_token": true,
      "added_tokens_decoder": {"400": {"content": "<|end|>", "special": true}}})"));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->eos_id(), 400);
  Result<std::vector<int32_t>> ids = (*tok)->Encode("fox");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, Cat(Cat({1}, Direct("fox")), {400}));
  // A piece of the model under another name.
  tok = Tokenizer::Open(ModelDir(R"({"bos_token": "</s>"})"));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->bos_id(), 2);
  // A token that is neither.
  tok = Tokenizer::Open(ModelDir(R"({"bos_token": "<|begin_of_text|>"})"));
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("tokenizer_config.json"));
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("<|begin_of_text|>"));
}

TEST_F(TokenizerTest, BadTokenizerConfigNamesTheFile) {
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::Open(ModelDir("{\"add_bos_token\": tru"));
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(tok.status().message()),
              HasSubstr(dir_.File("tokenizer_config.json") + ": not valid JSON"));
  tok = Tokenizer::Open(ModelDir(R"({"add_bos_token": "yes"})"));
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("\"add_bos_token\""));
}

// tokenizer.json goes to transformers (hf_tokenizer.h); tests/python/test_tokenizers.py checks its
// ids against AutoTokenizer. Here: its errors, which name the directory and say what to install.
TEST_F(TokenizerTest, TokenizerJsonThatTransformersCannotLoadIsInvalidArgument) {
  WriteFile(dir_.File("tokenizer.json"), "{}");
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::Open(dir_.path());
  ASSERT_FALSE(tok.ok());
  if (tok.status().code() == StatusCode::kUnavailable) {
    GTEST_SKIP() << "no Python with transformers here: " << tok.status().message();
  }
  EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument) << tok.status().message();
  const std::string message(tok.status().message());
  EXPECT_THAT(message, HasSubstr(dir_.path()));
  EXPECT_THAT(message, HasSubstr("AutoTokenizer"));
}

TEST_F(TokenizerTest, TokenizerJsonWithoutTransformersSaysHowToInstallIt) {
  WriteFile(dir_.File("tokenizer.json"), "{}");
  strata::testing::ScopedEnv python("STRATA_PYTHON", "/nonexistent/python3");
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::Open(dir_.path());
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kUnavailable);
  const std::string message(tok.status().message());
  EXPECT_THAT(message, HasSubstr(dir_.path()));
  EXPECT_THAT(message, HasSubstr("pip install transformers tokenizers"));
  EXPECT_THAT(message, HasSubstr("/nonexistent/python3"));
  // SentencePiece is still there for a directory that has both files, when asked for.
  fs::copy_file(ModelFile(), dir_.File("tokenizer.model"));
  strata::testing::ScopedEnv backend("STRATA_TOKENIZER", "sentencepiece");
  tok = Tokenizer::Open(dir_.path());
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->backend(), "sentencepiece");
  Result<ChatTokens> chat = (*tok)->EncodeChat(R"({"messages": []})");
  EXPECT_EQ(chat.status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(TokenizerTest, MissingTokenizerIsNotFound) {
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::Open(dir_.path());
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr(dir_.path()));
  tok = Tokenizer::Open(dir_.File("absent"));
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr(dir_.File("absent")));
}

TEST_F(TokenizerTest, CorruptModelIsInvalidArgument) {
  WriteFile(dir_.File("tokenizer.model"), "not a protobuf at all");
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::Open(dir_.path());
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr(dir_.File("tokenizer.model")));
}

}  // namespace
}  // namespace strata::runtime
