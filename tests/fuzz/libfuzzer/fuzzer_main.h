// Shared by the libFuzzer entry points: a failing CheckStatus aborts (libFuzzer then saves the
// input as crash-*), a file target lives in a scratch directory for the process's lifetime, and
// STRATA_FUZZ_SEED_CORPUS=DIR makes LLVMFuzzerInitialize write the target's seeds there (in the
// encoded form RunEncoded reads) before fuzzing starts (scripts/fuzz.sh sets it).
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tests/fuzz/fuzz_targets.h"

namespace strata::fuzz {

inline void ExpectClean(const Status& s, std::string_view source) {
  const std::string problem = CheckStatus(s, source);
  if (problem.empty()) return;
  std::fprintf(stderr, "strata fuzz: %s\n", problem.c_str());
  std::abort();
}

// Created on first use and removed at exit. Never destroyed itself: the exit handler that removes
// the directory runs after static destructors registered later.
inline const std::string& ScratchDir() {
  static const std::string* const dir = [] {
    std::string tmpl = (std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp") +
                       std::string("/strata-libfuzzer-XXXXXX");
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    return new std::string(tmpl);
  }();
  static const bool cleanup = std::atexit([] {
                                std::error_code ec;
                                std::filesystem::remove_all(*dir, ec);
                              }) == 0;
  (void)cleanup;
  return *dir;
}

template <typename Make>
FileTarget& TargetOnce(Make make) {
  static FileTarget* const target = [&] {
    Result<std::unique_ptr<FileTarget>> made = make(ScratchDir());
    if (!made.ok()) {
      std::fprintf(stderr, "strata fuzz: %s\n", made.status().ToString().c_str());
      std::abort();
    }
    return std::move(made).value().release();
  }();
  return *target;
}

// Writes `inputs` as seed_<i> into $STRATA_FUZZ_SEED_CORPUS, if set.
inline void WriteSeedCorpus(const std::vector<std::string>& inputs) {
  const char* dir = std::getenv("STRATA_FUZZ_SEED_CORPUS");
  if (dir == nullptr || *dir == '\0') return;
  std::filesystem::create_directories(dir);
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::ofstream(std::string(dir) + "/seed_" + std::to_string(i), std::ios::binary) << inputs[i];
  }
}

// The seeds of a file target, each unframed and framed: selector byte (slot, 0x80 = fix) + bytes.
inline std::vector<std::string> EncodedSeeds(const FileTarget& target) {
  std::vector<std::string> out;
  const std::vector<std::string> seeds = target.Seeds();
  for (size_t slot = 0; slot < seeds.size(); ++slot) {
    out.push_back(static_cast<char>(slot) + seeds[slot]);
    out.push_back(static_cast<char>(slot | 0x80) + seeds[slot]);
  }
  return out;
}

}  // namespace strata::fuzz
