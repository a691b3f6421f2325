// Packed causal-LM windows over a TokenData, and the order training visits them in.
//
// The token stream is cut into consecutive windows of seq_len + 1 tokens, as run_clm.py's
// group_texts cuts blocks (the tail shorter than a window is dropped): window w is tokens
// [w * (seq_len + 1), (w + 1) * (seq_len + 1)). Its first seq_len tokens are the inputs and its
// last seq_len the targets, the same tokens shifted by one, so every position of a window is a
// next-token prediction and no target crosses into the next window.
//
// Training sample k (k = micro_batch_index * batch + row) is window Sample(k): epoch k / windows
// visits every window once, in a shuffle that depends only on (seed, epoch). A run resumed at
// micro-batch i therefore sees exactly the batches the straight run would: the position in the
// data is just the number of micro-batches consumed. Evaluation reads windows in order.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "base/status.h"

namespace strata::runtime {

class TokenData;

// floor(tokens / (seq_len + 1)). REQUIRES: seq_len > 0.
uint64_t WindowCount(uint64_t tokens, int seq_len);
// WindowCount of `data`; kInvalidArgument naming the file, its tokens and seq_len when the data is
// shorter than one window.
Result<uint64_t> CountWindows(const TokenData& data, int seq_len);

// Maps training sample k to a window: a Fisher-Yates shuffle of [0, windows) per epoch, drawn from
// std::mt19937_64 seeded with (seed, epoch) through std::seed_seq (both fully specified by the
// standard, so the order is the same with every compiler and library). The current epoch's order
// is cached (8 bytes per window); moving to another epoch recomputes it.
//
// Thread-safety: Sample may be called from any thread (a mutex guards the cache).
class WindowSampler {
 public:
  // REQUIRES: windows > 0.
  WindowSampler(uint64_t windows, uint64_t seed);
  WindowSampler(const WindowSampler&) = delete;
  WindowSampler& operator=(const WindowSampler&) = delete;

  uint64_t windows() const { return windows_; }
  uint64_t seed() const { return seed_; }
  // The window of training sample `k` (any k >= 0): EpochOrder(k / windows())[k % windows()].
  uint64_t Sample(uint64_t k) const;
  // The order of epoch `epoch`: a permutation of [0, windows()). Computed afresh (for tests).
  std::vector<uint64_t> EpochOrder(uint64_t epoch) const;

 private:
  const uint64_t windows_;
  const uint64_t seed_;
  mutable std::mutex mu_;
  mutable uint64_t cached_epoch_ = 0;    // guarded by mu_
  mutable std::vector<uint64_t> order_;  // guarded by mu_; empty until the first Sample
};

// Micro-batch `micro_batch_index` of training: row r is window sampler.Sample(micro_batch_index *
// batch + r); its inputs go to inputs[r * seq_len, (r + 1) * seq_len) and its targets likewise.
// REQUIRES: sampler.windows() <= WindowCount(data.size(), seq_len); each buffer holds
// batch * seq_len. Errors: TokenData::Copy's (the file changed under the run).
Status FillTrainBatch(const TokenData& data, const WindowSampler& sampler, int batch, int seq_len,
                      uint64_t micro_batch_index, int64_t* inputs, int64_t* targets);
// Training samples first_sample .. first_sample + rows - 1 (row r is window
// sampler.Sample(first_sample + r)): how ranks and micro-batches of any size split a global batch.
Status FillTrainSamples(const TokenData& data, const WindowSampler& sampler, int rows, int seq_len,
                        uint64_t first_sample, int64_t* inputs, int64_t* targets);

// Evaluation: rows are the consecutive windows first_window, first_window + 1, ...
// REQUIRES: first_window + batch <= WindowCount(data.size(), seq_len); each buffer holds
// batch * seq_len.
Status FillEvalBatch(const TokenData& data, int batch, int seq_len, uint64_t first_window,
                     int64_t* inputs, int64_t* targets);

}  // namespace strata::runtime
