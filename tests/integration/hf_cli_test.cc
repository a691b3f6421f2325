// Hugging Face models through the user's path: the `strata` binary on checkpoints written by the
// independent reference (tests/testing/hf_reference.h) and token files written here.
//   - `strata eval` gives the reference's loss (relative 1e-5, fp32) with and without offload;
//   - `strata train` of a Llama gives the same losses with no offload, optimizer on NVMe, and
//     parameters + optimizer on NVMe with tight budgets; GPT presets with and without offload_param
//     too (initialization does not depend on the order units are taken);
//   - `--steps 0 --export` re-exports the input tensors byte for byte, with config.json and the
//     tokenizer files; after training, the export evaluates to the loss of the checkpoint the run
//     saved;
//   - bad model directories and data exit 2 naming the file.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/persist/hf_checkpoint.h"
#include "tests/testing/cli_data.h"
#include "tests/testing/cli_run.h"
#include "tests/testing/hf_reference.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using strata::testing::EvalWindows;
using strata::testing::LastJson;
using strata::testing::WriteTokens;

using strata::testing::CliRun;
using strata::testing::LlamaSpec;
using strata::testing::Shell;
using strata::testing::TempDir;

const std::string kStrata = STRATA_BINARY;

std::string WriteConfig(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// Offload configs: none, optimizer on NVMe, params + optimizer on NVMe with tight budgets.
std::vector<std::pair<std::string, std::string>> OffloadConfigs(const std::string& dir) {
  const std::string opt = R"("train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}})";
  return {
      {"none", WriteConfig(dir, "none.json", "{" + opt + "}")},
      {"optimizer_nvme",
       WriteConfig(dir, "opt.json",
                   "{" + opt + R"(, "zero_optimization": {"stage": 2, "offload_optimizer":
                   {"device": "nvme", "nvme_path": ")" +
                       dir + R"(/swap"}}})")},
      {"all_nvme_tight",
       WriteConfig(dir, "all.json",
                   "{" + opt + R"(, "zero_optimization": {"stage": 3, "sub_group_size": 5000,
                   "stage3_param_persistence_threshold": 100, "stage3_max_live_parameters": 30000,
                   "stage3_prefetch_bucket_size": 20000,
                   "offload_param": {"device": "nvme", "nvme_path": ")" +
                       dir +
                       R"(/swap", "buffer_count": 2},
                   "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                       dir + R"(/swap"}}})")},
  };
}

std::vector<double> Losses(const std::string& log_json) {
  std::vector<double> out;
  std::ifstream in(log_json);
  std::string line;
  while (std::getline(in, line))
    out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return out;
}

class HfCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    model_ = dir_.path() + "/model";
    std::filesystem::create_directories(model_);
    spec_.vocab_size = 300;  // uint16 ids
    spec_.num_hidden_layers = 3;
  }
  void WriteModel(const std::string& dtype, int shards) {
    weights_ = strata::testing::RandomLlamaWeights(spec_, 5);
    strata::testing::WriteHfCheckpoint(model_, spec_, weights_, dtype, shards);
    loaded_ = strata::testing::RoundTripWeights(weights_, dtype);
  }

  TempDir dir_{"strata-hf-cli"};
  std::string model_;
  LlamaSpec spec_;
  std::map<std::string, torch::Tensor> weights_, loaded_;
};

TEST_F(HfCliTest, EvalMatchesTheReferenceWithAndWithoutOffload) {
  for (const std::string arch : {"LlamaForCausalLM", "Qwen2ForCausalLM"}) {
    spec_.architecture = arch;
    spec_.tie_word_embeddings = arch == "Qwen2ForCausalLM";
    std::filesystem::remove_all(model_);
    std::filesystem::create_directories(model_);
    WriteModel("BF16", 2);
    const std::string data = dir_.path() + "/eval.bin";
    const auto ids = WriteTokens(data, 16 * 17 + 9, spec_.vocab_size, 3);  // 16 windows + a tail
    const double reference = strata::testing::ReferenceLoss(spec_, loaded_, EvalWindows(ids, 16));
    for (const auto& [label, config] : OffloadConfigs(dir_.path())) {
      const CliRun r = Shell(kStrata + " eval --model " + model_ + " --data " + data +
                             " --seq-len 16 --json --config " + config);
      ASSERT_EQ(r.rc, 0) << arch << " " << label << "\n" << r.out;
      const nlohmann::json j = LastJson(r.out);
      ASSERT_TRUE(j.is_object()) << r.out;
      EXPECT_EQ(j.at("tokens").get<uint64_t>(), 16u * 16u);
      const double loss = j.at("loss").get<double>();
      EXPECT_LE(std::abs(loss - reference) / reference, 1e-5)
          << arch << " " << label << ": " << loss << " vs " << reference;
      EXPECT_NEAR(j.at("perplexity").get<double>(), std::exp(loss), 1e-9 * std::exp(loss));
    }
  }
}

TEST_F(HfCliTest, FineTuneLossesAreTheSameInEveryOffloadMode) {
  WriteModel("F32", 1);
  const std::string data = dir_.path() + "/train.bin";
  WriteTokens(data, 4000, spec_.vocab_size, 9);
  std::vector<double> first;
  for (const auto& [label, config] : OffloadConfigs(dir_.path())) {
    const std::string log = dir_.path() + "/" + label + ".jsonl";
    const CliRun r = Shell(kStrata + " train --quiet --model " + model_ + " --data " + data +
                           " --seq-len 16 --steps 10 --config " + config + " --log-json " + log +
                           (label == "all_nvme_tight" ? " --device-memory 400K" : ""));
    ASSERT_EQ(r.rc, 0) << label << "\n" << r.out;
    const std::vector<double> losses = Losses(log);
    ASSERT_EQ(losses.size(), 10u) << label;
    EXPECT_LT(losses.back(), losses.front()) << label;  // it learns
    if (first.empty()) {
      first = losses;
      continue;
    }
    // No offload updates with torch::optim, whose sqrt (MKL's vector math in pip's libtorch) is
    // not IEEE's: the modes agree to a few ulps, not bitwise (README "Exactness").
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(losses[i], first[i], 1e-5 * std::abs(first[i])) << label << " step " << i + 1;
    }
  }
}

TEST(GptCliTest, PresetLossesDoNotDependOnParameterOffload) {
  TempDir dir("strata-gpt-cli");
  ASSERT_TRUE(dir.ok());
  const std::string base = R"({"train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 3, )";
  const std::string with_params =
      WriteConfig(dir.path(), "p.json",
                  base + R"("offload_param": {"device": "nvme", "nvme_path": ")" + dir.path() +
                      R"("}, "offload_optimizer": {"device": "cpu"}}})");
  const std::string without =
      WriteConfig(dir.path(), "o.json", base + R"("offload_optimizer": {"device": "cpu"}}})");
  std::vector<std::vector<double>> runs;
  for (const std::string& config : {with_params, without}) {
    const std::string log = config + ".jsonl";
    const CliRun r = Shell(kStrata + " train --quiet --model tiny --steps 4 --config " + config +
                           " --log-json " + log);
    ASSERT_EQ(r.rc, 0) << r.out;
    runs.push_back(Losses(log));
  }
  ASSERT_EQ(runs[0].size(), 4u);
  for (size_t i = 0; i < runs[0].size(); ++i) EXPECT_EQ(runs[0][i], runs[1][i]) << "step " << i + 1;
}

TEST_F(HfCliTest, ZeroStepExportReproducesTheInputBytes) {
  spec_.tie_word_embeddings = true;
  WriteModel("BF16", 2);
  std::ofstream(model_ + "/tokenizer_config.json") << R"({"add_bos_token": true})";
  std::ofstream(model_ + "/tokenizer.model") << "not really a sentencepiece model";
  const std::string data = dir_.path() + "/d.bin";
  WriteTokens(data, 500, spec_.vocab_size, 1);
  const std::string out = dir_.path() + "/export";
  const CliRun r = Shell(kStrata + " train --quiet --model " + model_ + " --data " + data +
                         " --seq-len 16 --steps 0 --export " + out);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto in = runtime::HfCheckpoint::Open(model_);
  auto exported = runtime::HfCheckpoint::Open(out);
  ASSERT_TRUE(in.ok() && exported.ok()) << r.out;
  ASSERT_EQ((*in)->tensors().size(), (*exported)->tensors().size());
  for (const auto& t : (*in)->tensors()) {
    const runtime::HfTensorInfo* e = (*exported)->Find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    EXPECT_EQ(e->dtype, t.dtype) << t.name;
    EXPECT_EQ(e->shape, t.shape) << t.name;
    std::string a(t.end - t.begin, '\0'), b(e->end - e->begin, '\0');
    ASSERT_TRUE((*in)->ReadRaw(t.name, a.data()).ok());
    ASSERT_TRUE((*exported)->ReadRaw(t.name, b.data()).ok());
    EXPECT_TRUE(a == b) << t.name << " differs";
  }
  EXPECT_EQ((*exported)->Find("lm_head.weight"), nullptr);  // tied: not in the files
  std::ifstream config(out + "/config.json");
  const nlohmann::json c = nlohmann::json::parse(config);
  EXPECT_EQ(c.at("torch_dtype"), "bfloat16");
  EXPECT_EQ(c.at("tie_word_embeddings"), true);
  EXPECT_TRUE(std::filesystem::exists(out + "/tokenizer.model"));
  EXPECT_TRUE(std::filesystem::exists(out + "/tokenizer_config.json"));
}

// A config that ties the head over weights that also hold an lm_head.weight: transformers keeps
// the file's head (untied, with a warning) when its values differ from the embedding's, and ties
// when they are equal. eval, the export and estimate follow.
TEST_F(HfCliTest, ATiedConfigOverADistinctHeadUsesTheFilesHeadAsTransformersDo) {
  LlamaSpec untied = spec_;
  untied.tie_word_embeddings = false;
  std::map<std::string, torch::Tensor> weights = strata::testing::RandomLlamaWeights(untied, 8);
  spec_.tie_word_embeddings = true;  // config.json says tied; the files hold a head of their own
  strata::testing::WriteHfCheckpoint(model_, spec_, weights, "F32", 1);
  const std::string data = dir_.path() + "/eval.bin";
  const auto ids = WriteTokens(data, 8 * 17, spec_.vocab_size, 6);
  const double untied_loss = strata::testing::ReferenceLoss(untied, weights, EvalWindows(ids, 16));
  const double tied_loss = strata::testing::ReferenceLoss(spec_, weights, EvalWindows(ids, 16));
  ASSERT_GT(std::abs(untied_loss - tied_loss), 1e-3) << "the heads must tell apart";
  const std::string config = OffloadConfigs(dir_.path())[2].second;  // everything on NVMe

  CliRun r = Shell(kStrata + " eval --model " + model_ + " --data " + data +
                   " --seq-len 16 --json --config " + config);
  ASSERT_EQ(r.rc, 0) << r.out;
  double loss = LastJson(r.out).at("loss").get<double>();
  EXPECT_LE(std::abs(loss - untied_loss) / untied_loss, 1e-5) << loss << " vs " << untied_loss;
  EXPECT_NE(r.out.find("an lm_head.weight with other values: using that head, untied"),
            std::string::npos)
      << r.out;

  // The export keeps the head and says it is untied; it evaluates to the same loss.
  const std::string out = dir_.path() + "/export";
  r = Shell(kStrata + " train --quiet --model " + model_ + " --data " + data +
            " --seq-len 16 --steps 0 --export " + out);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto exported = runtime::HfCheckpoint::Open(out);
  ASSERT_TRUE(exported.ok()) << r.out;
  EXPECT_NE((*exported)->Find("lm_head.weight"), nullptr);
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(out + "/config.json")).at("tie_word_embeddings"),
            false);
  r = Shell(kStrata + " eval --model " + out + " --data " + data +
            " --seq-len 16 --json --config " + config);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(LastJson(r.out).at("loss").get<double>(), loss);

  // estimate counts the head train builds.
  r = Shell(kStrata + " estimate --json --model " + model_ + " --seq-len 16");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(LastJson(r.out).at("model").at("tie_word_embeddings"), false) << r.out;

  // A head equal to the embedding is tied, as transformers ties it: the tied reference's loss.
  weights["lm_head.weight"] = weights.at("model.embed_tokens.weight").clone();
  std::filesystem::remove_all(model_);
  strata::testing::WriteHfCheckpoint(model_, spec_, weights, "F32", 1);
  r = Shell(kStrata + " eval --model " + model_ + " --data " + data +
            " --seq-len 16 --json --config " + config);
  ASSERT_EQ(r.rc, 0) << r.out;
  loss = LastJson(r.out).at("loss").get<double>();
  EXPECT_LE(std::abs(loss - tied_loss) / tied_loss, 1e-5) << loss << " vs " << tied_loss;
  EXPECT_EQ(r.out.find("using that head, untied"), std::string::npos) << r.out;
}

TEST_F(HfCliTest, TrainedExportEvaluatesToTheSavedCheckpointsLoss) {
  WriteModel("F32", 1);
  const std::string data = dir_.path() + "/d.bin";
  WriteTokens(data, 3000, spec_.vocab_size, 4);
  const std::string config = OffloadConfigs(dir_.path())[2].second;  // everything on NVMe
  const std::string out = dir_.path() + "/export", save = dir_.path() + "/ckpt";
  CliRun r = Shell(kStrata + " train --quiet --model " + model_ + " --data " + data +
                   " --seq-len 16 --steps 3 --config " + config + " --save " + save + " --export " +
                   out + " --max-shard-size 20KB");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(out + "/model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(save + "/hf/config.json"));
  const std::string eval = " --data " + data + " --seq-len 16 --micro-batch 2 --json";
  r = Shell(kStrata + " eval --model " + out + eval);
  ASSERT_EQ(r.rc, 0) << r.out;
  const double exported = LastJson(r.out).at("loss").get<double>();
  r = Shell(kStrata + " eval --model " + model_ + eval + " --config " + config + " --resume " +
            save);
  ASSERT_EQ(r.rc, 0) << r.out;
  const double engine = LastJson(r.out).at("loss").get<double>();
  r = Shell(kStrata + " eval --model " + model_ + eval);
  ASSERT_EQ(r.rc, 0) << r.out;
  const double untrained = LastJson(r.out).at("loss").get<double>();
  EXPECT_EQ(exported, engine);
  EXPECT_NE(exported, untrained);
}

// A fine-tune stopped after 2 steps and resumed from its checkpoint continues with the losses of
// the straight run: the data position (windows drawn) is in the checkpoint.
TEST_F(HfCliTest, ResumedFineTuneSeesTheSameBatches) {
  WriteModel("BF16", 1);
  const std::string data = dir_.path() + "/d.bin";
  WriteTokens(data, 3000, spec_.vocab_size, 8);
  const std::string config = OffloadConfigs(dir_.path())[1].second;  // optimizer on NVMe
  const std::string common = kStrata + " train --quiet --model " + model_ + " --data " + data +
                             " --seq-len 16 --config " + config;
  CliRun r = Shell(common + " --steps 4 --log-json " + dir_.path() + "/straight.jsonl");
  ASSERT_EQ(r.rc, 0) << r.out;
  r = Shell(common + " --steps 2 --save " + dir_.path() + "/ck --log-json " + dir_.path() +
            "/first.jsonl");
  ASSERT_EQ(r.rc, 0) << r.out;
  r = Shell(common + " --steps 4 --resume " + dir_.path() + "/ck --log-json " + dir_.path() +
            "/second.jsonl");
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::vector<double> straight = Losses(dir_.path() + "/straight.jsonl");
  std::vector<double> resumed = Losses(dir_.path() + "/first.jsonl");
  for (double l : Losses(dir_.path() + "/second.jsonl")) resumed.push_back(l);
  ASSERT_EQ(straight.size(), 4u);
  EXPECT_EQ(resumed, straight);
}

TEST_F(HfCliTest, BadModelDirectoriesAndDataExitTwoNamingTheFile) {
  WriteModel("F32", 1);
  const std::string data = dir_.path() + "/d.bin";
  WriteTokens(data, 500, spec_.vocab_size, 1);
  // A token id out of the vocabulary.
  const std::string bad = dir_.path() + "/bad.bin";
  std::vector<uint16_t> ids(100, 7);
  ids[42] = 4000;
  std::ofstream(bad, std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), 200);
  CliRun r = Shell(kStrata + " eval --model " + model_ + " --data " + bad + " --seq-len 8");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("bad.bin"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("42"), std::string::npos) << r.out;
  // A directory without weights.
  const std::string empty = dir_.path() + "/empty";
  std::filesystem::create_directories(empty);
  std::filesystem::copy_file(model_ + "/config.json", empty + "/config.json");
  r = Shell(kStrata + " train --model " + empty + " --data " + data + " --seq-len 8 --steps 1");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("model.safetensors"), std::string::npos) << r.out;
  // A Hugging Face model without --data.
  r = Shell(kStrata + " train --model " + model_ + " --steps 1");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--data"), std::string::npos) << r.out;
  // --export of a GPT preset fails before training.
  r = Shell(kStrata + " train --model tiny --steps 1 --export " + dir_.path() + "/x");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("GPT"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 1"), std::string::npos) << r.out;
}

// --export or --save never write over the model being trained: an export directory that is, is
// inside, or contains the input directory is refused before training, the input untouched.
TEST_F(HfCliTest, ExportsNeverOverwriteTheInputModel) {
  WriteModel("F32", 1);
  const std::string data = dir_.path() + "/d.bin";
  WriteTokens(data, 500, spec_.vocab_size, 1);
  const std::string before = strata::testing::ReadFileOrEmpty(model_ + "/model.safetensors");
  ASSERT_FALSE(before.empty());
  const std::string train =
      kStrata + " train --model " + model_ + " --data " + data + " --seq-len 8 --quiet";
  struct Case {
    std::string flags, says;
  } cases[] = {
      {"--steps 1 --export " + model_, "is the input model directory"},
      {"--steps 1 --export " + model_ + "/", "is the input model directory"},
      {"--steps 1 --export " + model_ + "/out", "is inside the input model directory"},
      {"--steps 1 --export " + dir_.path(), "contains the input model directory"},
      {"--steps 0 --export " + model_ + "/../model", "is the input model directory"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags);
    CliRun r = Shell(train + " " + c.flags);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("step 1 "), std::string::npos) << r.out;
  }
  // A model directory that is a previous save's hf/: --save there would export over it.
  const std::string saved = dir_.path() + "/run";
  std::filesystem::create_directories(saved);
  std::filesystem::rename(model_, saved + "/hf");
  CliRun r = Shell(kStrata + " train --model " + saved + "/hf --data " + data +
                   " --seq-len 8 --steps 1 --quiet --save " + saved);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--save"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the input model directory"), std::string::npos) << r.out;
  EXPECT_TRUE(strata::testing::ReadFileOrEmpty(saved + "/hf/model.safetensors") == before);
}

// --save writes DIR/hf/ as --export would, honouring --export-dtype (the input is F32 here).
TEST_F(HfCliTest, SaveExportsInTheExportDtype) {
  WriteModel("F32", 1);
  const std::string data = dir_.path() + "/d.bin";
  WriteTokens(data, 500, spec_.vocab_size, 1);
  const std::string train = kStrata + " train --model " + model_ + " --data " + data +
                            " --seq-len 8 --steps 1 --quiet --save ";
  auto dtypes = [](const std::string& file) {
    const std::string bytes = strata::testing::ReadFileOrEmpty(file);
    std::set<std::string> out;
    if (bytes.size() < 8) return out;
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[i]);
    if (8 + n > bytes.size()) return out;
    const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
    for (auto& [name, t] : header.items()) {
      if (name != "__metadata__") out.insert(t.at("dtype").get<std::string>());
    }
    return out;
  };
  CliRun as_input = Shell(train + dir_.path() + "/a");
  ASSERT_EQ(as_input.rc, 0) << as_input.out;
  EXPECT_EQ(dtypes(dir_.path() + "/a/hf/model.safetensors"), std::set<std::string>{"F32"});
  CliRun bf16 = Shell(train + dir_.path() + "/b --export-dtype bf16");
  ASSERT_EQ(bf16.rc, 0) << bf16.out;
  EXPECT_EQ(dtypes(dir_.path() + "/b/hf/model.safetensors"), std::set<std::string>{"BF16"});
  EXPECT_NE(strata::testing::ReadFileOrEmpty(dir_.path() + "/b/hf/config.json").find("bfloat16"),
            std::string::npos);
}

// Shapes no tensor can have and weight files that are no files are refused with exit 2, naming
// the key or the file, never by an allocation failure or a libtorch backtrace.
TEST_F(HfCliTest, AbsurdConfigsAndWeightLinksToDevicesAreRefused) {
  WriteModel("F32", 1);
  const std::string data = dir_.path() + "/d.bin";
  WriteTokens(data, 500, spec_.vocab_size, 1);
  const nlohmann::json config =
      nlohmann::json::parse(strata::testing::ReadFileOrEmpty(model_ + "/config.json"));
  struct Edit {
    const char* key;
    nlohmann::json value;
    const char* says;
  } edits[] = {{"vocab_size", int64_t{1} << 31, "vocab_size is 2147483648"},
               {"vocab_size", int64_t{1} << 40, "vocab_size"},
               {"max_position_embeddings", 0, "max_position_embeddings is 0"},
               {"hidden_size", int64_t{1} << 34, "hidden_size"}};
  for (const Edit& e : edits) {
    SCOPED_TRACE(std::string(e.key) + "=" + e.value.dump());
    nlohmann::json edited = config;
    edited[e.key] = e.value;
    std::ofstream(model_ + "/config.json") << edited.dump(1);
    for (const char* cmd : {"train --steps 1", "eval"}) {
      CliRun r =
          Shell(kStrata + " " + cmd + " --model " + model_ + " --data " + data + " --seq-len 8");
      EXPECT_EQ(r.rc, 2) << r.out;
      EXPECT_NE(r.out.find(e.says), std::string::npos) << r.out;
      EXPECT_EQ(r.out.find("uncaught"), std::string::npos) << r.out;
    }
  }
  std::ofstream(model_ + "/config.json") << config.dump(1);
  // model.safetensors a link to a character device.
  std::filesystem::rename(model_ + "/model.safetensors", model_ + "/weights.bak");
  std::filesystem::create_symlink("/dev/zero", model_ + "/model.safetensors");
  CliRun r = Shell(kStrata + " eval --model " + model_ + " --data " + data + " --seq-len 8");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("model.safetensors is not a regular file"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("does not exist"), std::string::npos) << r.out;
}

// `strata eval` of a model whose weights hold a NaN: exit 1 naming the tensor, no "loss nan".
TEST_F(HfCliTest, EvalOfNanWeightsExitsOneNamingTheTensor) {
  weights_ = strata::testing::RandomLlamaWeights(spec_, 5);
  const std::string bad = "model.layers.1.mlp.up_proj.weight";
  ASSERT_EQ(weights_.count(bad), 1u);
  weights_[bad] = weights_[bad].clone();
  weights_[bad].view(-1)[7] = std::nanf("");
  strata::testing::WriteHfCheckpoint(model_, spec_, weights_, "F32", 1);
  const std::string data = dir_.path() + "/d.bin";
  WriteTokens(data, 500, spec_.vocab_size, 1);
  CliRun r = Shell(kStrata + " eval --model " + model_ + " --data " + data + " --seq-len 8");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find(bad + " holds NaN"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("loss nan"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace strata
