// `strata tokenize`: turns a .jsonl ("text" per line) or .txt (a record per line) file into the
// .bin of token ids that `strata train --data` reads without tokenizing again, with the model
// directory's tokenizer (runtime/data/tokenizer.h), following run_clm.py (runtime/data/token_data.h
// has the rules). The ids are uint16 when config.json's vocab_size <= 65536, else uint32, as
// TokenData reads a .bin by default. The output is written to OUT.tmp, fsynced and renamed over
// OUT, so an interrupted run leaves no partial .bin behind.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/file_util.h"
#include "base/json_text.h"
#include "runtime/commands/command.h"
#include "runtime/commands/commands.h"
#include "runtime/commands/flag_checks.h"
#include "runtime/data/sft_data.h"
#include "runtime/data/token_data.h"
#include "runtime/data/tokenizer.h"

namespace strata::runtime {
namespace {

using nlohmann::json;

static_assert(std::endian::native == std::endian::little, ".bin token files are little-endian");

// config.json's "vocab_size" in `model_dir`; errors name the file.
Result<int64_t> ReadVocabSize(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  Result<json> read = ReadJsonFile(path);
  if (read.status().code() == StatusCode::kNotFound) {
    return NotFoundError(path + ": no such file (--model must be a Hugging Face model directory)");
  }
  STRATA_ASSIGN_OR_RETURN(const json config, std::move(read));
  auto it = config.is_object() ? config.find("vocab_size") : config.end();
  if (it == config.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) {
    return InvalidArgumentError(path + ": no positive integer \"vocab_size\"");
  }
  return it->get<int64_t>();
}

// Writes `ids` as little-endian integers of `width` bytes (2 or 4; every id fits, TokenizeTextFile
// checked them against vocab_size) to `path` through AtomicFileWriter (`path`.tmp, fsynced and
// renamed over `path`): readers see the old file or the whole new one. `path`.tmp is removed on
// failure.
Status WriteIds(const std::vector<uint32_t>& ids, int width, const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(path));
  constexpr size_t kChunk = 1 << 20;  // ids per write
  std::vector<uint16_t> narrow;
  for (size_t begin = 0; begin < ids.size(); begin += kChunk) {
    const size_t n = std::min(kChunk, ids.size() - begin);
    if (width == 4) {
      STRATA_RETURN_IF_ERROR(out.Append(ids.data() + begin, n * 4));
      continue;
    }
    narrow.assign(ids.begin() + begin, ids.begin() + begin + n);
    STRATA_RETURN_IF_ERROR(out.Append(narrow.data(), n * 2));
  }
  return out.Commit();
}

// "\r[#####.....] 12.0 MiB / 40.0 MiB" on stderr.
void DrawProgress(uint64_t done, uint64_t total) {
  constexpr int kWidth = 30;
  const int filled = total == 0 ? kWidth : static_cast<int>(kWidth * done / total);
  std::fprintf(stderr, "\r[%s%s] %s / %s   ", std::string(filled, '#').c_str(),
               std::string(kWidth - filled, '.').c_str(), FormatBytes(done).c_str(),
               FormatBytes(total).c_str());
  std::fflush(stderr);
}

class TokenizeCommand final : public Command {
 public:
  TokenizeCommand()
      : Command("tokenize",
                "Tokenize a .jsonl or .txt file with a model's tokenizer into a .bin of "
                "token ids for `strata train --data`") {}
  void AddFlags(CLI::App& cmd) override {
    cmd.add_option("--model", model_dir_,
                   "Hugging Face model directory (tokenizer.json or tokenizer.model, config.json)")
        ->required()
        ->check(flags::InputDirectory());
    cmd.add_option("--input", input_,
                   ".jsonl (a \"text\" field per line, or SFT prompt/completion or chat "
                   "\"messages\" records) or .txt (a record per line)")
        ->required()
        ->check(flags::InputFile());
    cmd.add_option("--output", output_,
                   "The .bin to write (uint16 ids when vocab_size <= 65536, else uint32); for SFT "
                   "or chat records a .jsonl of {\"input_ids\", \"loss_mask\"} per record")
        ->required()
        ->check(flags::OutputFile());
  }
  Status Run(CommandContext& ctx, json& result) override;
  void PrintText(const json& r, std::FILE* out) const override {
    std::fprintf(out, "%s: %llu tokens (%s) from %llu records in %.1f s\n",
                 r["output"].get<std::string>().c_str(),
                 static_cast<unsigned long long>(r["tokens"].get<uint64_t>()),
                 r["dtype"].get<std::string>().c_str(),
                 static_cast<unsigned long long>(r["records"].get<uint64_t>()),
                 r["seconds"].get<double>());
  }

 private:
  Status TokenizeText(int64_t vocab_size, json& result) const;
  Status TokenizeRecords(int64_t vocab_size, json& result) const;

  std::string model_dir_;
  std::string input_;
  std::string output_;
};

Status TokenizeCommand::Run(CommandContext& /*ctx*/, json& result) {
  const auto start = std::chrono::steady_clock::now();
  STRATA_ASSIGN_OR_RETURN(const bool sft, IsSftFile(input_));
  const std::string want = sft ? ".jsonl" : ".bin";
  if (std::filesystem::path(output_).extension() != want) {
    return InvalidArgumentError(
        "--output " + output_ + ": must end in " + want +
        (sft ? " (SFT and chat records are written as {\"input_ids\", \"loss_mask\"} lines)"
             : " (the extension `strata train --data` reads as token ids)"));
  }
  STRATA_ASSIGN_OR_RETURN(const int64_t vocab_size, ReadVocabSize(model_dir_));
  if (sft) {
    STRATA_RETURN_IF_ERROR(TokenizeRecords(vocab_size, result));
  } else {
    STRATA_RETURN_IF_ERROR(TokenizeText(vocab_size, result));
  }
  result["output"] = output_;
  result["seconds"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::Ok();
}

Status TokenizeCommand::TokenizeText(int64_t vocab_size, json& result) const {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Open(model_dir_));
  const bool bar = isatty(STDERR_FILENO) != 0;
  TokenizeProgress progress;
  if (bar) progress = DrawProgress;
  Result<TextTokens> tokens = TokenizeTextFile(input_, *tokenizer, vocab_size, progress);
  if (bar) std::fprintf(stderr, "\n");
  if (!tokens.ok()) return tokens.status();
  if (tokens->records == 0) {
    return InvalidArgumentError(input_ + ": no records (the file is empty or all blank lines)");
  }
  const std::string dtype(DefaultBinDtype(vocab_size));
  STRATA_RETURN_IF_ERROR(WriteIds(tokens->ids, dtype == "uint16" ? 2 : 4, output_));
  result["tokens"] = tokens->ids.size();
  result["dtype"] = dtype;
  result["records"] = tokens->records;
  result["tokenizer"] = tokenizer->backend();
  return Status::Ok();
}

// SFT and chat records: one line per record, {"input_ids": [...], "loss_mask": [...]} (1 where the
// token is trained on: a completion or assistant token), written atomically as the .bin is.
Status TokenizeCommand::TokenizeRecords(int64_t vocab_size, json& result) const {
  SftDataOptions o;
  o.path = input_;
  o.model_dir = model_dir_;
  o.vocab_size = vocab_size;
  SftSummary summary;
  STRATA_ASSIGN_OR_RETURN(const SftRecords records, ReadSftRecords(o, &summary));
  STRATA_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::Create(output_));
  for (uint64_t r = 0; r < records.count(); ++r) {
    const auto b = records.begin[r], e = records.begin[r + 1];
    const json line = {
        {"input_ids", std::vector<uint32_t>(records.ids.begin() + b, records.ids.begin() + e)},
        {"loss_mask",
         std::vector<int>(records.completion.begin() + b, records.completion.begin() + e)}};
    const std::string text = line.dump() + "\n";
    STRATA_RETURN_IF_ERROR(out.Append(text.data(), text.size()));
  }
  STRATA_RETURN_IF_ERROR(out.Commit());
  result["tokens"] = summary.tokens;
  result["dtype"] = "jsonl";
  result["records"] = summary.records;
  result["trained_tokens"] = summary.completion_tokens;
  result["kind"] = summary.kind;
  return Status::Ok();
}

}  // namespace

std::unique_ptr<Command> NewTokenizeCommand() { return std::make_unique<TokenizeCommand>(); }

}  // namespace strata::runtime
