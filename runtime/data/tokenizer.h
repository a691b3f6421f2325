// The tokenizer of a Hugging Face model directory, for turning training text into token ids.
//
// strata runs only SentencePiece tokenizers: DIR/tokenizer.model, the file the "slow" Hugging Face
// tokenizers (LlamaTokenizer, GemmaTokenizer, ...) load, as Llama 1/2, Mistral, Gemma and TinyLlama
// ship it. A model whose tokenizer exists only as tokenizer.json (a "fast" tokenizer: Llama 3,
// Qwen2, GPT-2...) needs its data tokenized in Python first; Open says how.
//
// Encode follows what Hugging Face's run_clm.py does with a slow SentencePiece tokenizer:
// `tokenizer(text)["input_ids"]`, i.e. SentencePiece's ids of the text with the BOS id in front
// when the directory's tokenizer_config.json says "add_bos_token" (true when absent) and the EOS id
// at the end when it says "add_eos_token" (false when absent). One difference: text that spells a
// special token ("<s>") is encoded as ordinary text, as SentencePiece does, where transformers
// would turn it into that token (transformers' split_special_tokens=True matches strata).
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

class Tokenizer {
 public:
  // Loads `model_dir`/tokenizer.model and reads `model_dir`/tokenizer_config.json if present.
  // A directory with tokenizer.json but no tokenizer.model is kInvalidArgument, saying how to
  // tokenize the data in Python instead; with neither, kNotFound naming the directory. A
  // tokenizer_config.json that is not JSON, or names a bos/eos token that the model does not
  // have, is kInvalidArgument naming the file.
  static Result<std::unique_ptr<Tokenizer>> Open(const std::string& model_dir);

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
  // gives it for a SentencePiece tokenizer: SentencePiece's decoding, which drops its control
  // pieces (<s>, </s>); ids outside tokenizer.model (added tokens) are skipped too. Errors only if
  // SentencePiece fails (kInternal).
  Result<std::string> Decode(const std::vector<int64_t>& ids) const;

  int32_t bos_id() const { return bos_id_; }  // -1 when the model has none
  int32_t eos_id() const { return eos_id_; }  // -1 when the model has none
  bool add_bos() const { return add_bos_; }   // Encode puts bos_id() first
  bool add_eos() const { return add_eos_; }   // Encode puts eos_id() last
  // The number of pieces in tokenizer.model: every id Encode returns is below it, BOS/EOS too
  // unless tokenizer_config.json maps them to added tokens (then they can be larger).
  int32_t vocab_size() const { return vocab_size_; }
  const std::string& model_path() const { return model_path_; }  // `model_dir`/tokenizer.model

 private:
  Tokenizer() = default;

  const StrataSentencePieceApi* api_ = nullptr;
  void* model_ = nullptr;  // owned: api_->free in the destructor
  std::string model_path_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
  int32_t vocab_size_ = 0;
};

// The message of Open's error for a directory that has only tokenizer.json (exposed for tests and
// for callers that detect the case themselves): why strata cannot read the text and the Python
// that writes the .bin it can read.
std::string FastTokenizerHelp(const std::string& model_dir);

}  // namespace strata::runtime
