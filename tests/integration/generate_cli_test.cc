// `strata generate` and the inference engine through the user's path, on Hugging Face directories
// written by the independent reference (tests/testing/hf_config_reference.h):
//   - greedy decoding equals the reference's (transformers' greedy, recomputed from scratch without
//     a cache) token for token, for Llama, Mistral, Qwen2, Phi-3 and Gemma 2 (its sliding window
//     shorter than prompt + new tokens), and an EOS in the config stops it after that token;
//   - sampling with a seed gives the same tokens twice, and with the weights on NVMe (the engine
//     pages them unit by unit), and other tokens with another seed;
//   - refusals name the flag and exit 2;
//   - `strata eval` runs an inference engine: the reference's loss with the weights on NVMe, and
//     the pinned arena `strata estimate --mode eval` plans (no optimizer state), smaller than
//     training's;
//   - `strata estimate --mode generate` of llama-3.1-70b with the weights on NVMe fits 24 GiB;
//   - mixtures of experts (Mixtral; Qwen2-MoE with a sliding window shorter than the run) with
//     --page-experts (each expert, attention and dense MLP its own unit) decode on the KV cache
//     the reference's greedy tokens, with the weights on the device and on NVMe.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/testing/cli_run.h"
#include "tests/testing/hf_config_reference.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using nlohmann::json;
using strata::testing::CliRun;
using strata::testing::Shell;
using strata::testing::TempDir;

const std::string kStrata = STRATA_BINARY;
constexpr int kNewTokens = 8;

// Shrunk published configs (tiny sizes, no EOS: a test sets one where it wants generation to
// stop), max_position_embeddings 48 so a prompt can overflow it.
json TinyConfig(const std::string& family) {
  json c;
  if (family == "llama") {
    c = json::parse(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 56, "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0, "tie_word_embeddings": false, "vocab_size": 53})");
  } else if (family == "mistral") {
    c = json::parse(R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
        "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0, "sliding_window": null, "tie_word_embeddings": false,
        "vocab_size": 61})");
  } else if (family == "qwen2") {
    c = json::parse(R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 48, "max_window_layers": 28,
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072,
        "tie_word_embeddings": false, "use_sliding_window": false, "vocab_size": 67})");
  } else if (family == "gemma2") {  // google/gemma-2-2b shrunk; a window shorter than the run
    c = json::parse(R"({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "head_dim": 16,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_hidden_layers": 3, "num_key_value_heads": 2,
        "query_pre_attn_scalar": 16, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
        "sliding_window": 12, "vocab_size": 128})");
  } else {
    c = json::parse(R"({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
        "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 40, "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 4, "original_max_position_embeddings": 48,
        "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
        "sliding_window": null, "tie_word_embeddings": false, "vocab_size": 71})");
  }
  c["max_position_embeddings"] = 48;
  c["torch_dtype"] = "float32";
  return c;
}

std::string WriteIds(const std::string& path, const std::vector<int64_t>& ids) {
  std::ofstream out(path);
  for (int64_t id : ids) out << id << " ";
  return path;
}

// Ids below `vocab` from a fixed recipe.
std::vector<int64_t> PromptIds(int n, int64_t vocab) {
  std::vector<int64_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back((7 * i + 3) % vocab);
  return ids;
}

// The result of `strata generate ... --json`; fails the test on a non-zero exit.
json GenerateJson(const std::string& args) {
  const CliRun r = Shell(kStrata + " generate --json --threads 1 " + args + " 2>/dev/null");
  EXPECT_EQ(r.rc, 0) << "strata generate " << args << "\n" << r.out;
  if (r.rc != 0) return json::object();
  return json::parse(r.out);
}

std::vector<int64_t> Ids(const json& j) {
  return j.contains("ids") ? j["ids"].get<std::vector<int64_t>>() : std::vector<int64_t>{};
}

std::string NvmeConfig(const std::string& dir) {
  const std::string path = dir + "/nvme.json";
  std::ofstream(path) << R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
      "stage": 3, "stage3_param_persistence_threshold": 0,
      "offload_param": {"device": "nvme", "nvme_path": ")"
                      << dir << R"(", "buffer_count": 2},
      "offload_optimizer": {"device": "nvme", "nvme_path": ")"
                      << dir << R"("}}})";
  return path;
}

class GenerateCliTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }

  // An HF directory of `family` with the reference's random weights.
  std::string WriteModel(const std::string& family, const json& config) {
    const std::string model = dir_.path() + "/" + family;
    weights_ = strata::testing::RandomWeightsFor(config, /*seed=*/11);
    strata::testing::WriteHfDirectory(model, config, weights_, "F32", 1);
    return model;
  }

  TempDir dir_{"strata-generate-cli"};
  strata::testing::HfWeights weights_;
};

TEST_F(GenerateCliTest, GreedyEqualsTheReferenceTokenForToken) {
  for (const std::string family : {"llama", "mistral", "qwen2", "phi3", "gemma2"}) {
    SCOPED_TRACE(family);
    const json config = TinyConfig(family);
    const std::string model = WriteModel(family, config);
    const std::vector<int64_t> prompt = PromptIds(9, config["vocab_size"].get<int64_t>());
    const std::string ids = WriteIds(dir_.path() + "/" + family + ".ids", prompt);
    const std::string args = "--model " + model + " --prompt-ids " + ids + " --max-new-tokens " +
                             std::to_string(kNewTokens);
    const json out = GenerateJson(args);
    EXPECT_EQ(Ids(out),
              strata::testing::ConfigReferenceGreedy(config, weights_, prompt, kNewTokens));
    EXPECT_EQ(out.value("stop_reason", ""), "max_new_tokens");
    EXPECT_EQ(out.value("mode", ""), "greedy");
    EXPECT_TRUE(out.value("kv_cache", false));
    EXPECT_EQ(out["prompt_ids"].get<std::vector<int64_t>>(), prompt);
    // No tokenizer in the directory: ids, and why there is no text.
    EXPECT_TRUE(out["text"].is_null());
    EXPECT_NE(out.value("no_text_reason", "").find("tokenizer"), std::string::npos);
    EXPECT_GT(out.value("prompt_tokens_per_second", 0.0), 0);
    EXPECT_GT(out.value("generation_tokens_per_second", 0.0), 0);
  }
}

// An EOS id (config.json's eos_token_id) stops generation after it, as transformers does.
TEST_F(GenerateCliTest, StopsAtTheConfigsEos) {
  json config = TinyConfig("llama");
  WriteModel("llama", config);
  const std::vector<int64_t> prompt = PromptIds(6, 53);
  const std::vector<int64_t> greedy =
      strata::testing::ConfigReferenceGreedy(config, weights_, prompt, kNewTokens);
  // The first token whose id did not come before: generation must stop exactly there.
  size_t stop = 2;
  while (stop < greedy.size() &&
         std::find(greedy.begin(), greedy.begin() + stop, greedy[stop]) != greedy.begin() + stop)
    ++stop;
  ASSERT_LT(stop, greedy.size()) << "the reference's greedy ids repeat: pick another prompt";
  config["eos_token_id"] = greedy[stop];
  const std::string model = dir_.path() + "/llama-eos";
  strata::testing::WriteHfDirectory(model, config, weights_, "F32", 1);
  // A tokenizer.json that transformers cannot load: ids printed, the reason says so.
  std::ofstream(model + "/tokenizer.json") << "{}";
  const json out = GenerateJson("--model " + model + " --prompt-ids " +
                                WriteIds(dir_.path() + "/eos.ids", prompt) + " --max-new-tokens " +
                                std::to_string(kNewTokens));
  EXPECT_EQ(Ids(out), std::vector<int64_t>(greedy.begin(), greedy.begin() + stop + 1));
  EXPECT_EQ(out.value("stop_reason", ""), "eos");
  EXPECT_EQ(out.value("eos_source", ""), "config.json");
  EXPECT_NE(out.value("no_text_reason", "").find("transformers"), std::string::npos)
      << out.value("no_text_reason", "");
}

// Sampling: a seed gives the same tokens twice and with the weights paged from NVMe; another seed
// other tokens (temperature 1.5 over 53 tokens: eight equal draws by chance are ~impossible).
TEST_F(GenerateCliTest, SeededSamplingIsReproducibleAcrossOffload) {
  const std::string model = WriteModel("llama", TinyConfig("llama"));
  const std::string ids = WriteIds(dir_.path() + "/p.ids", PromptIds(5, 53));
  const std::string sample = "--model " + model + " --prompt-ids " + ids +
                             " --max-new-tokens 12 --temperature 1.5 --top-p 0.95 --seed ";
  const json first = GenerateJson(sample + "7");
  const json again = GenerateJson(sample + "7");
  const json nvme = GenerateJson(sample + "7 --config " + NvmeConfig(dir_.path()));
  const json other = GenerateJson(sample + "8");
  ASSERT_EQ(Ids(first).size(), 12u);
  EXPECT_EQ(first.value("mode", ""), "sample");
  EXPECT_EQ(Ids(again), Ids(first));
  EXPECT_EQ(Ids(nvme), Ids(first));
  EXPECT_EQ(nvme.value("params_on", ""), "nvme");
  EXPECT_GT(nvme.value("pinned_arena_bytes", 0), 0);
  EXPECT_NE(Ids(other), Ids(first));
  // Greedy is not what sampling gave (else the sampler would not be sampling).
  const json greedy =
      GenerateJson("--model " + model + " --prompt-ids " + ids + " --max-new-tokens 12");
  EXPECT_NE(Ids(greedy), Ids(first));
}

TEST_F(GenerateCliTest, RefusalsNameTheFlag) {
  const std::string model = WriteModel("llama", TinyConfig("llama"));
  const std::string ids = WriteIds(dir_.path() + "/p.ids", PromptIds(4, 53));
  const std::string too_long = WriteIds(dir_.path() + "/long.ids", PromptIds(48, 53));
  const std::string base = "generate --threads 1 --model " + model;
  std::filesystem::create_directories(dir_.path() + "/no-weights");
  std::ofstream(dir_.path() + "/no-weights/config.json") << TinyConfig("llama").dump();
  struct Case {
    std::string args, flag;
  };
  const std::vector<Case> cases = {
      {base + " --prompt-ids " + too_long, "--prompt-ids"},  // 48 tokens: no room in 48
      {base + " --prompt-ids " + ids + " --max-new-tokens 0", "--max-new-tokens"},
      {base + " --prompt-ids " + ids + " --temperature -0.5", "--temperature"},
      {base + " --prompt-ids " + ids + " --temperature nan", "--temperature"},
      {base + " --prompt-ids " + ids + " --top-p 0", "--top-p"},
      {base + " --prompt-ids " + ids + " --prompt hello", "--prompt-ids"},
      {base + " --prompt hello", "--prompt"},  // no tokenizer to read text with
      {"generate --threads 1 --prompt-ids " + ids + " --model " + dir_.path() + "/no-weights",
       "--model"},
  };
  for (const Case& c : cases) {
    const CliRun r = Shell(kStrata + " " + c.args);
    SCOPED_TRACE(c.args + "\n" + r.out);
    EXPECT_EQ(r.rc, 2);
    const size_t error = r.out.rfind("strata generate:");  // the error line, after the log
    ASSERT_NE(error, std::string::npos);
    EXPECT_NE(r.out.find(c.flag, error), std::string::npos) << "the error does not name " << c.flag;
  }
}

// `strata eval` runs an inference engine: with the weights on NVMe (and an optimizer configured
// on NVMe too) its pinned arena is what `strata estimate --mode eval` plans, below training's
// plan, and its loss is the reference's.
TEST_F(GenerateCliTest, EvalAllocatesNoOptimizerState) {
  const json config = TinyConfig("llama");
  const std::string model = WriteModel("llama", config);
  std::vector<int64_t> tokens = PromptIds(4 * 17, 53);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = (tokens[i] * 31 + i) % 53;
  std::vector<uint16_t> raw(tokens.begin(), tokens.end());
  const std::string data = dir_.path() + "/data.bin";
  std::ofstream(data, std::ios::binary)
      .write(reinterpret_cast<const char*>(raw.data()),
             static_cast<std::streamsize>(raw.size() * 2));
  const std::string ds = NvmeConfig(dir_.path());
  CliRun r = Shell(kStrata + " eval --json --threads 1 --model " + model + " --data " + data +
                   " --seq-len 16 --config " + ds + " 2>/dev/null");
  ASSERT_EQ(r.rc, 0) << r.out;
  const json eval = json::parse(r.out);
  EXPECT_TRUE(eval.value("inference", false));
  const double reference =
      strata::testing::ConfigReferenceLoss(config, weights_, torch::tensor(tokens).view({4, 17}));
  EXPECT_NEAR(eval["loss"].get<double>(), reference, 1e-5 * std::abs(reference));

  auto plan = [&](const std::string& mode) {
    const CliRun e = Shell(kStrata + " estimate --json --model " + model + " --seq-len 16 --mode " +
                           mode + " --config " + ds);
    EXPECT_EQ(e.rc, 0) << e.out;
    return e.rc == 0 ? json::parse(e.out)["config"]["plan"] : json::object();
  };
  const json inference = plan("eval"), training = plan("train");
  EXPECT_EQ(eval["plan"]["pinned_arena_bytes"], inference["pinned_arena_bytes"]);
  EXPECT_LT(inference["pinned_arena_bytes"].get<uint64_t>(),
            training["pinned_arena_bytes"].get<uint64_t>());
  for (const json& item : inference["items"]) {
    const std::string name = item["name"];
    EXPECT_TRUE(name.rfind("optimizer.", 0) != 0 && name.rfind("staging.", 0) != 0 &&
                name != "device.grads")
        << name << " in an inference plan";
  }
  EXPECT_GT(training["total"]["nvme"].get<uint64_t>(), inference["total"]["nvme"].get<uint64_t>());
}

// Per-expert paging for inference: the KV cache lives in the attention units, so a paged model
// generates one token per forward, the same tokens as unpaged and as the reference (recomputed
// from scratch); with the weights on NVMe each token reads only its experts, fewer bytes than whole
// layers. Tokens/s and NVMe bytes per token are printed, paged and not.
TEST_F(GenerateCliTest, PagedExpertsDecodeTheReferenceTokensOnTheKvCache) {
  const json mixtral = json::parse(R"({"architectures": ["MixtralForCausalLM"],
      "model_type": "mixtral", "hidden_size": 32, "intermediate_size": 40,
      "num_attention_heads": 4, "num_hidden_layers": 4, "num_key_value_heads": 2,
      "num_local_experts": 8, "num_experts_per_tok": 2, "rms_norm_eps": 1e-05,
      "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false,
      "vocab_size": 59, "max_position_embeddings": 48, "torch_dtype": "float32"})");
  // Layers 0 and 2 slide over 6 keys, shorter than the 9 + 8 tokens; layer 1 is dense.
  const json qwen = json::parse(R"({"architectures": ["Qwen2MoeForCausalLM"],
      "model_type": "qwen2_moe", "hidden_size": 32, "intermediate_size": 48,
      "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40,
      "num_attention_heads": 4, "num_hidden_layers": 3, "num_key_value_heads": 4,
      "mlp_only_layers": [1], "num_experts": 6, "num_experts_per_tok": 2, "norm_topk_prob": false,
      "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "use_sliding_window": true,
      "sliding_window": 6, "max_window_layers": 3, "tie_word_embeddings": false,
      "vocab_size": 61, "max_position_embeddings": 48, "torch_dtype": "float32"})");
  // A device window and pinned buffers (2 units) smaller than the model's units (as a model larger
  // than the GPU and RAM): each token reads again.
  const std::string nvme = NvmeConfig(dir_.path()) + " --device-memory 160K";
  for (const json& config : {mixtral, qwen}) {
    const std::string family = config["model_type"];
    SCOPED_TRACE(family);
    const std::string model = WriteModel(family, config);
    const std::vector<int64_t> prompt = PromptIds(9, config["vocab_size"].get<int64_t>());
    const std::vector<int64_t> reference =
        strata::testing::ConfigReferenceGreedy(config, weights_, prompt, kNewTokens);
    const std::string args = "--model " + model + " --prompt-ids " +
                             WriteIds(dir_.path() + "/" + family + ".ids", prompt) +
                             " --max-new-tokens " + std::to_string(kNewTokens);
    for (const std::string& offload : {std::string(), " --config " + nvme}) {
      json runs[2];
      for (const bool paged : {false, true}) {
        json& out = runs[paged] = GenerateJson(args + offload + (paged ? " --page-experts" : ""));
        EXPECT_EQ(Ids(out), reference) << "paged " << paged << offload;
        EXPECT_TRUE(out.value("kv_cache", false));
        EXPECT_EQ(out.value("decode_forwards", 0), kNewTokens - 1);
        EXPECT_EQ(out.value("page_experts", !paged), paged);
      }
      if (!offload.empty()) {
        // Whole layers read every expert; paged, a token reads its top-k (and the device window
        // keeps more of the small units).
        const double whole = runs[0].value("nvme_read_bytes_per_token", 0.0);
        EXPECT_GT(whole, 0);
        EXPECT_LT(runs[1].value("nvme_read_bytes_per_token", 0.0), whole);
      }
      std::cout << family << (offload.empty() ? " weights on the device" : " weights on NVMe")
                << ": tokens/s whole layers " << runs[0].value("generation_tokens_per_second", 0.0)
                << ", paged " << runs[1].value("generation_tokens_per_second", 0.0)
                << "; NVMe bytes per token whole layers "
                << runs[0].value("nvme_read_bytes_per_token", 0.0) << ", paged "
                << runs[1].value("nvme_read_bytes_per_token", 0.0) << "\n";
    }
  }
}

// ZeRO-Inference's case: a 70B model's generate plan with its weights on NVMe fits a 24 GiB
// machine (the training plan of the same config does not).
TEST_F(GenerateCliTest, SeventyBillionGeneratePlanFits24GiB) {
  const std::string ds = dir_.path() + "/70b.json";
  std::ofstream(ds) << R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
      "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": ")"
                    << dir_.path()
                    << R"("}, "offload_optimizer": {"device": "nvme", "nvme_path": ")"
                    << dir_.path() << R"("}}})";
  auto estimate = [&](const std::string& mode) {
    const CliRun r = Shell(kStrata + " estimate --json --model llama-3.1-70b --seq-len 1024 " +
                           "--mode " + mode + " --config " + ds);
    EXPECT_EQ(r.rc, 0) << r.out;
    return r.rc == 0 ? json::parse(r.out) : json::object();
  };
  const json generate = estimate("generate");
  const json train = estimate("train");
  ASSERT_TRUE(generate.contains("config"));
  EXPECT_FALSE(generate.value("optimizer_state", true));
  const uint64_t gib24 = uint64_t{24} << 30;
  const json& fit = generate["config"]["fit"];
  // Host RAM: the pinned arena, pageable host memory and (no GPU here) the emulated device.
  EXPECT_LT(fit["host_need"].get<uint64_t>(), gib24) << generate["config"]["plan"].dump();
  EXPECT_GT(train["config"]["fit"]["host_need"].get<uint64_t>(), gib24);
  // The weights (140 GB in bf16) are on NVMe, and nothing else is.
  const json& plan = generate["config"]["plan"];
  EXPECT_GT(plan["total"]["nvme"].get<uint64_t>(), uint64_t{130'000'000'000});
  EXPECT_LT(plan["total"]["nvme"].get<uint64_t>(), uint64_t{150'000'000'000});
  bool kv_cache = false;
  for (const json& item : plan["items"]) kv_cache = kv_cache || item["name"] == "kv_cache";
  EXPECT_TRUE(kv_cache);
}

}  // namespace
}  // namespace strata
