// SFT data (sft_data.h): the file is read line by line into one flat vector of token ids with a
// completion flag per token and the offset of each record; rows are cut from it on demand (a
// record, or a window), the targets of non-completion tokens replaced by kIgnoredTarget.
#include "runtime/data/sft_data.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>
#include <vector>

#include "base/json_text.h"
#include "runtime/data/hf_tokenizer.h"
#include "runtime/data/tokenizer.h"
#include "runtime/data/windows.h"

namespace strata::runtime {
namespace {

constexpr JsonReadOptions kRecordOptions{.max_bytes = std::numeric_limits<uint64_t>::max()};

enum class Kind { kNone, kText, kPromptText, kPromptIds, kMessages };

std::string KindName(Kind k) {
  switch (k) {
    case Kind::kText:
      return "\"text\"";
    case Kind::kPromptText:
      return "prompt/completion";
    case Kind::kPromptIds:
      return "prompt_ids/completion_ids";
    case Kind::kMessages:
      return "chat (\"messages\")";
    case Kind::kNone:
      break;
  }
  return "empty";
}

// The kind of one record, as TRL tells them apart: prompt keys win over "text".
Kind KindOf(const nlohmann::json& j) {
  if (!j.is_object()) return Kind::kNone;
  if (j.contains("messages")) return Kind::kMessages;
  if (j.contains("prompt_ids") || j.contains("completion_ids")) return Kind::kPromptIds;
  if (j.contains("prompt") || j.contains("completion")) return Kind::kPromptText;
  if (j.contains("text")) return Kind::kText;
  return Kind::kNone;
}

bool IsBlank(const std::string& line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string::npos;
}

bool IsJsonl(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".jsonl";
}

// The ids of `key` in `j`: a list of integers in [0, vocab).
Status ReadIds(const nlohmann::json& j, const char* key, int64_t vocab, const std::string& at,
               std::vector<int32_t>* out) {
  auto it = j.find(key);
  if (it == j.end()) return InvalidArgumentError(at + "no \"" + key + "\" field");
  if (!it->is_array()) {
    return InvalidArgumentError(at + "\"" + key + "\" is not a list of token ids");
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& v = (*it)[i];
    const std::string which = "\"" + std::string(key) + "\"[" + std::to_string(i) + "]";
    if (!v.is_number_integer()) {
      return InvalidArgumentError(at + which + " is " + v.dump() + ", not a token id");
    }
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= vocab) {
      return InvalidArgumentError(at + which + " is " + std::to_string(id) +
                                  ", not in [0, the model's vocab_size " + std::to_string(vocab) +
                                  ")");
    }
    out->push_back(static_cast<int32_t>(id));
  }
  return Status::Ok();
}

Status ReadString(const nlohmann::json& j, const char* key, const std::string& at,
                  std::string* out) {
  auto it = j.find(key);
  if (it == j.end()) return InvalidArgumentError(at + "no \"" + key + "\" field");
  if (!it->is_string()) return InvalidArgumentError(at + "\"" + key + "\" is not a string");
  *out = it->get<std::string>();
  return Status::Ok();
}

std::string Hex(uint64_t h) {
  std::ostringstream out;
  out << std::hex << h;
  return out.str();
}

// A chat record: the conversation rendered with the model's chat template, trained on its
// assistant tokens only. Appends the record to `r` and counts its assistant tokens.
Status AppendChat(const Tokenizer& tokenizer, const nlohmann::json& j, int64_t vocab,
                  const std::string& at, SftRecords* r, uint64_t* assistant_tokens) {
  const nlohmann::json request = {{"messages", j["messages"]}};
  Result<ChatTokens> chat = tokenizer.EncodeChat(request.dump());
  if (!chat.ok()) return Status(chat.status().code(), at + std::string(chat.status().message()));
  if (chat->ids.size() != chat->assistant.size()) {
    return InternalError(at + "the chat's mask and ids differ in length");
  }
  uint64_t trained = 0;
  for (size_t i = 0; i < chat->ids.size(); ++i) {
    const int32_t id = chat->ids[i];
    if (id < 0 || id >= vocab) {
      return InvalidArgumentError(at + "token " + std::to_string(i) + " is " + std::to_string(id) +
                                  ", not below the model's vocab_size " + std::to_string(vocab) +
                                  " (" + tokenizer.model_path() + " does not match the model)");
    }
    trained += chat->assistant[i] != 0;
  }
  if (trained == 0) {
    return InvalidArgumentError(at + "the rendered chat has no assistant token to train on");
  }
  *assistant_tokens = trained;
  for (size_t i = 0; i < chat->ids.size(); ++i) {
    r->ids.push_back(static_cast<uint32_t>(chat->ids[i]));
    r->completion.push_back(chat->assistant[i] != 0 ? 1 : 0);
  }
  r->begin.push_back(r->ids.size());
  return Status::Ok();
}

class SftData final : public TrainingData {
 public:
  SftData(SftRecords records, bool packing, uint64_t seed, int64_t pad_id, uint64_t samples)
      : r_(std::move(records)), packing_(packing), pad_id_(pad_id), sampler_(samples, seed) {}

  uint64_t Windows(int seq) const override {
    return packing_ ? WindowCount(r_.ids.size(), seq) : r_.count();
  }
  bool Masked() const override { return true; }

  Status Train(int rows, int seq, uint64_t first_sample, int64_t* x, int64_t* y) const override {
    for (int row = 0; row < rows; ++row) {
      FillRow(sampler_.Sample(first_sample + row), seq, x + static_cast<size_t>(row) * seq,
              y + static_cast<size_t>(row) * seq);
    }
    return Status::Ok();
  }

  Status Eval(int rows, int seq, uint64_t first, int64_t* x, int64_t* y) const override {
    for (int row = 0; row < rows; ++row) {
      FillRow(first + row, seq, x + static_cast<size_t>(row) * seq,
              y + static_cast<size_t>(row) * seq);
    }
    return Status::Ok();
  }

  std::string Fingerprint() const override {
    std::string bytes(reinterpret_cast<const char*>(r_.ids.data()), r_.ids.size() * 4);
    bytes.append(reinterpret_cast<const char*>(r_.completion.data()), r_.completion.size());
    bytes.append(reinterpret_cast<const char*>(r_.begin.data()), r_.begin.size() * 8);
    return std::to_string(r_.count()) + " SFT records, " + std::to_string(r_.ids.size()) +
           " tokens, " + (packing_ ? "packed" : "padded") + ", hash " +
           Hex(std::hash<std::string>()(bytes));
  }

 private:
  // Sample `s` (a record, or a window) into one row. REQUIRES: packed, seq is the seq_len the
  // data was opened with.
  void FillRow(uint64_t s, int seq, int64_t* x, int64_t* y) const {
    uint64_t b, n;  // the row's tokens: [b, b + n)
    if (packing_) {
      b = s * (static_cast<uint64_t>(seq) + 1);
      n = static_cast<uint64_t>(seq) + 1;
    } else {
      b = r_.begin[s];
      n = std::min<uint64_t>(r_.begin[s + 1] - b, static_cast<uint64_t>(seq) + 1);
    }
    for (uint64_t t = 0; t < static_cast<uint64_t>(seq); ++t) {
      x[t] = t < n ? static_cast<int64_t>(r_.ids[b + t]) : pad_id_;
      y[t] = t + 1 < n && r_.completion[b + t + 1] != 0 ? static_cast<int64_t>(r_.ids[b + t + 1])
                                                        : kIgnoredTarget;
    }
  }

  const SftRecords r_;
  const bool packing_;
  const int64_t pad_id_;
  const WindowSampler sampler_;
};

}  // namespace

Result<bool> IsSftFile(const std::string& path) {
  if (!IsJsonl(path)) return false;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return NotFoundError(path + ": no such file");
    return IoErrorFromErrno(errno, "reading " + path);
  }
  uint64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (IsBlank(line)) continue;
    Result<nlohmann::json> j = ParseJsonText(line, path, kRecordOptions);
    if (!j.ok()) return false;  // the text readers report it (GPT models read the bytes)
    const Kind k = KindOf(*j);
    return k == Kind::kPromptText || k == Kind::kPromptIds || k == Kind::kMessages;
  }
  return false;
}

Result<SftRecords> ReadSftRecords(const SftDataOptions& o, SftSummary* summary) {
  const std::string& path = o.path;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return NotFoundError(path + ": no such file");
    return IoErrorFromErrno(errno, "reading " + path);
  }
  SftRecords r;
  SftSummary s;
  Kind kind = Kind::kNone;
  uint64_t kind_line = 0;
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<int32_t> prompt, whole;
  std::string prompt_text, completion_text;
  uint64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (IsBlank(line)) continue;
    const std::string at = path + " line " + std::to_string(line_no) + ": ";
    STRATA_ASSIGN_OR_RETURN(
        nlohmann::json j,
        ParseJsonText(line, path + " line " + std::to_string(line_no), kRecordOptions));
    const Kind k = KindOf(j);
    if (k == Kind::kNone) {
      return InvalidArgumentError(
          at +
          "expected a JSON object with \"prompt\" and \"completion\" (text), "
          "\"prompt_ids\" and \"completion_ids\" (token ids), or \"messages\" (a chat)");
    }
    if (kind == Kind::kNone) {
      kind = k;
      kind_line = line_no;
      if (kind == Kind::kPromptText) {
        if (o.model_dir.empty()) {
          return InvalidArgumentError(
              at +
              "prompt/completion text needs the model's tokenizer: give a Hugging Face "
              "model directory with its tokenizer, or write prompt_ids/completion_ids");
        }
        STRATA_ASSIGN_OR_RETURN(tokenizer, Tokenizer::Open(o.model_dir));
      } else if (kind == Kind::kMessages) {
        if (o.model_dir.empty()) {
          return InvalidArgumentError(at +
                                      "chat records need the model's tokenizer and chat "
                                      "template: give a Hugging Face model directory");
        }
        STRATA_ASSIGN_OR_RETURN(tokenizer, Tokenizer::Open(o.model_dir, /*need_chat=*/true));
      }
    } else if (k != kind) {
      return InvalidArgumentError(at + "a " + KindName(k) + " record, but line " +
                                  std::to_string(kind_line) + " is a " + KindName(kind) +
                                  " record: a file holds one kind of record");
    }
    prompt.clear();
    whole.clear();
    if (kind == Kind::kMessages) {
      uint64_t assistant_tokens = 0;
      STRATA_RETURN_IF_ERROR(AppendChat(*tokenizer, j, o.vocab_size, at, &r, &assistant_tokens));
      s.completion_tokens += assistant_tokens;
      continue;
    }
    if (kind == Kind::kPromptIds) {
      STRATA_RETURN_IF_ERROR(ReadIds(j, "prompt_ids", o.vocab_size, at, &prompt));
      STRATA_RETURN_IF_ERROR(ReadIds(j, "completion_ids", o.vocab_size, at, &whole));
      if (whole.empty()) {
        return InvalidArgumentError(at + "\"completion_ids\" is empty: nothing to train on");
      }
      whole.insert(whole.begin(), prompt.begin(), prompt.end());
    } else {
      STRATA_RETURN_IF_ERROR(ReadString(j, "prompt", at, &prompt_text));
      STRATA_RETURN_IF_ERROR(ReadString(j, "completion", at, &completion_text));
      if (completion_text.empty()) {
        return InvalidArgumentError(at + "\"completion\" is empty: nothing to train on");
      }
      // TRL: ids of prompt + completion + EOS; the prompt is the first len(ids of prompt).
      STRATA_RETURN_IF_ERROR(tokenizer->EncodeAppend(prompt_text, &prompt));
      if (tokenizer->add_eos() && !prompt.empty()) prompt.pop_back();  // the prompt ends no text
      STRATA_RETURN_IF_ERROR(tokenizer->EncodeAppend(prompt_text + completion_text, &whole));
      if (!tokenizer->add_eos() && tokenizer->eos_id() >= 0) whole.push_back(tokenizer->eos_id());
      if (whole.size() < prompt.size() ||
          !std::equal(prompt.begin(), prompt.end(), whole.begin())) {
        ++s.prompt_mismatches;
      }
      if (whole.size() <= prompt.size()) {
        return InvalidArgumentError(at + "the completion adds no token to the prompt's " +
                                    std::to_string(prompt.size()));
      }
      for (size_t i = 0; i < whole.size(); ++i) {
        if (whole[i] < 0 || whole[i] >= o.vocab_size) {
          return InvalidArgumentError(
              at + "token " + std::to_string(i) + " is " + std::to_string(whole[i]) +
              ", not below the model's vocab_size " + std::to_string(o.vocab_size) + " (" +
              tokenizer->model_path() + " does not match the model)");
        }
      }
    }
    const size_t n_prompt = prompt.size();
    for (size_t i = 0; i < whole.size(); ++i) {
      r.ids.push_back(static_cast<uint32_t>(whole[i]));
      r.completion.push_back(i >= n_prompt ? 1 : 0);
    }
    r.begin.push_back(r.ids.size());
    s.completion_tokens += whole.size() - n_prompt;
  }
  if (in.bad()) return IoErrorFromErrno(errno, "reading " + path);
  if (kind == Kind::kText) {
    return InvalidArgumentError(path + " holds \"text\" records, not SFT records");
  }
  if (r.count() == 0) return InvalidArgumentError(path + ": no records");
  s.kind = KindName(kind);
  s.records = r.count();
  s.tokens = r.ids.size();
  if (summary != nullptr) *summary = s;
  return r;
}

Result<std::unique_ptr<TrainingData>> OpenSftData(const SftDataOptions& o, SftSummary* summary) {
  const std::string& path = o.path;
  if (o.seq_len <= 0) {
    return InvalidArgumentError("sequence length " + std::to_string(o.seq_len) +
                                " is not positive");
  }
  SftSummary s;
  STRATA_ASSIGN_OR_RETURN(SftRecords r, ReadSftRecords(o, &s));
  const uint64_t row = static_cast<uint64_t>(o.seq_len) + 1;
  if (o.packing) {
    s.samples = WindowCount(r.ids.size(), o.seq_len);
    if (s.samples == 0) {
      return InvalidArgumentError(
          path + ": " + std::to_string(r.ids.size()) +
          " tokens, fewer than one packed window of --seq-len + 1 = " + std::to_string(row));
    }
    s.dropped_tokens = r.ids.size() - s.samples * row;
    for (uint64_t w = 0; w < s.samples; ++w) {
      for (uint64_t t = 1; t < row; ++t) s.trained_tokens += r.completion[w * row + t];
    }
  } else {
    s.samples = r.count();
    for (uint64_t i = 0; i < r.count(); ++i) {
      const uint64_t b = r.begin[i], n = r.begin[i + 1] - b;
      uint64_t trained = 0;
      for (uint64_t t = 1; t < std::min(n, row); ++t) trained += r.completion[b + t];
      if (n > row) {
        ++s.truncated;
        for (uint64_t t = row; t < n; ++t) s.truncated_completion_tokens += r.completion[b + t];
      }
      if (trained == 0) ++s.untrained_records;
      s.trained_tokens += trained;
    }
  }
  if (s.trained_tokens == 0) {
    return InvalidArgumentError(path + ": no completion token is left to train on with --seq-len " +
                                std::to_string(o.seq_len) +
                                (o.packing ? "" : " (every record's prompt fills its row)"));
  }
  const uint64_t samples = s.samples;
  if (summary != nullptr) *summary = s;
  return std::unique_ptr<TrainingData>(
      new SftData(std::move(r), o.packing, o.seed, o.pad_id, samples));
}

}  // namespace strata::runtime
