// Fine-tuning from text through the user's path: a Llama directory with a SentencePiece
// tokenizer.model (trained here) and a checkpoint written by hand; `strata train --data x.jsonl`
// and `--data x.txt` tokenize with it, and give exactly the losses of training on the .bin that
// `strata tokenize` writes from the same file; prompt/completion SFT records train as the ids
// TRL's SFTTrainer makes of them (tokenized here with SentencePiece itself). No libtorch in this
// process: Debian's libsentencepiece (linked here to train the tokenizer) cannot share a process
// with libtorch.
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>

#include <cstdint>
#include <cstring>
#include <fstream>
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

using strata::testing::WriteTinyLlama;

std::vector<double> Losses(const std::string& log_json) {
  std::vector<double> out;
  std::ifstream in(log_json);
  for (std::string line; std::getline(in, line);) {
    out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  }
  return out;
}

TEST(HfTextCliTest, TextDataTrainsAsItsTokenizedBin) {
  strata::testing::TempDir dir("strata-hf-text");
  ASSERT_TRUE(dir.ok());
  const std::string model = dir.path() + "/model";
  std::filesystem::create_directories(model);
  ASSERT_EQ(strata::testing::TrainTinyTokenizer(model), "");
  WriteTinyLlama(model, strata::testing::kTinyVocab);
  const auto lines = strata::testing::TinyCorpusLines(300);
  {
    std::ofstream jsonl(dir.path() + "/train.jsonl"), txt(dir.path() + "/train.txt");
    for (const std::string& line : lines) {
      jsonl << nlohmann::json({{"text", line}}).dump() << "\n";
      txt << line << "\n";
    }
  }
  const std::string bin = dir.path() + "/train.bin";
  auto r = Shell(std::string(STRATA_BINARY) + " tokenize --model " + model + " --input " +
                 dir.path() + "/train.jsonl --output " + bin);
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::string config = dir.path() + "/ds.json";
  std::ofstream(config) << R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})";
  std::vector<std::vector<double>> runs;
  for (const std::string& data : {bin, dir.path() + "/train.jsonl"}) {
    const std::string log = data + ".log.jsonl";
    r = Shell(std::string(STRATA_BINARY) + " train --quiet --model " + model + " --data " + data +
              " --seq-len 16 --steps 3 --config " + config + " --log-json " + log);
    ASSERT_EQ(r.rc, 0) << data << "\n" << r.out;
    runs.push_back(Losses(log));
  }
  ASSERT_EQ(runs[0].size(), 3u);
  EXPECT_EQ(runs[0], runs[1]);  // the jsonl, tokenized in the run, is the .bin
  // .txt: one record per line, as the jsonl's records; it trains too.
  r = Shell(std::string(STRATA_BINARY) + " train --quiet --model " + model + " --data " +
            dir.path() + "/train.txt --seq-len 16 --steps 1 --config " + config);
  EXPECT_EQ(r.rc, 0) << r.out;
}

// prompt/completion text records are tokenized as TRL's SFTTrainer does: BOS + the pieces of
// prompt + completion + EOS, the prompt being the first 1 + len(pieces of prompt) tokens. Written
// here as prompt_ids/completion_ids with SentencePiece itself, both files train to the same losses.
TEST(HfTextCliTest, PromptCompletionTextTrainsAsTrlTokenizesIt) {
  strata::testing::TempDir dir("strata-hf-sft-text");
  ASSERT_TRUE(dir.ok());
  const std::string model = dir.path() + "/model";
  std::filesystem::create_directories(model);
  ASSERT_EQ(strata::testing::TrainTinyTokenizer(model), "");
  WriteTinyLlama(model, strata::testing::kTinyVocab);
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(model + "/tokenizer.model").ok());
  const auto lines = strata::testing::TinyCorpusLines(24);
  {
    std::ofstream text(dir.path() + "/text.jsonl"), ids(dir.path() + "/ids.jsonl");
    for (size_t i = 0; i + 1 < lines.size(); i += 2) {
      const std::string prompt = "Q: " + lines[i] + "\nA:", completion = " " + lines[i + 1];
      text << nlohmann::json({{"prompt", prompt}, {"completion", completion}}).dump() << "\n";
      std::vector<int> p, whole;
      ASSERT_TRUE(sp.Encode(prompt, &p).ok());
      ASSERT_TRUE(sp.Encode(prompt + completion, &whole).ok());
      p.insert(p.begin(), 1);  // <s>
      whole.insert(whole.begin(), 1);
      whole.push_back(2);  // </s>
      ids << nlohmann::json(
                 {{"prompt_ids", p},
                  {"completion_ids", std::vector<int>(whole.begin() + p.size(), whole.end())}})
                 .dump()
          << "\n";
    }
  }
  const std::string config = dir.path() + "/ds.json";
  std::ofstream(config) << R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})";
  std::vector<std::vector<double>> runs;
  for (const std::string name : {"text", "ids"}) {
    const std::string log = dir.path() + "/" + name + ".log.jsonl";
    const auto r = Shell(std::string(STRATA_BINARY) + " train --quiet --model " + model +
                         " --data " + dir.path() + "/" + name + ".jsonl --seq-len 24 --steps 3 " +
                         "--config " + config + " --log-json " + log);
    ASSERT_EQ(r.rc, 0) << name << "\n" << r.out;
    EXPECT_NE(r.out.find("12 prompt"), std::string::npos) << r.out;
    runs.push_back(Losses(log));
  }
  ASSERT_EQ(runs[0].size(), 3u);
  EXPECT_EQ(runs[0], runs[1]);
  // An empty completion is refused naming the line.
  const std::string bad = dir.path() + "/bad.jsonl";
  std::ofstream(bad) << R"({"prompt": "a", "completion": "b"})"
                     << "\n"
                     << R"({"prompt": "a", "completion": ""})"
                     << "\n";
  const auto r = Shell(std::string(STRATA_BINARY) + " train --quiet --model " + model + " --data " +
                       bad + " --seq-len 24 --steps 1 --config " + config);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find(bad + " line 2: \"completion\" is empty"), std::string::npos) << r.out;
  // A file of "text" records with an SFT record later: one kind per file.
  const std::string mixed = dir.path() + "/mixed.jsonl";
  std::ofstream(mixed) << R"({"text": "a"})"
                       << "\n"
                       << R"({"prompt": "a", "completion": "b"})"
                       << "\n";
  const auto m = Shell(std::string(STRATA_BINARY) + " eval --model " + model + " --data " + mixed +
                       " --seq-len 8");
  EXPECT_EQ(m.rc, 2) << m.out;
  EXPECT_NE(m.out.find(mixed + " line 2: no \"text\" field: a prompt/completion record"),
            std::string::npos)
      << m.out;
}

}  // namespace
}  // namespace strata
