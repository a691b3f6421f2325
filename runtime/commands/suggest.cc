// Suggestions for mistyped flags and commands: see suggest.h.
//
// The distance is the Lowrance-Wagner form of Damerau-Levenshtein: a full edit-distance table
// plus, for each cell, the transposition back to the last row where b's character occurred in a
// and the last column where a's character occurred in b (the characters between are deleted or
// inserted). O(|a| * |b|) time and space: flags and commands are short.
#include "runtime/commands/suggest.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace strata::runtime {
namespace {

// What is compared: no leading dashes, lower case.
std::string Key(std::string_view word) {
  while (!word.empty() && word.front() == '-') word.remove_prefix(1);
  std::string key(word);
  for (char& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return key;
}

}  // namespace

size_t EditDistance(std::string_view a, std::string_view b) {
  const size_t n = a.size();
  const size_t m = b.size();
  const size_t inf = n + m;
  // d(i + 1, j + 1) is the distance between a's first i and b's first j characters; row 0 and
  // column 0 hold `inf` so that a transposition never reaches before the strings' start.
  std::vector<size_t> table((n + 2) * (m + 2));
  auto d = [&](size_t i, size_t j) -> size_t& { return table[i * (m + 2) + j]; };
  d(0, 0) = inf;
  for (size_t i = 0; i <= n; ++i) {
    d(i + 1, 0) = inf;
    d(i + 1, 1) = i;
  }
  for (size_t j = 0; j <= m; ++j) {
    d(0, j + 1) = inf;
    d(1, j + 1) = j;
  }
  std::array<size_t, 256> last_row{};  // per character: the last row of a holding it (0: none)
  for (size_t i = 1; i <= n; ++i) {
    size_t last_col = 0;  // the last column of b in this row whose character matched a[i - 1]
    for (size_t j = 1; j <= m; ++j) {
      const size_t i1 = last_row[static_cast<unsigned char>(b[j - 1])];
      const size_t j1 = last_col;
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      if (cost == 0) last_col = j;
      d(i + 1, j + 1) = std::min({d(i, j) + cost, d(i + 1, j) + 1, d(i, j + 1) + 1,
                                  d(i1, j1) + (i - i1 - 1) + 1 + (j - j1 - 1)});
    }
    last_row[static_cast<unsigned char>(a[i - 1])] = i;
  }
  return d(n + 1, m + 1);
}

std::vector<std::string> Suggest(std::string_view typed,
                                 const std::vector<std::vector<std::string>>& choices,
                                 size_t max_suggestions) {
  const std::string key = Key(typed);
  if (key.empty()) return {};
  const size_t threshold = std::max<size_t>(1, key.size() / 3);
  struct Match {
    size_t distance;
    const std::string* name;
  };
  std::vector<Match> close;
  for (const std::vector<std::string>& names : choices) {
    Match best{SIZE_MAX, nullptr};
    for (const std::string& name : names) {
      const std::string other = Key(name);
      const size_t distance = EditDistance(key, other);
      // Every character replaced is no spelling of it ("-s" is not a typo of "-h").
      if (distance >= std::min(key.size(), other.size())) continue;
      if (distance < best.distance) best = {distance, &name};
    }
    if (best.name != nullptr && best.distance <= threshold) close.push_back(best);
  }
  std::vector<std::string> out;
  if (!close.empty()) {
    size_t nearest = SIZE_MAX;
    for (const Match& m : close) nearest = std::min(nearest, m.distance);
    for (const Match& m : close) {
      if (m.distance == nearest && out.size() < max_suggestions) out.push_back(*m.name);
    }
    return out;
  }
  // No near spelling: an abbreviation of exactly one choice.
  const std::string* prefixed = nullptr;
  for (const std::vector<std::string>& names : choices) {
    for (const std::string& name : names) {
      if (Key(name).rfind(key, 0) != 0) continue;
      if (prefixed != nullptr) return {};  // a second choice starts so too: ambiguous
      prefixed = &name;
      break;
    }
  }
  if (prefixed != nullptr) out.push_back(*prefixed);
  return out;
}

std::string JoinWithOr(const std::vector<std::string>& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) out += i + 1 == words.size() ? " or " : ", ";
    out += words[i];
  }
  return out;
}

}  // namespace strata::runtime
