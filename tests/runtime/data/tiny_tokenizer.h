// A tiny SentencePiece model for the tests of runtime/data and `strata tokenize`: BPE with
// Llama's settings (byte fallback, identity normalization, a dummy prefix, split digits, <unk>=0
// <s>=1 </s>=2), trained in-process on a generated English-like corpus in a few milliseconds.
// Links libsentencepiece_train (PkgConfig::SENTENCEPIECE); fine in these torch-free test
// programs (Note [SentencePiece is loaded apart] in runtime/data/sentencepiece_shim.h).
#pragma once

#include <sentencepiece_trainer.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace strata::testing {

inline constexpr int kTinyVocab = 400;

// Deterministic lines of words, digits and punctuation, some with non-ASCII letters.
inline std::vector<std::string> TinyCorpusLines(int lines = 600) {
  static const char* const kWords[] = {
      "the",    "quick",   "brown",  "fox",   "jumps",  "over",    "lazy",   "dog",  "strata",
      "engine", "offload", "memory", "token", "window", "train",   "model",  "café", "naïve",
      "über",   "data",    "seq",    "batch", "epoch",  "shuffle", "resume", "NVMe", "GPU"};
  constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);
  std::vector<std::string> out;
  uint32_t x = 12345;
  auto next = [&x] {
    x = x * 1103515245u + 12345u;
    return (x >> 16) & 0x7fff;
  };
  for (int i = 0; i < lines; ++i) {
    std::string line;
    const int n = 4 + next() % 8;
    for (int w = 0; w < n; ++w) {
      if (w > 0) line += ' ';
      line += kWords[next() % kNumWords];
      if (next() % 7 == 0) line += std::to_string(next() % 1000);
    }
    line += next() % 3 == 0 ? "." : ",";
    out.push_back(line);
  }
  return out;
}

// Trains the model into `dir`/tokenizer.model. Returns "" on success, else the trainer's error.
inline std::string TrainTinyTokenizer(const std::string& dir) {
  const std::string corpus = dir + "/tiny-corpus.txt";
  {
    std::ofstream out(corpus);
    for (const std::string& line : TinyCorpusLines()) out << line << "\n";
  }
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + corpus + " --model_prefix=" + dir +
      "/tokenizer --vocab_size=" + std::to_string(kTinyVocab) +
      " --model_type=bpe --byte_fallback=true --character_coverage=1.0"
      " --normalization_rule_name=identity --remove_extra_whitespaces=false"
      " --add_dummy_prefix=true --split_digits=true --unk_id=0 --bos_id=1 --eos_id=2"
      " --pad_id=-1 --num_threads=1 --minloglevel=2");
  std::remove(corpus.c_str());
  std::remove((dir + "/tokenizer.vocab").c_str());
  return status.ok() ? "" : status.ToString();
}

}  // namespace strata::testing
