// Token files and `--json` output for the CLI tests of Hugging Face models (hf_*_cli_test.cc).
// Header-only; needs libtorch and nlohmann_json. Thread-safety: pure functions (WriteTokens writes
// its one file).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace strata::testing {

// `n` random token ids below `vocab` as a uint16 .bin; returns them.
inline std::vector<int64_t> WriteTokens(const std::string& path, int64_t n, int64_t vocab,
                                        uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> ids(n);
  std::vector<uint16_t> raw(n);
  for (int64_t i = 0; i < n; ++i) {
    ids[i] = static_cast<int64_t>(rng() % vocab);
    raw[i] = static_cast<uint16_t>(ids[i]);
  }
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(raw.data()), static_cast<std::streamsize>(n * 2));
  return ids;
}

// The consecutive windows of seq + 1 tokens `strata eval` reads.
inline torch::Tensor EvalWindows(const std::vector<int64_t>& ids, int seq) {
  const int64_t windows = static_cast<int64_t>(ids.size()) / (seq + 1);
  return torch::tensor(std::vector<int64_t>(ids.begin(), ids.begin() + windows * (seq + 1)))
      .view({windows, seq + 1});
}

// The object --json prints last (log lines go to stderr before it).
inline nlohmann::json LastJson(const std::string& out) {
  const size_t start = out.find("{\n");
  if (start == std::string::npos) return nullptr;
  return nlohmann::json::parse(out.substr(start), nullptr, /*allow_exceptions=*/false);
}

}  // namespace strata::testing
