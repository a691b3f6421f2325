// Supervised fine-tuning through the user's path: `strata train` and `strata eval` on .jsonl
// prompt_ids/completion_ids records and a tiny Llama directory written by the independent
// reference (tests/testing/hf_reference.h):
//   - the first step's loss and `strata eval`'s equal the reference's cross-entropy averaged over
//     the completion targets only (masking written here by hand), padded and --packing;
//   - the prompt conditions the loss (changing it changes the loss), the padding id does not;
//   - micro-batch 4 x accumulation 1, 1 x 4 and --nproc 2 give the same losses although their
//     micro-batches hold different numbers of completion tokens; a resumed run is the straight one;
//   - bad records are refused naming the file and the line.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tests/testing/cli_run.h"
#include "tests/testing/hf_reference.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using strata::testing::CliRun;
using strata::testing::LlamaSpec;
using strata::testing::Shell;
using strata::testing::TempDir;

const std::string kStrata = STRATA_BINARY;
constexpr int kSeq = 12;  // rows hold 13 tokens
constexpr int64_t kIgnored = -100;

struct Record {
  std::vector<int64_t> prompt, completion;
};

// `n` records with prompts of 1..7 and completions of 1..6 random ids below `vocab`, and one
// record longer than a row (truncated): micro-batches hold different numbers of completion tokens.
std::vector<Record> RandomRecords(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Record> out(n);
  for (int i = 0; i < n; ++i) {
    const int np = i == 2 ? 9 : 1 + static_cast<int>(rng() % 7);
    const int nc = i == 2 ? 8 : 1 + static_cast<int>(rng() % 6);
    for (int k = 0; k < np; ++k) out[i].prompt.push_back(static_cast<int64_t>(rng() % vocab));
    for (int k = 0; k < nc; ++k) out[i].completion.push_back(static_cast<int64_t>(rng() % vocab));
  }
  return out;
}

void WriteRecords(const std::string& path, const std::vector<Record>& records) {
  std::ofstream out(path);
  for (const Record& r : records) {
    out << nlohmann::json({{"prompt_ids", r.prompt}, {"completion_ids", r.completion}}).dump()
        << "\n";
  }
}

// One row of the model's input and its targets (kIgnored where nothing is trained).
struct Row {
  std::vector<int64_t> x, y;
};

// Padded: each record's first kSeq + 1 tokens; the target of position t is token t + 1 when that
// token is a completion token.
std::vector<Row> PaddedRows(const std::vector<Record>& records, int64_t pad) {
  std::vector<Row> rows;
  for (const Record& r : records) {
    std::vector<int64_t> ids = r.prompt;
    ids.insert(ids.end(), r.completion.begin(), r.completion.end());
    const size_t n = std::min<size_t>(ids.size(), kSeq + 1);
    Row row;
    for (size_t t = 0; t < kSeq; ++t) {
      row.x.push_back(t < n ? ids[t] : pad);
      const bool trained = t + 1 < n && t + 1 >= r.prompt.size();
      row.y.push_back(trained ? ids[t + 1] : kIgnored);
    }
    rows.push_back(row);
  }
  return rows;
}

// Packed: the records concatenated, cut into windows of kSeq + 1 (the tail dropped).
std::vector<Row> PackedRows(const std::vector<Record>& records) {
  std::vector<int64_t> ids;
  std::vector<bool> completion;
  for (const Record& r : records) {
    for (int64_t id : r.prompt) ids.push_back(id), completion.push_back(false);
    for (int64_t id : r.completion) ids.push_back(id), completion.push_back(true);
  }
  std::vector<Row> rows;
  for (size_t b = 0; b + kSeq + 1 <= ids.size(); b += kSeq + 1) {
    Row row;
    for (size_t t = 0; t < kSeq; ++t) {
      row.x.push_back(ids[b + t]);
      row.y.push_back(completion[b + t + 1] ? ids[b + t + 1] : kIgnored);
    }
    rows.push_back(row);
  }
  return rows;
}

// The reference's cross-entropy summed over the trained targets of `rows` (log_softmax in double
// from its fp32 logits), over their count.
double ReferenceLoss(const LlamaSpec& spec, const std::map<std::string, torch::Tensor>& weights,
                     const std::vector<Row>& rows, int64_t* count) {
  double nats = 0;
  *count = 0;
  for (const Row& row : rows) {
    const torch::Tensor logits =
        strata::testing::ReferenceLogits(spec, weights, torch::tensor(row.x).view({1, kSeq}));
    const torch::Tensor logp = torch::log_softmax(logits.to(torch::kDouble), -1);
    for (int t = 0; t < kSeq; ++t) {
      if (row.y[t] == kIgnored) continue;
      nats -= logp[0][t][row.y[t]].item<double>();
      ++*count;
    }
  }
  return nats / static_cast<double>(*count);
}

std::vector<double> Losses(const std::string& log_json) {
  std::vector<double> out;
  for (const nlohmann::json& j : strata::testing::JsonLines(log_json)) {
    out.push_back(j.at("loss").get<double>());
  }
  return out;
}

nlohmann::json LastJson(const std::string& out) {
  const size_t start = out.find("{\n");
  if (start == std::string::npos) return nullptr;
  return nlohmann::json::parse(out.substr(start), nullptr, /*allow_exceptions=*/false);
}

void ExpectClose(double a, double b, double rel, const std::string& what) {
  EXPECT_LE(std::abs(a - b), rel * std::abs(b)) << what << ": " << a << " vs " << b;
}

class SftCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    model_ = dir_.path() + "/model";
    std::filesystem::create_directories(model_);
    weights_ = strata::testing::RandomLlamaWeights(spec_, 11);
    strata::testing::WriteHfCheckpoint(model_, spec_, weights_, "F32", 1);
    SetPadId(7);
    config_ = dir_.path() + "/ds.json";
    std::ofstream(config_) << R"({"train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})";
  }

  // The model's config.json "pad_token_id".
  void SetPadId(int64_t pad) {
    const std::string path = model_ + "/config.json";
    nlohmann::json c = nlohmann::json::parse(strata::testing::ReadFileOrEmpty(path));
    c["pad_token_id"] = pad;
    std::ofstream(path) << c.dump(2);
  }

  // `strata train` on `data` with `micro` x `gas` per rank (and --steps `steps` unless 0); the
  // losses of its steps.
  std::vector<double> Train(const std::string& data, int micro, int gas, int steps,
                            const std::string& extra = "", CliRun* run = nullptr) {
    const std::string log = dir_.path() + "/log-" + std::to_string(++runs_) + ".jsonl";
    const CliRun r =
        Shell(kStrata + " train --quiet --model " + model_ + " --data " + data + " --seq-len " +
              std::to_string(kSeq) + " --config " + config_ + " --micro-batch " +
              std::to_string(micro) + " --grad-accum " + std::to_string(gas) +
              (steps > 0 ? " --steps " + std::to_string(steps) : std::string()) + " --log-json " +
              log + " " + extra);
    EXPECT_EQ(r.rc, 0) << r.out;
    if (run != nullptr) *run = r;
    return Losses(log);
  }

  nlohmann::json Eval(const std::string& data, const std::string& extra = "", int micro = 3) {
    const CliRun r = Shell(kStrata + " eval --model " + model_ + " --data " + data + " --seq-len " +
                           std::to_string(kSeq) + " --json --micro-batch " + std::to_string(micro) +
                           " " + extra);
    EXPECT_EQ(r.rc, 0) << r.out;
    return LastJson(r.out);
  }

  TempDir dir_{"strata-sft-cli"};
  std::string model_, config_;
  LlamaSpec spec_;  // vocab 97, 2 layers
  std::map<std::string, torch::Tensor> weights_;
  int runs_ = 0;
};

TEST_F(SftCliTest, FirstStepAndEvalLossesAreTheCompletionOnlyReference) {
  const std::vector<Record> records = RandomRecords(8, spec_.vocab_size, 1);
  const std::string data = dir_.path() + "/sft.jsonl";
  WriteRecords(data, records);
  int64_t count = 0;
  const double reference = ReferenceLoss(spec_, weights_, PaddedRows(records, 7), &count);
  // The global batch of step 1 (4 x 2 rows) is the whole epoch of 8 records, in any order.
  CliRun run;
  const std::vector<double> losses = Train(data, 4, 2, 2, "", &run);
  ASSERT_EQ(losses.size(), 2u);
  ExpectClose(losses[0], reference, 1e-5, "first step");
  EXPECT_NE(run.out.find("8 prompt_ids/completion_ids records"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("1 truncated to it, cutting 4 completion tokens"), std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("loss on the " + std::to_string(count) + " completion tokens"),
            std::string::npos)
      << run.out;

  const nlohmann::json e = Eval(data);
  ASSERT_TRUE(e.is_object());
  ExpectClose(e.at("loss").get<double>(), reference, 1e-5, "eval");
  EXPECT_EQ(e.at("tokens").get<int64_t>(), count);
  EXPECT_EQ(e.at("windows").get<int64_t>(), 8);

  // A plain mean over every position would be another number: the masking is what is measured.
  int64_t all = 0;
  std::vector<Row> unmasked = PaddedRows(records, 7);
  for (Row& row : unmasked) {
    for (int t = 0; t < kSeq; ++t) row.y[t] = t + 1 < kSeq ? row.x[t + 1] : row.x[t];
  }
  EXPECT_GT(std::abs(ReferenceLoss(spec_, weights_, unmasked, &all) - reference), 1e-3);
}

TEST_F(SftCliTest, ThePromptChangesTheLossThePaddingIdDoesNot) {
  std::vector<Record> records = RandomRecords(8, spec_.vocab_size, 2);
  const std::string data = dir_.path() + "/a.jsonl";
  WriteRecords(data, records);
  const std::vector<double> base = Train(data, 4, 2, 1);
  const nlohmann::json base_eval = Eval(data);
  ASSERT_EQ(base.size(), 1u);

  // Another padding id: padded inputs come after every trained position.
  SetPadId(42);
  const std::vector<double> repadded = Train(data, 4, 2, 1);
  ASSERT_EQ(repadded.size(), 1u);
  EXPECT_EQ(repadded[0], base[0]);
  EXPECT_EQ(Eval(data).at("loss"), base_eval.at("loss"));
  int64_t count = 0;
  ExpectClose(repadded[0], ReferenceLoss(spec_, weights_, PaddedRows(records, 42), &count), 1e-5,
              "pad 42");

  // Other prompt tokens, the same completions: the loss is conditioned on the prompt.
  for (Record& r : records) {
    for (int64_t& id : r.prompt) id = (id + 1) % spec_.vocab_size;
  }
  const std::string other = dir_.path() + "/b.jsonl";
  WriteRecords(other, records);
  const std::vector<double> reprompted = Train(other, 4, 2, 1);
  ASSERT_EQ(reprompted.size(), 1u);
  EXPECT_GT(std::abs(reprompted[0] - base[0]), 1e-4 * base[0]);
  ExpectClose(reprompted[0], ReferenceLoss(spec_, weights_, PaddedRows(records, 42), &count), 1e-5,
              "other prompts");
}

TEST_F(SftCliTest, EverySplitOfTheGlobalBatchGivesTheSameLosses) {
  const std::string data = dir_.path() + "/sft.jsonl";
  WriteRecords(data, RandomRecords(16, spec_.vocab_size, 3));
  const std::vector<double> one = Train(data, 4, 1, 5);
  ASSERT_EQ(one.size(), 5u);
  EXPECT_NE(one.front(), one.back());  // it trains
  const std::vector<double> accumulated = Train(data, 1, 4, 5);
  ASSERT_EQ(accumulated.size(), 5u);
  for (size_t i = 0; i < one.size(); ++i) {
    // Only the order of fp32 sums differs.
    ExpectClose(accumulated[i], one[i], 1e-6, "1 x 4, step " + std::to_string(i + 1));
  }
  if (STRATA_HAVE_GLOO) {  // ranks meet through c10d's Gloo
    const std::vector<double> ranks = Train(data, 1, 2, 5, "--nproc 2");
    ASSERT_EQ(ranks.size(), 5u);
    for (size_t i = 0; i < one.size(); ++i) {
      ExpectClose(ranks[i], one[i], 1e-6, "2 ranks, step " + std::to_string(i + 1));
    }
  }
  // Packed too.
  const std::vector<double> packed = Train(data, 2, 1, 4, "--packing");
  const std::vector<double> packed_split = Train(data, 1, 2, 4, "--packing");
  ASSERT_EQ(packed.size(), 4u);
  ASSERT_EQ(packed_split.size(), 4u);
  for (size_t i = 0; i < packed.size(); ++i) {
    ExpectClose(packed_split[i], packed[i], 1e-6, "packed 1 x 2, step " + std::to_string(i + 1));
  }
}

TEST_F(SftCliTest, AResumedRunIsTheStraightRun) {
  const std::string data = dir_.path() + "/sft.jsonl";
  WriteRecords(data, RandomRecords(6, spec_.vocab_size, 4));
  // 6 records in global batches of 4: epochs end inside steps, every epoch shuffled anew.
  const std::vector<double> straight = Train(data, 2, 2, 4);
  const std::string ck = dir_.path() + "/ck";
  const std::vector<double> first = Train(data, 2, 2, 2, "--save " + ck);
  const std::vector<double> rest = Train(data, 2, 2, 4, "--resume " + ck);
  ASSERT_EQ(straight.size(), 4u);
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(first[0], straight[0]);
  EXPECT_EQ(first[1], straight[1]);
  EXPECT_EQ(rest[0], straight[2]);
  EXPECT_EQ(rest[1], straight[3]);
}

// Evaluation during training reads SFT records through the same evaluator, and an epoch of padded
// records is one sample per record.
TEST_F(SftCliTest, EvalDuringTrainingAndEpochsCountRecords) {
  const std::string data = dir_.path() + "/sft.jsonl", eval = dir_.path() + "/eval.jsonl";
  WriteRecords(data, RandomRecords(8, spec_.vocab_size, 7));
  WriteRecords(eval, RandomRecords(5, spec_.vocab_size, 8));
  const std::string ck = dir_.path() + "/ck";
  CliRun run;
  // 8 records in global batches of 4: --epochs 2 is 4 steps.
  const std::vector<double> losses =
      Train(data, 2, 2, 0, "--epochs 2 --eval-data " + eval + " --save " + ck, &run);
  ASSERT_EQ(losses.size(), 4u) << run.out;
  const nlohmann::json t = nlohmann::json::parse(
      strata::testing::ReadFileOrEmpty(ck + "/step-4/trainer.json"), nullptr, false);
  ASSERT_TRUE(t.is_object() && t.contains("eval")) << t;
  const nlohmann::json e = Eval(eval, "--resume " + ck, 2);  // batches as the run's
  ASSERT_TRUE(e.is_object());
  EXPECT_DOUBLE_EQ(e.at("loss").get<double>(), t["eval"]["loss"].get<double>());
  int64_t count = 0;
  ReferenceLoss(spec_, weights_, PaddedRows(RandomRecords(5, spec_.vocab_size, 8), 7), &count);
  EXPECT_EQ(e.at("tokens").get<int64_t>(), count);
}

TEST_F(SftCliTest, PackedLossesAreTheReferenceOverPackedWindows) {
  const std::vector<Record> records = RandomRecords(10, spec_.vocab_size, 5);
  const std::string data = dir_.path() + "/sft.jsonl";
  WriteRecords(data, records);
  const std::vector<Row> windows = PackedRows(records);
  ASSERT_GE(windows.size(), 3u);
  int64_t count = 0;
  const double reference = ReferenceLoss(spec_, weights_, windows, &count);
  // One step over every window.
  CliRun run;
  const std::vector<double> losses =
      Train(data, static_cast<int>(windows.size()), 1, 1, "--packing", &run);
  ASSERT_EQ(losses.size(), 1u);
  ExpectClose(losses[0], reference, 1e-5, "packed first step");
  EXPECT_NE(run.out.find("packed into " + std::to_string(windows.size()) + " windows"),
            std::string::npos)
      << run.out;
  const nlohmann::json e = Eval(data, "--packing");
  ASSERT_TRUE(e.is_object());
  ExpectClose(e.at("loss").get<double>(), reference, 1e-5, "packed eval");
  EXPECT_EQ(e.at("tokens").get<int64_t>(), count);
  // Padded, the same file is another set of rows.
  int64_t padded_count = 0;
  ReferenceLoss(spec_, weights_, PaddedRows(records, 7), &padded_count);
  EXPECT_EQ(Eval(data).at("tokens").get<int64_t>(), padded_count);
}

TEST_F(SftCliTest, BadRecordsAreRefusedNamingTheFileAndLine) {
  const std::string ok = R"({"prompt_ids": [1, 2], "completion_ids": [3, 4]})";
  struct Case {
    std::string second_line, says;
  };
  const std::vector<Case> cases = {
      {R"({"prompt_ids": [1, 2]})", "no \"completion_ids\" field"},
      {R"({"completion_ids": [1, 2]})", "no \"prompt_ids\" field"},
      {R"({"prompt_ids": [1], "completion_ids": []})", "\"completion_ids\" is empty"},
      {R"({"prompt_ids": [1], "completion_ids": [5, 97]})",
       "\"completion_ids\"[1] is 97, not in [0, the model's vocab_size 97)"},
      {R"({"prompt_ids": [-1], "completion_ids": [5]})", "\"prompt_ids\"[0] is -1"},
      {R"({"prompt_ids": [1], "completion_ids": ["a"]})", "not a token id"},
      {R"({"text": "plain text"})", "a \"text\" record, but line 1 is a prompt_ids/completion_ids"},
      {R"({"prompt": "a", "completion": "b"})", "a prompt/completion record, but line 1"},
      {R"([1, 2])", "expected a JSON object"},
      {R"({"prompt_ids": [1], )", "line 2"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string data = dir_.path() + "/bad" + std::to_string(++i) + ".jsonl";
    std::ofstream(data) << ok << "\n" << c.second_line << "\n";
    const CliRun r = Shell(kStrata + " train --quiet --model " + model_ + " --data " + data +
                           " --seq-len 8 --steps 1");
    EXPECT_EQ(r.rc, 2) << c.second_line << "\n" << r.out;
    EXPECT_NE(r.out.find(data + " line 2"), std::string::npos) << c.second_line << "\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.second_line << "\n" << r.out;
  }
  CliRun r;
  // Text records on a model without tokenizer.model.
  const std::string text = dir_.path() + "/text.jsonl";
  std::ofstream(text) << R"({"prompt": "a", "completion": "b"})"
                      << "\n";
  r = Shell(kStrata + " train --quiet --model " + model_ + " --data " + text +
            " --seq-len 8 --steps 1");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("tokenizer.model"), std::string::npos) << r.out;
  // --packing is for SFT records.
  const std::string bin = dir_.path() + "/ids.bin";
  std::vector<uint16_t> ids(100, 5);
  std::ofstream(bin, std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), 200);
  r = Shell(kStrata + " train --quiet --model " + model_ + " --data " + bin +
            " --seq-len 8 --steps 1 --packing");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--packing is for SFT data"), std::string::npos) << r.out;
}

// prompt_ids/completion_ids records train presets too (the byte-level GPT: vocabulary 256).
TEST(SftPresetCliTest, AGptPresetTrainsOnIdRecords) {
  TempDir dir("strata-sft-gpt");
  ASSERT_TRUE(dir.ok());
  const std::string data = dir.File("sft.jsonl");
  WriteRecords(data, RandomRecords(8, 256, 6));
  const CliRun r =
      Shell(kStrata + " train --model tiny --data " + data +
            " --seq-len 12 --steps 2 --micro-batch 2 --log-json " + dir.File("log.jsonl"));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("8 prompt_ids/completion_ids records"), std::string::npos) << r.out;
  EXPECT_EQ(Losses(dir.File("log.jsonl")).size(), 2u);
}

}  // namespace
}  // namespace strata
