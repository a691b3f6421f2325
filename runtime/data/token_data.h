// The token stream a causal LM is fine-tuned on, opened from one file chosen by its extension:
//
//   .bin    a flat little-endian array of token ids, as nanoGPT's prepare.py and `strata tokenize`
//           write it: uint16 when the model's vocab_size <= 65536, else uint32, unless
//           TokenDataOptions::dtype says. Read with pread(2) from a descriptor kept open, never
//           copied onto the heap and never mapped: a file truncated or rewritten while a run reads
//           it gives an error naming it (a mapping would kill the process with SIGBUS), and a
//           file replaced by rename keeps being read from the open inode.
//   .jsonl  one JSON object per line with a string field "text"; blank lines are skipped.
//   .txt    each non-empty line is a record, its line break included ("\r\n" read as "\n"), as
//           Hugging Face's `datasets` "text" loader gives lines to run_clm.py (keep_linebreaks
//           defaults to true there). Unlike run_clm, empty lines are skipped instead of becoming
//           records of just "\n".
//
// Records of .jsonl/.txt are tokenized with the model directory's Tokenizer (tokenizer.h: BOS in
// front of each as the model's tokenizer_config.json says), on one thread per CPU, and
// concatenated in file order into one in-memory vector, as run_clm.py's group_texts concatenates
// them before cutting blocks. Every id is checked against the model's vocab_size when the file is
// opened, so training never meets a bad id.
//
// Thread-safety: a TokenData is immutable after Open; Copy may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace strata::runtime {

class Tokenizer;

// Called as text is tokenized with the bytes of the input processed so far and the file's size:
// every 200 ms, and once more when the file is done.
using TokenizeProgress = std::function<void(uint64_t done_bytes, uint64_t total_bytes)>;

struct TokenDataOptions {
  std::string path;           // .bin, .jsonl or .txt
  std::string dtype;          // .bin only: "" (by vocab_size), "uint16" or "uint32"
  std::string model_dir;      // .jsonl/.txt only: the directory with tokenizer.model
  int64_t vocab_size = 0;     // the model's (config.json "vocab_size"); every id must be below it
  TokenizeProgress progress;  // optional
  int threads = 0;            // text: tokenizing threads; 0: one per CPU available (at most 32)
};

// The element type of a .bin for a model with `vocab_size`: "uint16" when <= 65536, else "uint32".
std::string_view DefaultBinDtype(int64_t vocab_size);

class TokenData {
 public:
  // Opens and checks the whole file. Errors name the file: kNotFound when it does not exist;
  // kInvalidArgument for an unknown extension (listing the accepted ones), a bad dtype, a .bin
  // whose size is not a multiple of the element size, a .jsonl line that is not JSON or has no
  // string "text" (with its line number), a missing tokenizer (see Tokenizer::Open), and an id
  // >= vocab_size (with its token index, its byte offset in a .bin, and the vocab size).
  static Result<std::unique_ptr<TokenData>> Open(const TokenDataOptions& options);

  ~TokenData();
  TokenData(const TokenData&) = delete;
  TokenData& operator=(const TokenData&) = delete;

  uint64_t size() const { return size_; }  // tokens
  // Tokens [begin, begin + count), widened to int64. REQUIRES: begin + count <= size().
  // kDataLoss naming the file when a .bin no longer holds them (it shrank since Open) or holds an
  // id >= vocab_size there now (it was rewritten); never for text, which is in memory.
  Status Copy(uint64_t begin, uint64_t count, int64_t* out) const;

  const std::string& path() const { return path_; }
  std::string_view format() const { return format_; }  // "bin", "jsonl" or "txt"
  // The element type of a .bin ("uint16"/"uint32"); "" for text.
  std::string_view dtype() const { return dtype_; }
  uint64_t records() const { return records_; }  // text records tokenized; 0 for a .bin

 private:
  struct Mapping;
  TokenData();

  std::string path_;
  std::string format_;
  std::string dtype_;
  uint64_t size_ = 0;
  uint64_t records_ = 0;
  std::unique_ptr<Mapping> map_;  // .bin: the open file
  uint64_t vocab_size_ = 0;
  int element_bytes_ = 0;         // .bin: 2 or 4
  std::vector<uint32_t> tokens_;  // text: the tokenized records
};

// The records of a .txt or .jsonl file (same rules as TokenData), tokenized and concatenated.
struct TextTokens {
  std::vector<uint32_t> ids;
  uint64_t records = 0;
};

// Tokenizes `path` (.txt or .jsonl) with `tokenizer` on `threads` threads (0: one per CPU this
// process may use, at most 32; files under 256 KiB per thread use fewer). The result, and the
// error for a bad file (the first in file order), do not depend on the number of threads. With
// `vocab_size` > 0, an id >= vocab_size is kInvalidArgument naming the file, the line and the
// token index. Other errors as TokenData::Open's. `progress` is called on the calling thread.
Result<TextTokens> TokenizeTextFile(const std::string& path, const Tokenizer& tokenizer,
                                    int64_t vocab_size, const TokenizeProgress& progress = {},
                                    int threads = 0);

}  // namespace strata::runtime
