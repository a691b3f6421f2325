// `strata generate --prompt TEXT` on a Llama directory with a SentencePiece tokenizer.model
// (trained here): the prompt's ids are what SentencePiece itself gives (BOS first, as
// transformers' tokenizer(text) does), the text is SentencePiece's decoding of the new ids, and the
// tokenizer's EOS is the one generation stops at. No libtorch in this process: Debian's
// libsentencepiece (linked here as the oracle) cannot share a process with libtorch.
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/runtime/data/tiny_tokenizer.h"
#include "tests/testing/cli_run.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_llama_checkpoint.h"

namespace strata {
namespace {

using strata::testing::Shell;

TEST(GenerateTextCliTest, PromptAndTextGoThroughTheModelsTokenizer) {
  strata::testing::TempDir dir("strata-generate-text");
  ASSERT_TRUE(dir.ok());
  const std::string model = dir.path() + "/model";
  std::filesystem::create_directories(model);
  ASSERT_EQ(strata::testing::TrainTinyTokenizer(model), "");
  strata::testing::WriteTinyLlama(model, strata::testing::kTinyVocab);
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(model + "/tokenizer.model").ok());

  const std::string prompt = "the quick brown fox";
  const auto r = Shell(std::string(STRATA_BINARY) + " generate --json --threads 1 --model " +
                       model + " --prompt '" + prompt + "' --max-new-tokens 6 2>/dev/null");
  ASSERT_EQ(r.rc, 0) << r.out;
  const nlohmann::json out = nlohmann::json::parse(r.out);
  std::vector<int> expected_prompt = {sp.bos_id()};
  for (int id : sp.EncodeAsIds(prompt)) expected_prompt.push_back(id);
  EXPECT_EQ(out["prompt_ids"].get<std::vector<int>>(), expected_prompt);
  const std::vector<int> ids = out["ids"].get<std::vector<int>>();
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(out["text"].get<std::string>(), sp.DecodeIds(ids));
  EXPECT_EQ(out["eos_source"], "tokenizer.model");
  EXPECT_EQ(out["eos_ids"], nlohmann::json::array({sp.eos_id()}));
  // It stopped at the EOS (kept as the last id) or after the 6 tokens.
  if (out["stop_reason"] == "eos") {
    EXPECT_EQ(ids.back(), sp.eos_id());
  } else {
    EXPECT_EQ(out["stop_reason"], "max_new_tokens");
    EXPECT_EQ(ids.size(), 6u);
  }
}

}  // namespace
}  // namespace strata
