// A model directory's tokenizer as Hugging Face's transformers loads it (AutoTokenizer, which runs
// the `tokenizers` library for tokenizer.json), in a Python process of its own that this class
// starts and talks to over a socket (the protocol is in hf_tokenizer_helper.py, which is compiled
// into strata). strata never reimplements a tokenizer: these are transformers' ids, BOS/EOS rules
// and chat templates exactly.
//
// Which Python: $STRATA_PYTHON when set, else the interpreter strata was configured with (the
// project venv of scripts/setup.sh, when it still exists), else python3 on PATH; the first that
// imports transformers and tokenizers is used. Start's error says what each one lacked and how to
// install the packages.
//
// The process runs in a process group of its own (a Ctrl-C meant for strata does not kill it), and
// ends when this object closes its end of the socket (destructor), or when strata exits.
//
// Thread-safety: every method may be called from any thread; requests are serialized (one
// process, one request at a time).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace strata::runtime {

// What the tokenizer told at start-up.
struct HfTokenizerFacts {
  std::string tokenizer_class;  // "PreTrainedTokenizerFast", "Qwen2TokenizerFast", ...
  std::string versions;         // "transformers 5.17.0, tokenizers 0.23.2"
  std::string python;           // the interpreter that runs it
  int32_t vocab_size = 0;       // len(tokenizer): the base vocabulary plus added tokens
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;          // tokenizer(text) starts with bos_id
  bool add_eos = false;          // tokenizer(text) ends with eos_id
  bool chat_template = false;    // apply_chat_template can render messages
  bool generation_tags = false;  // the template marks assistant text ({% generation %})
};

// One rendered conversation: apply_chat_template's ids and, per id, whether it is part of an
// assistant turn (what a chat record trains on).
struct ChatTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> assistant;
};

class HfTokenizer {
 public:
  // Starts the process for `model_dir`. kUnavailable when no Python with transformers and
  // tokenizers is found (naming each interpreter tried and what it lacked); kInvalidArgument when
  // transformers cannot load the directory's tokenizer (its message).
  static Result<std::unique_ptr<HfTokenizer>> Start(const std::string& model_dir);

  ~HfTokenizer();
  HfTokenizer(const HfTokenizer&) = delete;
  HfTokenizer& operator=(const HfTokenizer&) = delete;

  // tokenizer(text)["input_ids"], appended to `ids`. kInvalidArgument for text that is not UTF-8
  // or that the tokenizer refuses; kInternal when the process died (its exit status).
  Status EncodeAppend(std::string_view text, std::vector<int32_t>* ids) const;
  // tokenizer.decode(ids, skip_special_tokens=True).
  Result<std::string> Decode(const std::vector<int64_t>& ids) const;
  // `messages_json`: a JSON object {"messages": [{"role": ..., "content": ...}, ...]}, rendered
  // with apply_chat_template. kInvalidArgument for a malformed conversation, one without an
  // assistant turn, a tokenizer without a chat template, or one whose template renders earlier
  // turns differently once later ones follow (the message says which).
  Result<ChatTokens> EncodeChat(std::string_view messages_json) const;

  const HfTokenizerFacts& facts() const { return facts_; }

 private:
  HfTokenizer() = default;
  // One request and its reply payload. REQUIRES: mu_ held.
  Result<std::string> Call(char op, std::string_view payload) const;
  Status Died(const std::string& what) const;

  HfTokenizerFacts facts_;
  std::string model_dir_;
  mutable std::mutex mu_;
  int fd_ = -1;     // our end of the socket
  pid_t pid_ = -1;  // the helper process
  mutable bool dead_ = false;
};

// The helper's source (hf_tokenizer_helper.py), for tests that run it directly.
std::string_view HfTokenizerHelperSource();

}  // namespace strata::runtime
