// The parsers strata runs on untrusted bytes, each wrapped as a fuzz target: bytes in, the
// parser's Status out. Shared by the deterministic suite (fuzz_test.cc) and the libFuzzer entry
// points (libfuzzer/*.cc), so both exercise exactly the same code.
//
// Targets that read files own a scratch directory (created by Create, removed on destruction):
// every case writes its files there first, so cases do not depend on one another. Each target's
// seeds are real inputs written by strata's own writers (CheckpointWriter, SafetensorsWriter) or
// taken from the config corpus in tests/data.
//
// CheckStatus states what every case must satisfy besides not crashing: OK, or an error whose
// code is a known one other than kInternal and whose message is non-empty and names the input.
//
// Not thread-safe: one target per thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace strata::fuzz {

// "" when `s` is acceptable for an input named `source`, else what is wrong with it.
std::string CheckStatus(const Status& s, std::string_view source);

// runtime/config: ParseConfig (DeepSpeed JSON) with source kConfigSource and "auto" resolved
// from DefaultAutoValues().
inline constexpr char kConfigSource[] = "fuzz-config.json";
Status RunConfig(std::string_view text);

// A target whose input is a set of files in a scratch directory.
class FileTarget {
 public:
  virtual ~FileTarget();
  // The directory every message about a case must name.
  const std::string& dir() const { return dir_; }
  // The seed inputs (one per file a case may replace).
  virtual std::vector<std::string> Seeds() const = 0;
  // Runs one case: `which` picks a seed's slot (modulo the number of seeds), `bytes` replaces
  // it, and `fix` asks the target to keep the framing around it valid (a checksum, a header
  // length) so that the parser behind it is reached.
  virtual Status Run(size_t which, std::string_view bytes, bool fix) = 0;
  // libFuzzer's form: the first byte chooses `which` and `fix`, the rest are `bytes`.
  Status RunEncoded(std::string_view data);

 protected:
  explicit FileTarget(std::string dir) : dir_(std::move(dir)) {}
  // Writes `bytes` to `dir_`/`name` (parents created), replacing what is there.
  Status WriteFile(const std::string& name, std::string_view bytes) const;

 private:
  std::string dir_;
};

// runtime/persist checkpoint reading: CheckpointReader::Open (ROOT/latest, MANIFEST.json),
// Verify, ReadJson of engine.json and trainer.json, ReadEntry of every entry. Slots: latest,
// MANIFEST.json, engine.json, trainer.json and a binary entry; `fix` rewrites the manifest's size
// and checksum of a replaced entry.
Result<std::unique_ptr<FileTarget>> MakeCheckpointTarget(const std::string& scratch);
// runtime/persist safetensors: ReadSafetensorsIndex, then HfCheckpoint::Open of the directory
// holding the file as model.safetensors and a read of every tensor. `fix` treats `bytes` as the
// JSON header and frames it with its length and the seed's data.
Result<std::unique_ptr<FileTarget>> MakeSafetensorsTarget(const std::string& scratch);
// runtime/persist HF index: HfCheckpoint::Open of a directory of two shards and
// model.safetensors.index.json (the input), and a read of every tensor.
Result<std::unique_ptr<FileTarget>> MakeHfIndexTarget(const std::string& scratch);

// Reads every regular file under `dir` (sorted by name), e.g. a seed corpus.
std::vector<std::string> ReadCorpus(const std::string& dir);
// The distinct string literals ("...", quotes included) in `inputs`: a format's keys and values,
// for a mutator's dictionary.
std::vector<std::string> QuotedStrings(const std::vector<std::string>& inputs);

}  // namespace strata::fuzz
