// The tokenizer of a Hugging Face model directory, for turning training text into token ids.
//
// Two backends, chosen by what the directory ships (STRATA_TOKENIZER overrides):
//   transformers   DIR/tokenizer.json (a "fast" tokenizer: Llama 3, Qwen2, Gemma, Phi-3, Mistral,
//                  ...): transformers' AutoTokenizer, run by Hugging Face's `tokenizers` in a
//                  Python process (hf_tokenizer.h). The ids are
//                  `AutoTokenizer.from_pretrained(DIR)(text)
//                  ["input_ids"]` exactly, BOS/EOS as the tokenizer's post-processor adds them;
//                  chat records are rendered with its chat template.
//   sentencepiece  DIR/tokenizer.model alone, the file the "slow" Hugging Face tokenizers
//                  (LlamaTokenizer, GemmaTokenizer, ...) load: SentencePiece's ids of the text with
//                  the BOS id in front when tokenizer_config.json says "add_bos_token" (true when
//                  absent) and the EOS id at the end when it says "add_eos_token" (false when
//                  absent), as `tokenizer(text)["input_ids"]` of the slow tokenizer. One
//                  difference: text that spells a special token ("<s>") is encoded as ordinary
//                  text, as SentencePiece does (transformers' split_special_tokens=True).
// STRATA_TOKENIZER=transformers uses transformers for a tokenizer.model directory too;
// STRATA_TOKENIZER=sentencepiece uses tokenizer.model even where tokenizer.json exists.
//
// SentencePiece itself is not linked: Open loads libstrata_sentencepiece.so, built and installed
// with strata (lib/strata), with dlopen (Note [SentencePiece is loaded apart] in
// sentencepiece_shim.h explains why), looking next to the program (or the shared library that
// links strata), in ../lib/strata from it, then on its library path (RUNPATH, LD_LIBRARY_PATH);
// the environment variable STRATA_SENTENCEPIECE_SHIM overrides that. When it cannot be loaded,
// Open is kUnavailable naming each place it looked.
//
// Thread-safety: after Open, every method is const and may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

struct StrataSentencePieceApi;  // sentencepiece_shim.h

namespace strata::runtime {

class HfTokenizer;  // hf_tokenizer.h
struct ChatTokens;

class Tokenizer {
 public:
  // Opens the directory's tokenizer (the backend as the file comment says). kNotFound naming the
  // directory when it has neither tokenizer.json nor tokenizer.model; kUnavailable when a
  // tokenizer.json needs a Python with transformers and none is found (saying how to install
  // it); kInvalidArgument when transformers cannot load it, or for a tokenizer_config.json that is
  // not JSON or names a bos/eos token that a SentencePiece model does not have (naming the file).
  // `need_chat`: chat records will be encoded, so the transformers backend is used whatever the
  // directory ships (SentencePiece has no chat templates).
  static Result<std::unique_ptr<Tokenizer>> Open(const std::string& model_dir,
                                                 bool need_chat = false);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // The ids of one record: [BOS] + SentencePiece's ids of `text` + [EOS], BOS and EOS only as
  // add_bos()/add_eos() say. Errors only if SentencePiece fails (kInternal; `ids` is then as it
  // was).
  Result<std::vector<int32_t>> Encode(std::string_view text) const;
  // Encode, appending to `ids` (the form the data loaders use).
  Status EncodeAppend(std::string_view text, std::vector<int32_t>* ids) const;

  // The text of generated ids, as transformers' tokenizer.decode(ids, skip_special_tokens=True)
  // gives it (SentencePiece: its decoding, which drops its control pieces <s>, </s>; ids outside
  // tokenizer.model, added tokens, are skipped too). Errors only if the backend fails
  // (kInternal).
  Result<std::string> Decode(const std::vector<int64_t>& ids) const;

  // A chat record {"messages": [...]} (TRL's conversational format) rendered with the model's
  // chat template, and its assistant tokens (hf_tokenizer.h). kFailedPrecondition on the
  // SentencePiece backend (Open with need_chat); kInvalidArgument for a bad conversation.
  Result<ChatTokens> EncodeChat(std::string_view messages_json) const;

  // "transformers 5.17.0, tokenizers 0.23.2 (Qwen2TokenizerFast)" or "sentencepiece".
  std::string backend() const;

  int32_t bos_id() const { return bos_id_; }  // -1 when the model has none
  int32_t eos_id() const { return eos_id_; }  // -1 when the model has none
  bool add_bos() const { return add_bos_; }   // Encode puts bos_id() first
  bool add_eos() const { return add_eos_; }   // Encode puts eos_id() last
  // SentencePiece: the number of pieces in tokenizer.model (every id Encode returns is below it,
  // BOS/EOS too unless tokenizer_config.json maps them to added tokens). transformers:
  // len(tokenizer), added tokens included.
  int32_t vocab_size() const { return vocab_size_; }
  // The file the tokenizer came from: `model_dir`/tokenizer.model or `model_dir`/tokenizer.json
  // (the directory itself when transformers loaded neither file by name).
  const std::string& model_path() const { return model_path_; }

 private:
  Tokenizer() = default;

  static Result<std::unique_ptr<Tokenizer>> OpenSentencePiece(const std::string& model_dir);
  static Result<std::unique_ptr<Tokenizer>> OpenTransformers(const std::string& model_dir);

  std::unique_ptr<HfTokenizer> hf_;  // the transformers backend, or null
  const StrataSentencePieceApi* api_ = nullptr;
  void* model_ = nullptr;  // owned: api_->free in the destructor
  std::string model_path_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
  int32_t vocab_size_ = 0;
};

}  // namespace strata::runtime
