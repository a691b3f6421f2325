// Fine-tuning from text through the user's path: a Llama directory with a SentencePiece
// tokenizer.model (trained here) and a checkpoint written by hand; `strata train --data x.jsonl`
// and `--data x.txt` tokenize with it, and give exactly the losses of training on the .bin that
// `strata tokenize` writes from the same file. No libtorch in this process: Debian's
// libsentencepiece (linked here to train the tokenizer) cannot share a process with libtorch.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/runtime/data/tiny_tokenizer.h"
#include "tests/testing/cli_run.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using strata::testing::Shell;

constexpr int64_t kHidden = 32, kInter = 64, kLayers = 2, kHeads = 4, kKv = 2;

// A Llama checkpoint of pseudo-random fp32 weights (norms 1), written as safetensors by hand.
void WriteLlama(const std::string& dir, int64_t vocab) {
  const int64_t hd = kHidden / kHeads;
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors = {
      {"model.embed_tokens.weight", {vocab, kHidden}},
      {"model.norm.weight", {kHidden}},
      {"lm_head.weight", {vocab, kHidden}}};
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    tensors.push_back({p + "input_layernorm.weight", {kHidden}});
    tensors.push_back({p + "post_attention_layernorm.weight", {kHidden}});
    tensors.push_back({p + "self_attn.q_proj.weight", {kHeads * hd, kHidden}});
    tensors.push_back({p + "self_attn.k_proj.weight", {kKv * hd, kHidden}});
    tensors.push_back({p + "self_attn.v_proj.weight", {kKv * hd, kHidden}});
    tensors.push_back({p + "self_attn.o_proj.weight", {kHidden, kHeads * hd}});
    tensors.push_back({p + "mlp.gate_proj.weight", {kInter, kHidden}});
    tensors.push_back({p + "mlp.up_proj.weight", {kInter, kHidden}});
    tensors.push_back({p + "mlp.down_proj.weight", {kHidden, kInter}});
  }
  nlohmann::json header;
  std::vector<float> data;
  uint32_t x = 7;
  for (const auto& [name, shape] : tensors) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const uint64_t begin = data.size() * 4;
    for (int64_t i = 0; i < n; ++i) {
      x = x * 1664525u + 1013904223u;
      const float r = (static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * 0.2f;
      data.push_back(name.ends_with("norm.weight") ? 1.0f : r);
    }
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size() * 4}}};
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  std::ofstream out(dir + "/model.safetensors", std::ios::binary);
  const uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  out.write(reinterpret_cast<const char*>(data.data()),
            static_cast<std::streamsize>(data.size() * 4));
  nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                           {"model_type", "llama"},
                           {"vocab_size", vocab},
                           {"hidden_size", kHidden},
                           {"intermediate_size", kInter},
                           {"num_hidden_layers", kLayers},
                           {"num_attention_heads", kHeads},
                           {"num_key_value_heads", kKv},
                           {"rms_norm_eps", 1e-5},
                           {"rope_theta", 10000.0},
                           {"hidden_act", "silu"},
                           {"tie_word_embeddings", false},
                           {"torch_dtype", "float32"}};
  std::ofstream(dir + "/config.json") << config.dump(2);
}

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
  WriteLlama(model, strata::testing::kTinyVocab);
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

}  // namespace
}  // namespace strata
