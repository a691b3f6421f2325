// Loading a Hugging Face checkpoint streams into the tiers: with parameters and optimizer state on
// NVMe, the peak RSS of `strata eval` (load + one batch) on a 64-layer checkpoint is at most 1.2x
// that on an 8-layer one of the same width. Width 384: a layer is 1.77M parameters (7 MB in fp32),
// so 64 layers hold 453 MB of fp32 weights: a loader that kept the model, or read whole shards,
// would show as +400 MB over a few hundred MB of baseline. Both models are larger than the 64 MB
// device budget (the emulated GPU is host memory here, so a filled device window is RSS): a model
// that fits it, such as 4 layers, leaves part of the window empty and measures another regime
// (4 layers 255 MB, 8 layers 285 MB, 16 293 MB, 32 308 MB, 64 316 MB).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/testing/cli_run.h"
#include "tests/testing/hf_reference.h"
#include "tests/testing/temp_dir.h"

namespace strata {
namespace {

using strata::testing::Shell;

uint64_t PeakRss(const std::string& dir, int layers) {
  strata::testing::LlamaSpec spec;
  spec.vocab_size = 512;
  spec.hidden_size = 384;
  spec.intermediate_size = 1024;
  spec.num_attention_heads = 6;
  spec.num_key_value_heads = 6;
  spec.num_hidden_layers = layers;
  const std::string model = dir + "/model-" + std::to_string(layers);
  std::filesystem::create_directories(model);
  strata::testing::WriteHfCheckpoint(model, spec, strata::testing::RandomLlamaWeights(spec, 1),
                                     "BF16", layers / 4);
  const std::string data = dir + "/tokens.bin";
  std::vector<uint16_t> ids(4096);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>((i * 7919) % 512);
  std::ofstream(data, std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()),
             static_cast<std::streamsize>(ids.size() * 2));
  const std::string config = dir + "/nvme.json";
  // pin_memory: the pinned arena is locked (resident) from the start, in both runs alike; the
  // live-parameter cap and the device budget keep the emulated GPU (host memory here) to a few
  // layers, as a GPU's memory would be.
  std::ofstream(config)
      << R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
    "stage3_max_live_parameters": 4e6, "stage3_prefetch_bucket_size": 2e6,
    "offload_param": {"device": "nvme", "pin_memory": true, "nvme_path": ")"
      << dir << R"("}, "offload_optimizer": {"device": "nvme", "pin_memory": true,
    "nvme_path": ")"
      << dir << R"("}}})";
  const auto r = Shell(
      std::string(STRATA_BINARY) + " eval --model " + model + " --data " + data +
      " --seq-len 64 --max-batches 1 --threads 2 --device-memory 64M --json --config " + config);
  EXPECT_EQ(r.rc, 0) << r.out;
  const size_t start = r.out.find("{\n");
  if (start == std::string::npos) return 0;
  const nlohmann::json j = nlohmann::json::parse(r.out.substr(start), nullptr, false);
  std::filesystem::remove_all(model);
  return j.is_object() ? j.value("peak_rss_bytes", uint64_t{0}) : 0;
}

TEST(HfRssTest, PeakRssLoadingDoesNotGrowWithLayers) {
  strata::testing::TempDir dir("strata-hf-rss");
  ASSERT_TRUE(dir.ok());
  const uint64_t small = PeakRss(dir.path(), 8);
  const uint64_t large = PeakRss(dir.path(), 64);
  ASSERT_GT(small, 0u);
  ASSERT_GT(large, 0u);
  std::printf("peak RSS: 8 layers %.1f MB, 64 layers %.1f MB (ratio %.3f)\n", small / 1e6,
              large / 1e6, static_cast<double>(large) / small);
  EXPECT_LE(static_cast<double>(large), 1.2 * static_cast<double>(small));
}

}  // namespace
}  // namespace strata
