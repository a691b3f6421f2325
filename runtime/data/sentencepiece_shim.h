// The C interface of libstrata_sentencepiece.so, the one file that links libsentencepiece.
//
// Note [SentencePiece is loaded apart]: Debian's libsentencepiece.so.0 carries its own copy of
// protobuf-lite 3.14 and exports every symbol of it, while libtorch links the system
// libprotobuf.so (3.21). Linked into one program, whichever is found first serves both, and the
// process crashes at start-up, inside libprotobuf's static initializers (sentencepiece issues #186,
// #294). So no strata binary links libsentencepiece: tokenizer.cc dlopens this shim with
// RTLD_LOCAL | RTLD_DEEPBIND, which keeps SentencePiece and its protobuf out of the global symbol
// scope and binds SentencePiece's own references to its own copies first. The shim exports one
// symbol, a table of plain C functions, so no C++ type crosses the boundary.
//
// Sanitizer runtimes refuse RTLD_DEEPBIND; sanitized builds open the shim without it, which works
// as long as no libprotobuf is loaded (tokenizer.cc checks and reports Unavailable otherwise).
#pragma once

#include <stddef.h>
#include <stdint.h>

extern "C" {

// Bumped whenever the table below changes.
#define STRATA_SENTENCEPIECE_API_VERSION 2
#define STRATA_SENTENCEPIECE_API_SYMBOL "strata_sentencepiece_api"

struct StrataSentencePieceApi {
  uint32_t version;  // STRATA_SENTENCEPIECE_API_VERSION
  // Loads a tokenizer.model. On failure returns null with a message in `err` (NUL-terminated,
  // truncated to `err_size`).
  void* (*load)(const char* path, char* err, size_t err_size);
  void (*free)(void* model);
  int32_t (*piece_size)(const void* model);
  int32_t (*bos_id)(const void* model);  // -1 when none
  int32_t (*eos_id)(const void* model);  // -1 when none
  // The id of the piece spelled `piece`, or -1 when the model has none.
  int32_t (*piece_id)(const void* model, const char* piece, size_t len);
  // Encodes `text` and hands the ids to `sink` once. Returns 0, or -1 with a message in `err`.
  // Thread-safe for one model (SentencePieceProcessor::Encode is const).
  int (*encode)(const void* model, const char* text, size_t len,
                void (*sink)(void* ctx, const int32_t* ids, size_t n), void* ctx, char* err,
                size_t err_size);
  // Decodes `n` ids (each in [0, piece_size)) into text and hands it to `sink` once. Returns 0,
  // or -1 with a message in `err`. Thread-safe for one model.
  int (*decode)(const void* model, const int32_t* ids, size_t n,
                void (*sink)(void* ctx, const char* text, size_t len), void* ctx, char* err,
                size_t err_size);
};

// The table; the shim's only exported symbol.
typedef const StrataSentencePieceApi* (*StrataSentencePieceApiFn)(void);

}  // extern "C"
