// The two TrainingData sources (training_data.h): byte text and token ids in packed windows.
#include "runtime/data/training_data.h"

#include <algorithm>
#include <functional>
#include <sstream>
#include <utility>
#include <vector>

#include "runtime/data/text_data.h"
#include "runtime/data/token_data.h"
#include "runtime/data/windows.h"

namespace strata::runtime {
namespace {

std::string FormatFingerprint(uint64_t length, const char* unit, uint64_t hash) {
  std::ostringstream out;
  out << length << " " << unit << ", hash " << std::hex << hash;
  return out.str();
}

class ByteTextData final : public TrainingData {
 public:
  ByteTextData(std::string text, uint64_t seed) : text_(std::move(text)), seed_(seed) {}

  uint64_t Windows(int seq) const override { return WindowCount(text_.size(), seq); }

  Status Train(int rows, int seq, uint64_t first_sample, int64_t* x, int64_t* y) const override {
    FillBatch(text_, rows, seq, seed_, first_sample, x, y);
    return Status::Ok();
  }

  Status Eval(int rows, int seq, uint64_t first, int64_t* x, int64_t* y) const override {
    for (int r = 0; r < rows; ++r) {
      const size_t base = (first + r) * static_cast<uint64_t>(seq + 1);
      for (int i = 0; i < seq; ++i) {
        x[r * seq + i] = static_cast<unsigned char>(text_[base + i]);
        y[r * seq + i] = static_cast<unsigned char>(text_[base + i + 1]);
      }
    }
    return Status::Ok();
  }

  std::string Fingerprint() const override {
    return FormatFingerprint(text_.size(), "bytes", std::hash<std::string>()(text_));
  }

 private:
  const std::string text_;
  const uint64_t seed_;
};

class TokenWindowData final : public TrainingData {
 public:
  TokenWindowData(std::unique_ptr<TokenData> tokens, int seq_len, uint64_t seed)
      : tokens_(std::move(tokens)), sampler_(WindowCount(tokens_->size(), seq_len), seed) {}

  uint64_t Windows(int seq) const override { return WindowCount(tokens_->size(), seq); }

  Status Train(int rows, int seq, uint64_t first_sample, int64_t* x, int64_t* y) const override {
    return FillTrainSamples(*tokens_, sampler_, rows, seq, first_sample, x, y);
  }

  Status Eval(int rows, int seq, uint64_t first, int64_t* x, int64_t* y) const override {
    return FillEvalBatch(*tokens_, rows, seq, first, x, y);
  }

  std::string Fingerprint() const override {
    const uint64_t length = tokens_->size();
    const uint64_t n = std::min<uint64_t>(length, 1 << 16);
    std::vector<int64_t> ids(n);
    std::string bytes;
    if (tokens_->Copy(0, n, ids.data()).ok()) {
      bytes.append(reinterpret_cast<const char*>(ids.data()), n * sizeof(int64_t));
    }
    if (tokens_->Copy(length - n, n, ids.data()).ok()) {
      bytes.append(reinterpret_cast<const char*>(ids.data()), n * sizeof(int64_t));
    }
    return FormatFingerprint(length, "tokens", std::hash<std::string>()(bytes));
  }

 private:
  const std::unique_ptr<TokenData> tokens_;
  const WindowSampler sampler_;
};

}  // namespace

std::unique_ptr<TrainingData> NewByteTextData(std::string text, uint64_t seed) {
  return std::make_unique<ByteTextData>(std::move(text), seed);
}

std::unique_ptr<TrainingData> NewTokenWindowData(std::unique_ptr<TokenData> tokens, int seq_len,
                                                 uint64_t seed) {
  return std::make_unique<TokenWindowData>(std::move(tokens), seq_len, seed);
}

}  // namespace strata::runtime
