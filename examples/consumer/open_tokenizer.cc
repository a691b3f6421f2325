// Opens a model directory's SentencePiece tokenizer through an installed strata: the module that
// runs SentencePiece (lib/strata/libstrata_sentencepiece.so) is found on this program's RUNPATH,
// which strata's CMake package sets. Prints the vocabulary size, or the error.
//
// Usage: open_tokenizer MODEL_DIR
#include <cstdio>
#include <memory>

#include "base/status.h"
#include "runtime/data/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
    return 2;
  }
  strata::Result<std::unique_ptr<strata::runtime::Tokenizer>> tokenizer =
      strata::runtime::Tokenizer::Open(argv[1]);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "open_tokenizer: %s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  std::printf("vocabulary: %d pieces\n", (*tokenizer)->vocab_size());
  return 0;
}
