#include "tests/fuzz/fuzz_targets.h"

#include <fcntl.h>
#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "base/file_util.h"
#include "runtime/config/config.h"
#include "runtime/persist/checkpoint_store.h"
#include "runtime/persist/hf_checkpoint.h"
#include "runtime/persist/safetensors.h"

#ifndef STRATA_FUZZ_SEEDS_DIR
#error "STRATA_FUZZ_SEEDS_DIR (tests/fuzz/seeds) must be defined by the build"
#endif

namespace strata::fuzz {
namespace {

namespace fs = std::filesystem;
using runtime::CheckpointReader;
using runtime::CheckpointWriter;
using runtime::HfCheckpoint;
using runtime::HfTensorInfo;
using runtime::SafetensorsWriter;
using runtime::TensorSpec;

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// `n` bytes of a fixed pattern (tensor values need not mean anything, only be stable).
std::string Pattern(size_t n, uint8_t salt) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>((i * 131 + salt) & 0xff);
  return out;
}

Status WriteSafetensors(const std::string& path, std::vector<TensorSpec> specs,
                        std::map<std::string, std::string> metadata) {
  STRATA_ASSIGN_OR_RETURN(auto w, SafetensorsWriter::Create(path, std::move(specs), metadata));
  const std::string data = Pattern(w->data_bytes(), 7);
  STRATA_RETURN_IF_ERROR(w->Append(data.data(), data.size()));
  return w->Finish();
}

// Opens the directory `dir` as a Hugging Face checkpoint and reads every tensor as stored and,
// for the float dtypes, as fp32.
Status OpenAndReadHf(const std::string& dir) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<HfCheckpoint> ckpt, HfCheckpoint::Open(dir));
  std::vector<char> raw;
  std::vector<float> floats;
  for (const HfTensorInfo& t : ckpt->tensors()) {
    raw.resize(t.end - t.begin);
    STRATA_RETURN_IF_ERROR(ckpt->ReadRaw(t.name, raw.data()));
    if (t.dtype == "F32" || t.dtype == "BF16" || t.dtype == "F16") {
      floats.resize(t.numel());
      STRATA_RETURN_IF_ERROR(ckpt->ReadFloat32(t.name, floats.data()));
    }
  }
  return Status::Ok();
}

// ---- checkpoint directory ----------------------------------------------------------------------

constexpr char kTag[] = "step-1";

class CheckpointTarget : public FileTarget {
 public:
  static Result<std::unique_ptr<FileTarget>> Make(const std::string& scratch) {
    const std::string root = scratch + "/checkpoints";
    {
      // The engine and trainer JSON of a real `strata train --save` run, bytes as written.
      STRATA_ASSIGN_OR_RETURN(auto w, CheckpointWriter::Begin(root, kTag));
      for (const char* name : {"engine.json", "trainer.json"}) {
        const std::string text =
            ReadWhole(std::string(STRATA_FUZZ_SEEDS_DIR) + "/checkpoint/" + name);
        if (text.empty()) return NotFoundError(std::string("fuzz seed checkpoint/") + name);
        STRATA_ASSIGN_OR_RETURN(runtime::EntryWriter * e, w->AddEntry(name));
        STRATA_RETURN_IF_ERROR(e->Append(text.data(), text.size()));
        STRATA_RETURN_IF_ERROR(e->Close());
      }
      const std::string bin = Pattern(96, 3);
      STRATA_ASSIGN_OR_RETURN(runtime::EntryWriter * e, w->AddEntry("params/w.bin"));
      STRATA_RETURN_IF_ERROR(e->Append(bin.data(), bin.size()));
      STRATA_RETURN_IF_ERROR(w->Commit());
    }
    std::unique_ptr<CheckpointTarget> t(new CheckpointTarget(root));
    for (const char* name : {"latest", "step-1/MANIFEST.json", "step-1/engine.json",
                             "step-1/trainer.json", "step-1/params/w.bin"}) {
      t->files_.emplace_back(name, ReadWhole(root + "/" + name));
    }
    return std::unique_ptr<FileTarget>(std::move(t));
  }

  std::vector<std::string> Seeds() const override {
    std::vector<std::string> out;
    for (const auto& f : files_) out.push_back(f.second);
    return out;
  }

  Status Run(size_t which, std::string_view bytes, bool fix) override {
    which %= files_.size();
    std::string manifest = files_[1].second;
    if (fix && which >= 2) manifest = ManifestFor(files_[which].first, bytes);
    for (size_t i = 0; i < files_.size(); ++i) {
      std::string_view contents = i == which ? bytes : files_[i].second;
      if (i == 1 && which != 1) contents = manifest;
      STRATA_RETURN_IF_ERROR(WriteFile(files_[i].first, contents));
    }
    STRATA_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(dir()));
    STRATA_RETURN_IF_ERROR(reader.Verify());
    std::vector<char> buffer;
    for (const std::string& name : reader.entries()) {
      if (name.size() > 5 && name.substr(name.size() - 5) == ".json") {
        STRATA_RETURN_IF_ERROR(reader.ReadJson(name).status());
      } else {
        STRATA_ASSIGN_OR_RETURN(uint64_t size, reader.EntrySize(name));
        buffer.resize(size);
        STRATA_RETURN_IF_ERROR(reader.ReadEntry(name, 0, buffer.data(), size));
      }
    }
    return Status::Ok();
  }

 private:
  explicit CheckpointTarget(std::string root) : FileTarget(std::move(root)) {}

  // The seed manifest with entry `file` (a path under ROOT) given the size and checksum of
  // `bytes`, so that a case reaches the entry's parser.
  std::string ManifestFor(const std::string& file, std::string_view bytes) const {
    nlohmann::json m = nlohmann::json::parse(files_[1].second);
    const std::string name = file.substr(std::string(kTag).size() + 1);
    // "xxh64-named": the digest covers the entry's name and a NUL byte first.
    std::string hashed(bytes);
    if (m.value("checksum", "") == "xxh64-named") hashed = name + '\0' + hashed;
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx",
                  static_cast<unsigned long long>(XXH64(hashed.data(), hashed.size(), 0)));
    for (auto& e : m["entries"]) {
      if (e["name"] == name) {
        e["size"] = bytes.size();
        e["xxh64"] = hex;
      }
    }
    return m.dump(1) + "\n";
  }

  std::vector<std::pair<std::string, std::string>> files_;  // path under ROOT, seed bytes
};

// ---- safetensors file --------------------------------------------------------------------------

class SafetensorsTarget : public FileTarget {
 public:
  static Result<std::unique_ptr<FileTarget>> Make(const std::string& scratch) {
    const std::string dir = scratch + "/safetensors";
    STRATA_RETURN_IF_ERROR(MakeDirs(dir));
    const std::string seed = scratch + "/seed.safetensors";
    STRATA_RETURN_IF_ERROR(WriteSafetensors(seed,
                                            {{"model.embed.weight", "F32", {2, 3}},
                                             {"layers.0.norm", "BF16", {4}},
                                             {"layers.0.proj", "F16", {2, 2}},
                                             {"step", "I64", {}},
                                             {"empty", "U8", {0, 5}},
                                             {"mask", "BOOL", {3}},
                                             {"scale", "F8_E4M3", {2}}},
                                            {{"format", "pt"}}));
    std::unique_ptr<SafetensorsTarget> t(new SafetensorsTarget(dir));
    t->seed_ = ReadWhole(seed);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(t->seed_[i]);
    t->data_bytes_ = t->seed_.size() - 8 - n;
    return std::unique_ptr<FileTarget>(std::move(t));
  }

  std::vector<std::string> Seeds() const override { return {seed_}; }

  // `fix`: the length prefix is set to what lies between it and the seed's tensor data, as if
  // only the JSON header had been mutated.
  Status Run(size_t, std::string_view bytes, bool fix) override {
    std::string file(bytes);
    if (fix && file.size() >= 8) {
      const uint64_t n = file.size() - 8 >= data_bytes_ ? file.size() - 8 - data_bytes_ : 0;
      for (int i = 0; i < 8; ++i) file[i] = static_cast<char>(n >> (8 * i));
    }
    STRATA_RETURN_IF_ERROR(WriteFile(runtime::kHfWeightsName, file));
    std::map<std::string, std::string> metadata;
    STRATA_RETURN_IF_ERROR(
        runtime::ReadSafetensorsIndex(dir() + "/" + runtime::kHfWeightsName, &metadata).status());
    return OpenAndReadHf(dir());
  }

 private:
  explicit SafetensorsTarget(std::string dir) : FileTarget(std::move(dir)) {}
  std::string seed_;
  uint64_t data_bytes_ = 0;
};

// ---- Hugging Face sharded index ----------------------------------------------------------------

class HfIndexTarget : public FileTarget {
 public:
  static Result<std::unique_ptr<FileTarget>> Make(const std::string& scratch) {
    const std::string dir = scratch + "/hf";
    STRATA_RETURN_IF_ERROR(MakeDirs(dir));
    const char* shard1 = "model-00001-of-00002.safetensors";
    const char* shard2 = "model-00002-of-00002.safetensors";
    STRATA_RETURN_IF_ERROR(WriteSafetensors(dir + "/" + shard1,
                                            {{"model.embed_tokens.weight", "BF16", {4, 2}},
                                             {"model.layers.0.input_layernorm.weight", "F32", {2}}},
                                            {{"format", "pt"}}));
    STRATA_RETURN_IF_ERROR(WriteSafetensors(
        dir + "/" + shard2, {{"model.norm.weight", "F16", {2}}, {"lm_head.weight", "F32", {4, 2}}},
        {{"format", "pt"}}));
    // As transformers' save_pretrained writes it (sorted keys, indent 2).
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", 64}};
    index["weight_map"] = {{"lm_head.weight", shard2},
                           {"model.embed_tokens.weight", shard1},
                           {"model.layers.0.input_layernorm.weight", shard1},
                           {"model.norm.weight", shard2}};
    std::unique_ptr<HfIndexTarget> t(new HfIndexTarget(dir));
    t->seed_ = index.dump(2) + "\n";
    return std::unique_ptr<FileTarget>(std::move(t));
  }

  std::vector<std::string> Seeds() const override { return {seed_}; }

  Status Run(size_t, std::string_view bytes, bool) override {
    STRATA_RETURN_IF_ERROR(WriteFile(runtime::kHfWeightsIndexName, bytes));
    return OpenAndReadHf(dir());
  }

 private:
  explicit HfIndexTarget(std::string dir) : FileTarget(std::move(dir)) {}
  std::string seed_;
};

}  // namespace

std::string CheckStatus(const Status& s, std::string_view source) {
  if (s.ok()) return "";
  const int code = static_cast<int>(s.code());
  if (code <= 0 || code > static_cast<int>(StatusCode::kInternal)) {
    return "unknown status code " + std::to_string(code) + ": " + std::string(s.message());
  }
  if (s.code() == StatusCode::kInternal) return "an internal error: " + s.ToString();
  if (s.message().empty()) return "an error without a message (" + s.ToString() + ")";
  if (s.message().find(source) == std::string_view::npos) {
    return "a message that does not name " + std::string(source) + ": " + s.ToString();
  }
  return "";
}

Status RunConfig(std::string_view text) {
  runtime::ParseOptions options;
  options.source = kConfigSource;
  options.auto_values = runtime::DefaultAutoValues();  // "auto" resolves as `strata train` does
  return runtime::ParseConfig(text, options).status();
}

FileTarget::~FileTarget() = default;

Status FileTarget::RunEncoded(std::string_view data) {
  if (data.empty()) return Run(0, data, false);
  const uint8_t selector = static_cast<uint8_t>(data[0]);
  return Run(selector & 0x7f, data.substr(1), (selector & 0x80) != 0);
}

Status FileTarget::WriteFile(const std::string& name, std::string_view bytes) const {
  const std::string path = dir_ + "/" + name;
  STRATA_RETURN_IF_ERROR(MakeDirs(fs::path(path).parent_path().string()));
  // A new file, not a truncated one: ext4 flushes a file truncated and rewritten (auto_da_alloc),
  // which would make every case wait for the disk.
  std::error_code ec;
  fs::remove(path, ec);
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_WRONLY | O_CREAT | O_EXCL));
  STRATA_RETURN_IF_ERROR(WriteFully(fd.get(), bytes.data(), bytes.size(), path));
  return fd.Close(path);
}

Result<std::unique_ptr<FileTarget>> MakeCheckpointTarget(const std::string& scratch) {
  return CheckpointTarget::Make(scratch);
}
Result<std::unique_ptr<FileTarget>> MakeSafetensorsTarget(const std::string& scratch) {
  return SafetensorsTarget::Make(scratch);
}
Result<std::unique_ptr<FileTarget>> MakeHfIndexTarget(const std::string& scratch) {
  return HfIndexTarget::Make(scratch);
}

std::vector<std::string> ReadCorpus(const std::string& dir) {
  std::vector<std::string> paths;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file()) paths.push_back(e.path().string());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<std::string> out;
  for (const std::string& p : paths) out.push_back(ReadWhole(p));
  return out;
}

std::vector<std::string> QuotedStrings(const std::vector<std::string>& inputs) {
  std::set<std::string> found;
  for (const std::string& s : inputs) {
    for (size_t i = s.find('"'); i != std::string::npos && found.size() < 2000;) {
      size_t end = i + 1;
      while (end < s.size() && s[end] != '"') end += s[end] == '\\' ? 2 : 1;
      if (end >= s.size()) break;
      if (end - i < 80) found.insert(s.substr(i, end - i + 1));
      i = s.find('"', end + 1);
    }
  }
  return {found.begin(), found.end()};
}

}  // namespace strata::fuzz
