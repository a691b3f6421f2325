// The Hugging Face export of a model: see model_export.h. Weights stream unit by unit from the
// engine (VisitParameters gathers them, across ranks when there are several) into the shard
// writer (runtime/persist/hf_export.h) on rank 0; config.json and the tokenizer files follow.
#include "runtime/commands/model_export.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/dtype.h"
#include "base/file_util.h"
#include "base/logging.h"
#include "runtime/commands/save_dir.h"
#include "runtime/engine/engine.h"
#include "runtime/models/causal_lm.h"
#include "runtime/persist/hf_export.h"

namespace strata::runtime {
namespace {

// The files of a Hugging Face directory that describe its tokenizer and generation, copied by an
// export (the weights and config.json are written anew).
bool IsTokenizerFile(const std::string& name) {
  return name.starts_with("tokenizer") || name == "special_tokens_map.json" ||
         name == "added_tokens.json" || name == "generation_config.json" || name == "vocab.json" ||
         name == "merges.txt" || name == "chat_template.jinja";
}

// Copies `from` to `to` through AtomicFileWriter (to.tmp, fsynced, renamed over `to`, the
// directory fsynced), so the copy is durable with the export and never seen half-written.
Status CopyFileAtomically(const std::filesystem::path& from, const std::filesystem::path& to) {
  Status copied = [&]() -> Status {
    STRATA_ASSIGN_OR_RETURN(UniqueFd in, OpenFile(from.string(), O_RDONLY));
    struct stat st;
    if (::fstat(in.get(), &st) != 0) return IoErrorFromErrno(errno, "stat " + from.string());
    STRATA_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(to.string()));
    std::vector<char> buffer(std::min<uint64_t>(st.st_size, uint64_t{1} << 20));
    for (uint64_t offset = 0; offset < static_cast<uint64_t>(st.st_size);) {
      const size_t n = std::min<uint64_t>(buffer.size(), st.st_size - offset);
      STRATA_RETURN_IF_ERROR(PreadFully(in.get(), offset, buffer.data(), n, from.string()));
      STRATA_RETURN_IF_ERROR(out.Append(buffer.data(), n));
      offset += n;
    }
    return out.Commit();
  }();
  return std::move(copied).WithContext("copying " + from.string() + " to " + to.string());
}

}  // namespace

Status CheckHfExport(const CausalLm& lm, const std::string& model, const ExportOptions& eo) {
  if (lm.HfConfig().is_null()) {
    return InvalidArgumentError(
        "--export writes a Hugging Face directory, for Llama-family "
        "models; " +
        model +
        " is a GPT preset (its --save "
        "writes model.safetensors)");
  }
  if (eo.dir.empty()) return InvalidArgumentError("--export needs a directory");
  STRATA_RETURN_IF_ERROR(CheckOutsideModelDir(eo.dir, lm.hf_dir(), "--export"));
  if (!eo.dtype.empty()) STRATA_RETURN_IF_ERROR(ParseDType(eo.dtype).status());
  return ParseShardSize(eo.max_shard_size).status();
}

Status ExportHf(Engine& engine, const CausalLm& lm, const std::string& model, int rank, int world,
                const std::atomic<bool>* stop, const ExportOptions& eo) {
  STRATA_RETURN_IF_ERROR(CheckHfExport(lm, model, eo));
  nlohmann::json hf_config = lm.HfConfig();
  std::string forced;
  if (!eo.dtype.empty()) {
    STRATA_ASSIGN_OR_RETURN(DType d, ParseDType(eo.dtype));
    forced = d == DType::kBFloat16 ? "BF16" : d == DType::kFloat16 ? "F16" : "F32";
  }
  STRATA_ASSIGN_OR_RETURN(uint64_t max_shard, ParseShardSize(eo.max_shard_size));
  if (rank != 0) {  // ranks gather the weights together; rank 0 writes them
    return engine.VisitParameters(
        [](const std::string&, const std::vector<int64_t>&, const float*) { return Status::Ok(); });
  }
  Stopwatch w;
  auto numel = [](const std::vector<int64_t>& shape) {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  };
  std::vector<HfExportTensor> tensors;
  std::map<std::string, uint64_t> dtype_elements;
  for (auto& [name, shape] : engine.ParameterOrder()) {
    const std::string dtype = forced.empty() ? lm.ExportDtype(name) : forced;
    dtype_elements[dtype] += numel(shape);
    tensors.push_back({name, dtype, shape});
  }
  Result<std::unique_ptr<HfExportWriter>> writer =
      HfExportWriter::Create(eo.dir, std::move(tensors), max_shard);
  if (!writer.ok()) {
    // With ranks the others are gathering the weights with this one: take part, then fail.
    if (world > 1) {
      engine
          .VisitParameters([](const std::string&, const std::vector<int64_t>&, const float*) {
            return Status::Ok();
          })
          .IgnoreError();  // the writer's error is the one to report
    }
    return writer.status();
  }
  STRATA_RETURN_IF_ERROR(engine.VisitParameters(
      [&](const std::string& name, const std::vector<int64_t>& shape, const float* values) {
        // Abandoned before Finish, the export leaves its directory as it was (hf_export.h).
        if (world == 1 && stop != nullptr && stop->load()) {
          STRATA_LOG(kWarning) << "interrupted while exporting to " << eo.dir
                               << ": stopping, the directory left as it was";
          return CancelledError("interrupted while exporting");
        }
        return (*writer)->WriteFloat32(name, values, numel(shape));
      }));
  STRATA_RETURN_IF_ERROR((*writer)->Finish());
  // config.json: the input's, torch_dtype naming the dtype most parameters are written in.
  std::string main_dtype = "F32";
  for (const auto& [d, n] : dtype_elements) {
    if (n > dtype_elements[main_dtype]) main_dtype = d;
  }
  hf_config["torch_dtype"] = main_dtype == "BF16"  ? "bfloat16"
                             : main_dtype == "F16" ? "float16"
                                                   : "float32";
  if (hf_config.contains("dtype")) hf_config["dtype"] = hf_config["torch_dtype"];
  const std::filesystem::path out(eo.dir);
  STRATA_RETURN_IF_ERROR(WriteFileAtomically(eo.dir, "config.json", hf_config.dump(2) + "\n"));
  int copied = 0;
  if (!lm.hf_dir().empty()) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(lm.hf_dir(), ec)) {
      const std::string name = entry.path().filename().string();
      if (!entry.is_regular_file() || !IsTokenizerFile(name)) continue;
      if (std::filesystem::equivalent(entry.path(), out / name, ec)) continue;
      STRATA_RETURN_IF_ERROR(CopyFileAtomically(entry.path(), out / name));
      ++copied;
    }
  }
  STRATA_LOG(kInfo) << "exported " << (*writer)->files().size() << " safetensors file(s), "
                    << "config.json and " << copied << " tokenizer file(s) to " << eo.dir << " in "
                    << w.Seconds() << " s";
  return Status::Ok();
}

}  // namespace strata::runtime
