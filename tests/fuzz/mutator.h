// A small deterministic mutator for the fuzz suite (tests/fuzz/fuzz_test.cc): the same seed gives
// the same sequence of cases on every machine, so a failure in CI reproduces by its case number.
//
// Each Mutate() applies one to four edits chosen from what breaks parsers of JSON and of
// length-prefixed binary formats: bit flips; bytes set to structural or boundary values; random
// ranges inserted, deleted, duplicated, moved or truncated; tokens of a dictionary (the format's
// keys, "1e309", "NaN", huge integers...) inserted or put in place of a number or string; 64-bit
// little-endian boundary values written over 8 bytes (safetensors' header length); deep
// nesting; and splices with another input of the corpus.
//
// Header-only and free of gtest and of strata; not thread-safe (one per thread).
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace strata::fuzz {

class Mutator {
 public:
  Mutator(uint64_t seed, std::vector<std::string> dictionary)
      : rng_(seed), dictionary_(std::move(dictionary)) {
    // Tokens that matter to any JSON reader.
    for (const char* t : {"1e309",
                          "-1e309",
                          "-1",
                          "-0",
                          "0",
                          "1",
                          "NaN",
                          "Infinity",
                          "null",
                          "true",
                          "false",
                          "\"auto\"",
                          "18446744073709551615",
                          "18446744073709551616",
                          "9223372036854775807",
                          "-9223372036854775808",
                          "4294967296",
                          "1.5",
                          "1e-400",
                          "\"\"",
                          "[]",
                          "{}",
                          "\"\\u0000\"",
                          "\"\\ud800\"",
                          "\"\xc3\x28\"",
                          "\xff",
                          ",",
                          ":",
                          "\"",
                          "{\"a\":1,\"a\":2}"}) {
      dictionary_.push_back(t);
    }
  }

  // A mutation of `input`; `corpus` supplies splice partners (may be empty).
  std::string Mutate(std::string_view input, const std::vector<std::string>& corpus) {
    std::string s(input);
    const int edits = 1 + static_cast<int>(Below(4) == 0 ? Below(4) : 0);
    for (int i = 0; i < edits; ++i) Edit(&s, corpus);
    return s;
  }

  uint64_t Below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

 private:
  void Edit(std::string* s, const std::vector<std::string>& corpus) {
    static constexpr char kInteresting[] = {'\0', '\xff', '"',  '{',    '}',   '[', ']',
                                            ',',  ':',    '\\', '0',    '9',   '-', 'e',
                                            '.',  ' ',    '\n', '\x7f', '\x80'};
    switch (Below(13)) {
      case 0:  // flip a bit
        if (!s->empty()) (*s)[Below(s->size())] ^= static_cast<char>(1u << Below(8));
        break;
      case 1:  // set a byte to a structural or boundary value
        if (!s->empty()) (*s)[Below(s->size())] = kInteresting[Below(sizeof(kInteresting))];
        break;
      case 2: {  // insert random bytes
        std::string bytes(1 + Below(8), '\0');
        for (char& c : bytes) c = static_cast<char>(Below(256));
        s->insert(Below(s->size() + 1), bytes);
        break;
      }
      case 3:  // delete a range
        if (!s->empty()) {
          const size_t at = Below(s->size());
          s->erase(at, 1 + Below(std::min<size_t>(s->size() - at, 64)));
        }
        break;
      case 4:  // duplicate a range in place (repeats keys, elements, brackets)
        if (!s->empty()) {
          const size_t at = Below(s->size());
          const size_t n = 1 + Below(std::min<size_t>(s->size() - at, 64));
          s->insert(at, s->substr(at, n));
        }
        break;
      case 5:  // copy a range elsewhere
        if (!s->empty()) {
          const size_t at = Below(s->size());
          const std::string piece = s->substr(at, 1 + Below(std::min<size_t>(s->size() - at, 64)));
          s->insert(Below(s->size() + 1), piece);
        }
        break;
      case 6:  // truncate
        s->resize(Below(s->size() + 1));
        break;
      case 7:  // insert a dictionary token
        s->insert(Below(s->size() + 1), dictionary_[Below(dictionary_.size())]);
        break;
      case 8:  // replace a number or string by a dictionary token
        ReplaceToken(s);
        break;
      case 9:  // a 64-bit little-endian boundary value over 8 bytes (header lengths)
        if (s->size() >= 8) {
          static constexpr uint64_t kValues[] = {
              0,     1,          2,           7,           8,          0x7fffffffffffffffull,
              ~0ull, 1ull << 32, 100'000'001, 0xffffffffu, 1ull << 63, 1ull << 40};
          uint64_t v = Below(3) == 0 ? s->size() - 8 + Below(3) - 1 : kValues[Below(12)];
          const size_t at = Below(3) == 0 ? Below(s->size() - 7) : 0;
          for (int i = 0; i < 8; ++i) (*s)[at + i] = static_cast<char>(v >> (8 * i));
        }
        break;
      case 10: {  // deep nesting, around the depth limit or far beyond it
        static constexpr size_t kDepths[] = {63, 64, 65, 200, 100000};
        const size_t depth = kDepths[Below(5)];
        const bool objects = Below(2) == 0;
        std::string open, close;
        for (size_t i = 0; i < depth; ++i) open += objects ? "{\"k\":" : "[";
        close.assign(depth, objects ? '}' : ']');
        const size_t at = Below(s->size() + 1);
        s->insert(at, open + (Below(2) == 0 ? "1" : "") + (Below(4) == 0 ? "" : close));
        break;
      }
      case 11:  // splice: our head with another input's tail
        if (!corpus.empty()) {
          const std::string& other = corpus[Below(corpus.size())];
          s->resize(Below(s->size() + 1));
          *s += other.substr(Below(other.size() + 1));
        }
        break;
      default:  // swap two bytes
        if (s->size() >= 2) std::swap((*s)[Below(s->size())], (*s)[Below(s->size())]);
        break;
    }
  }

  // Replaces the number or string literal at a random place by a dictionary token.
  void ReplaceToken(std::string* s) {
    if (s->empty()) return;
    size_t at = Below(s->size());
    // Find the next literal start: a quote, a digit or a minus sign.
    while (at < s->size() && (*s)[at] != '"' && (*s)[at] != '-' &&
           ((*s)[at] < '0' || (*s)[at] > '9')) {
      ++at;
    }
    if (at == s->size()) return;
    size_t end = at + 1;
    if ((*s)[at] == '"') {
      while (end < s->size() && (*s)[end] != '"') end += (*s)[end] == '\\' ? 2 : 1;
      end = std::min(end + 1, s->size());
    } else {
      while (end < s->size() &&
             std::string_view("0123456789.eE+-").find((*s)[end]) != std::string_view::npos) {
        ++end;
      }
    }
    s->replace(at, end - at, dictionary_[Below(dictionary_.size())]);
  }

  std::mt19937_64 rng_;
  std::vector<std::string> dictionary_;
};

}  // namespace strata::fuzz
