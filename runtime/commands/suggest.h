// "Did you mean ...?" for a mistyped command-line word: the flags or commands a user most likely
// meant, for the one-line errors of the command framework (command.h).
//
//   Suggest("--stpes", {{"--steps"}, {"--seed"}, {"--micro-batch", "--batch-size"}})
//       -> {"--steps"}
//
// A choice is one thing the user may have meant, with all its names (a flag's other spellings);
// it is offered under the name closest to what was typed. The rule, in order:
//   1. the choices within max(1, length / 3) edits of the typed word (Damerau-Levenshtein:
//      insert, delete, substitute, or swap two adjacent characters) and fewer edits than either
//      word has characters, the closest ones only, at most `max_suggestions` of them in the order
//      given;
//   2. otherwise the one choice with a name that starts with the typed word, if exactly one does.
// Leading dashes are not compared ("--stpes" is "stpes"), and case is ignored. An empty result
// means nothing is close enough to be worth suggesting.
//
// Thread-safety: plain functions of their arguments.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace strata::runtime {

// The Damerau-Levenshtein distance between `a` and `b` (unrestricted: a swapped pair may be edited
// further, so "ca" -> "abc" is 2), compared byte by byte.
size_t EditDistance(std::string_view a, std::string_view b);

// See the file comment. Each element of `choices` holds the names of one choice (not empty).
std::vector<std::string> Suggest(std::string_view typed,
                                 const std::vector<std::vector<std::string>>& choices,
                                 size_t max_suggestions = 3);

// "a", "a or b", "a, b or c": the suggestions (or choices) as a sentence would list them.
std::string JoinWithOr(const std::vector<std::string>& words);

}  // namespace strata::runtime
