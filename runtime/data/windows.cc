#include "runtime/data/windows.h"

#include <cassert>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "runtime/data/token_data.h"

namespace strata::runtime {
namespace {

// A uniform draw from [0, bound) without modulo bias (OpenBSD's arc4random_uniform): draws below
// 2^64 mod bound are rejected. Written out because std::uniform_int_distribution's algorithm is
// left to the library, and the shuffle must not change with it.
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  uint64_t r = rng();
  while (r < threshold) r = rng();
  return r % bound;
}

// Fills one row: the inputs and targets of window `w`.
Status FillRow(const TokenData& data, int seq_len, uint64_t w, int64_t* inputs, int64_t* targets) {
  const uint64_t begin = w * (static_cast<uint64_t>(seq_len) + 1);
  STRATA_RETURN_IF_ERROR(data.Copy(begin, seq_len, inputs));
  return data.Copy(begin + 1, seq_len, targets);
}

}  // namespace

uint64_t WindowCount(uint64_t tokens, int seq_len) {
  assert(seq_len > 0);
  return tokens / (static_cast<uint64_t>(seq_len) + 1);
}

Result<uint64_t> CountWindows(const TokenData& data, int seq_len) {
  if (seq_len <= 0) {
    return InvalidArgumentError("sequence length " + std::to_string(seq_len) + " is not positive");
  }
  const uint64_t n = WindowCount(data.size(), seq_len);
  if (n == 0) {
    return InvalidArgumentError(data.path() + " has " + std::to_string(data.size()) +
                                " tokens, shorter than one training window of seq_len + 1 = " +
                                std::to_string(seq_len + 1) +
                                " tokens: use more data or a shorter sequence length");
  }
  return n;
}

WindowSampler::WindowSampler(uint64_t windows, uint64_t seed) : windows_(windows), seed_(seed) {
  assert(windows > 0);
}

std::vector<uint64_t> WindowSampler::EpochOrder(uint64_t epoch) const {
  std::seed_seq seq{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32),
                    static_cast<uint32_t>(epoch), static_cast<uint32_t>(epoch >> 32)};
  std::mt19937_64 rng(seq);
  std::vector<uint64_t> order(windows_);
  std::iota(order.begin(), order.end(), uint64_t{0});
  for (uint64_t i = windows_ - 1; i > 0; --i) {
    std::swap(order[i], order[UniformBelow(rng, i + 1)]);
  }
  return order;
}

uint64_t WindowSampler::Sample(uint64_t k) const {
  const uint64_t epoch = k / windows_;
  std::lock_guard<std::mutex> lock(mu_);
  if (order_.empty() || cached_epoch_ != epoch) {
    order_ = EpochOrder(epoch);
    cached_epoch_ = epoch;
  }
  return order_[k % windows_];
}

Status FillTrainBatch(const TokenData& data, const WindowSampler& sampler, int batch, int seq_len,
                      uint64_t micro_batch_index, int64_t* inputs, int64_t* targets) {
  return FillTrainSamples(data, sampler, batch, seq_len,
                          micro_batch_index * static_cast<uint64_t>(batch), inputs, targets);
}

Status FillTrainSamples(const TokenData& data, const WindowSampler& sampler, int rows, int seq_len,
                        uint64_t first_sample, int64_t* inputs, int64_t* targets) {
  assert(sampler.windows() <= WindowCount(data.size(), seq_len));
  for (int r = 0; r < rows; ++r) {
    const uint64_t k = first_sample + static_cast<uint64_t>(r);
    const size_t row = static_cast<size_t>(r) * seq_len;
    STRATA_RETURN_IF_ERROR(FillRow(data, seq_len, sampler.Sample(k), inputs + row, targets + row));
  }
  return Status::Ok();
}

Status FillEvalBatch(const TokenData& data, int batch, int seq_len, uint64_t first_window,
                     int64_t* inputs, int64_t* targets) {
  assert(first_window + batch <= WindowCount(data.size(), seq_len));
  for (int r = 0; r < batch; ++r) {
    const size_t row = static_cast<size_t>(r) * seq_len;
    STRATA_RETURN_IF_ERROR(FillRow(data, seq_len, first_window + r, inputs + row, targets + row));
  }
  return Status::Ok();
}

}  // namespace strata::runtime
