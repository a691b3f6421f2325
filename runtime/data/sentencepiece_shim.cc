// libstrata_sentencepiece.so: SentencePieceProcessor behind the C table of sentencepiece_shim.h
// (Note [SentencePiece is loaded apart] there). Built with hidden visibility; only
// strata_sentencepiece_api is exported.
#include "runtime/data/sentencepiece_shim.h"

#include <sentencepiece_processor.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {

using sentencepiece::SentencePieceProcessor;

void CopyMessage(const std::string& message, char* err, size_t err_size) {
  if (err != nullptr && err_size > 0) std::snprintf(err, err_size, "%s", message.c_str());
}

const SentencePieceProcessor* Sp(const void* model) {
  return static_cast<const SentencePieceProcessor*>(model);
}

void* Load(const char* path, char* err, size_t err_size) {
  auto* sp = new SentencePieceProcessor();
  const sentencepiece::util::Status s = sp->Load(path);
  if (!s.ok()) {
    CopyMessage(s.ToString(), err, err_size);
    delete sp;
    return nullptr;
  }
  return sp;
}

void Free(void* model) { delete static_cast<SentencePieceProcessor*>(model); }
int32_t PieceSize(const void* model) { return Sp(model)->GetPieceSize(); }
int32_t BosId(const void* model) { return Sp(model)->bos_id(); }
int32_t EosId(const void* model) { return Sp(model)->eos_id(); }

int32_t PieceId(const void* model, const char* piece, size_t len) {
  const std::string text(piece, len);
  const int id = Sp(model)->PieceToId(text);
  return Sp(model)->IdToPiece(id) == text ? id : -1;
}

int Encode(const void* model, const char* text, size_t len,
           void (*sink)(void* ctx, const int32_t* ids, size_t n), void* ctx, char* err,
           size_t err_size) {
  std::vector<int> ids;
  const sentencepiece::util::Status s = Sp(model)->Encode(std::string_view(text, len), &ids);
  if (!s.ok()) {
    CopyMessage(s.ToString(), err, err_size);
    return -1;
  }
  static_assert(sizeof(int) == sizeof(int32_t));
  sink(ctx, reinterpret_cast<const int32_t*>(ids.data()), ids.size());
  return 0;
}

int Decode(const void* model, const int32_t* ids, size_t n,
           void (*sink)(void* ctx, const char* text, size_t len), void* ctx, char* err,
           size_t err_size) {
  const std::vector<int> pieces(ids, ids + n);
  std::string text;
  const sentencepiece::util::Status s = Sp(model)->Decode(pieces, &text);
  if (!s.ok()) {
    CopyMessage(s.ToString(), err, err_size);
    return -1;
  }
  sink(ctx, text.data(), text.size());
  return 0;
}

constexpr StrataSentencePieceApi kApi = {
    STRATA_SENTENCEPIECE_API_VERSION, Load, Free, PieceSize, BosId, EosId, PieceId, Encode, Decode};

}  // namespace

extern "C" __attribute__((visibility("default"))) const StrataSentencePieceApi*
strata_sentencepiece_api(void) {
  return &kApi;
}
