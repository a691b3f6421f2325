// TrainingData: the one interface `strata train` and `strata eval` read their samples through,
// whatever the data is. Two sources implement it:
//
//   byte text    (text_data.h) every byte is a token (the GPT presets' 256-symbol vocabulary, and
//                a Llama preset without --data). Training sample k starts at an offset drawn from
//                (seed, k); evaluation reads the text cut into consecutive windows.
//   token ids    (token_data.h) a token file in packed windows of seq_len + 1 tokens
//                (windows.h): training sample k is window WindowSampler::Sample(k), evaluation
//                reads the windows in order.
//   SFT records  (sft_data.h) prompt/completion records, padded one per row or packed; the
//                targets of prompt positions and padding are kIgnoredTarget (Masked()).
//
// Either way training sample k depends on (data, seed, k) only, so a global batch is the same
// however ranks and micro-batches split it, and the data position of a run is just the number of
// samples consumed (what a checkpoint records).
//
// Ownership: a TrainingData owns its text or its TokenData. Threads: the methods are const and
// may be called from any thread (the token source's sampler guards its own cache).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace strata::runtime {

class TokenData;

// A target that is not trained on (torch's cross_entropy ignore_index): prompt positions and
// padding of SFT data.
inline constexpr int64_t kIgnoredTarget = -100;

class TrainingData {
 public:
  virtual ~TrainingData() = default;

  // The samples of one epoch: the consecutive windows of seq + 1 tokens the data holds, or the
  // records of padded SFT data (what evaluation reads).
  virtual uint64_t Windows(int seq) const = 0;

  // Whether targets may be kIgnoredTarget. False: every target is a token id, and losses are
  // means over every position, as before SFT data existed.
  virtual bool Masked() const { return false; }

  // Training samples first_sample .. first_sample + rows - 1: `rows` rows of `seq` input tokens
  // into `inputs` (row-major) and the tokens that follow each into `targets`. Each buffer holds
  // rows * seq. Errors: a token file that changed under the run (TokenData::Copy).
  virtual Status Train(int rows, int seq, uint64_t first_sample, int64_t* inputs,
                       int64_t* targets) const = 0;

  // Consecutive windows first_window .. first_window + rows - 1 (evaluation; the last batch may
  // be short). REQUIRES: first_window + rows <= Windows(seq); each buffer holds rows * seq.
  virtual Status Eval(int rows, int seq, uint64_t first_window, int64_t* inputs,
                      int64_t* targets) const = 0;

  // The data by content, for ranks to compare (paths may differ between machines): its length
  // and a hash, "N bytes, hash H" or "N tokens, hash H" (H in hex; a token file's hash covers its
  // first and last 65536 tokens).
  virtual std::string Fingerprint() const = 0;
};

// The byte text `text` (LoadText), training samples drawn with `seed` (FillBatch).
// REQUIRES: text.size() >= seq + 2 for every seq the data is read with.
std::unique_ptr<TrainingData> NewByteTextData(std::string text, uint64_t seed);

// The token ids of `tokens` in packed windows of seq_len + 1, training samples in the order of a
// WindowSampler seeded with `seed`. REQUIRES: WindowCount(tokens->size(), seq_len) > 0, and every
// read uses this seq_len.
std::unique_ptr<TrainingData> NewTokenWindowData(std::unique_ptr<TokenData> tokens, int seq_len,
                                                 uint64_t seed);

}  // namespace strata::runtime
