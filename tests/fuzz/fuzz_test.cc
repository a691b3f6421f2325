// Deterministic mutation fuzzing of the parsers strata runs on untrusted bytes (fuzz_targets.h):
// DeepSpeed configs, checkpoint directories (latest, MANIFEST.json, engine.json, trainer.json,
// entries), safetensors files and Hugging Face shard indexes. Each target runs a few thousand
// cases derived from real inputs by a seeded Mutator, so every run checks the same cases and a
// failure names its case number. Every case must end without a crash (the sanitizer builds run
// this suite too) and with a Status that CheckStatus accepts.
//
// A failing case's input is saved (the path is in the failure message) in the form the
// libFuzzer entry points and regressions/ take: for file targets a selector byte (slot, 0x80 =
// fix the framing) then the bytes. Copy it into regressions/<target>/ once fixed: those files run
// first, every time. STRATA_FUZZ_CASES=N in the environment overrides the number of cases.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_targets.h"
#include "tests/fuzz/mutator.h"
#include "tests/testing/temp_dir.h"

namespace strata::fuzz {
namespace {

#ifndef STRATA_FUZZ_DEFAULT_CASES
#define STRATA_FUZZ_DEFAULT_CASES 3000
#endif

constexpr char kSourceDir[] = STRATA_SOURCE_DIR;

size_t Cases() {
  const char* env = std::getenv("STRATA_FUZZ_CASES");
  if (env != nullptr && std::atoi(env) > 0) return static_cast<size_t>(std::atoi(env));
  return STRATA_FUZZ_DEFAULT_CASES;
}

std::string Regressions(const std::string& target) {
  return std::string(kSourceDir) + "/tests/fuzz/regressions/" + target;
}

// Saves a failing input where a developer can pick it up; returns the path.
std::string SaveFailure(const std::string& target, size_t index, const std::string& encoded) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                           "/strata-fuzz-" + target + "-case-" + std::to_string(index);
  std::ofstream(path, std::ios::binary) << encoded;
  return path;
}

// What a run of one target saw, printed so that a change in coverage is visible in the log.
struct Tally {
  size_t cases = 0;
  std::map<std::string, size_t> by_code;
  std::map<std::string, std::string> example;  // code -> the first message seen with it
  int failures = 0;

  void Print(const std::string& target) const {
    std::string line = target + ": " + std::to_string(cases) + " cases:";
    for (const auto& [code, n] : by_code) line += " " + code + " " + std::to_string(n);
    for (const auto& [code, message] : example) {
      line += "\n  e.g. " + code + ": " + message.substr(0, 300);
    }
    std::printf("%s\n", line.c_str());
  }
};

// Runs one case and records it; `encoded` is the input as saved on failure.
void Check(const std::string& target, size_t index, const Status& s, const std::string& source,
           const std::string& encoded, Tally* tally) {
  ++tally->cases;
  const std::string code(StatusCodeName(s.code()));
  if (++tally->by_code[code] == 1 && !s.ok()) tally->example[code] = std::string(s.message());
  const std::string problem = CheckStatus(s, source);
  if (problem.empty() || ++tally->failures > 10) return;  // report the first ten
  ADD_FAILURE() << target << " case " << index << ": " << problem.substr(0, 2000)
                << "\n  input saved to " << SaveFailure(target, index, encoded);
}

std::vector<std::string> ConfigSeeds() {
  std::vector<std::string> seeds = ReadCorpus(std::string(kSourceDir) + "/examples");
  for (std::string& s : ReadCorpus(std::string(kSourceDir) + "/tests/data/deepspeed_configs")) {
    if (s.find('{') != std::string::npos) seeds.push_back(std::move(s));  // skip the README
  }
  return seeds;
}

TEST(FuzzTest, ConfigParser) {
  const std::vector<std::string> seeds = ConfigSeeds();
  ASSERT_GE(seeds.size(), 20u) << "the config corpus (tests/data/deepspeed_configs) is missing";
  size_t parsed = 0;
  for (const std::string& s : seeds) parsed += RunConfig(s).ok();
  EXPECT_GE(parsed * 10, seeds.size() * 6) << "most seeds must be valid configs";

  Tally tally;
  size_t index = 0;
  for (const std::string& input : ReadCorpus(Regressions("config"))) {
    Check("config", index++, RunConfig(input), kConfigSource, input, &tally);
  }
  Mutator mutator(0x5eed0001, QuotedStrings(seeds));
  for (size_t i = 0; i < Cases(); ++i, ++index) {
    const std::string input = mutator.Mutate(seeds[mutator.Below(seeds.size())], seeds);
    Check("config", index, RunConfig(input), kConfigSource, input, &tally);
  }
  tally.Print("config");
  EXPECT_GT(tally.by_code["ok"], 0u) << "no mutated config parsed: the mutator is too coarse";
}

using MakeTarget = std::function<Result<std::unique_ptr<FileTarget>>(const std::string&)>;

void FuzzFileTarget(const std::string& name, const MakeTarget& make, uint64_t seed) {
  testing::TempDir scratch("strata-fuzz-" + name);
  ASSERT_TRUE(scratch.ok());
  Result<std::unique_ptr<FileTarget>> made = make(scratch.path());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  FileTarget& target = **made;
  const std::vector<std::string> seeds = target.Seeds();
  for (size_t slot = 0; slot < seeds.size(); ++slot) {
    ASSERT_TRUE(target.Run(slot, seeds[slot], false).ok())
        << name << " seed " << slot
        << " must be valid: " << target.Run(slot, seeds[slot], false).ToString();
  }

  Tally tally;
  size_t index = 0;
  for (const std::string& input : ReadCorpus(Regressions(name))) {
    Check(name, index++, target.RunEncoded(input), target.dir(), input, &tally);
  }
  Mutator mutator(seed, QuotedStrings(seeds));
  for (size_t i = 0; i < Cases(); ++i, ++index) {
    const size_t slot = mutator.Below(seeds.size());
    const bool fix = mutator.Below(2) == 0;
    const std::string bytes = mutator.Mutate(seeds[slot], seeds);
    const std::string encoded = static_cast<char>(slot | (fix ? 0x80 : 0)) + bytes;
    Check(name, index, target.Run(slot, bytes, fix), target.dir(), encoded, &tally);
  }
  tally.Print(name);
  EXPECT_GT(tally.by_code["ok"], 0u) << "no mutated input was read: the mutator is too coarse";
}

TEST(FuzzTest, CheckpointLoader) { FuzzFileTarget("checkpoint", MakeCheckpointTarget, 0x5eed0002); }
TEST(FuzzTest, SafetensorsReader) {
  FuzzFileTarget("safetensors", MakeSafetensorsTarget, 0x5eed0003);
}
TEST(FuzzTest, HfIndexReader) { FuzzFileTarget("hf_index", MakeHfIndexTarget, 0x5eed0004); }

// The mutator itself: the same seed gives the same cases (failures reproduce by number), and a
// different seed different ones.
TEST(FuzzTest, MutatorIsDeterministic) {
  const std::vector<std::string> corpus = {R"({"a": [1, 2, "x"]})"};
  Mutator a(7, {}), b(7, {}), c(8, {});
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const std::string x = a.Mutate(corpus[0], corpus);
    EXPECT_EQ(x, b.Mutate(corpus[0], corpus));
    differs |= x != c.Mutate(corpus[0], corpus);
  }
  EXPECT_TRUE(differs);
}

}  // namespace
}  // namespace strata::fuzz
