// The "did you mean" logic (runtime/commands/suggest.h): the distance itself, what is suggested,
// and, as much, what must not be.
#include "runtime/commands/suggest.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace strata::runtime {
namespace {

using Choices = std::vector<std::vector<std::string>>;
using Words = std::vector<std::string>;

TEST(EditDistanceTest, CountsInsertionsDeletionsSubstitutionsAndSwaps) {
  EXPECT_EQ(EditDistance("", ""), 0u);
  EXPECT_EQ(EditDistance("abc", ""), 3u);
  EXPECT_EQ(EditDistance("", "ab"), 2u);
  EXPECT_EQ(EditDistance("steps", "steps"), 0u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);  // 2 substitutions, 1 insertion
  EXPECT_EQ(EditDistance("stpes", "steps"), 1u);     // one swap, not two substitutions
  EXPECT_EQ(EditDistance("abcdef", "badcfe"), 3u);   // three swaps
  EXPECT_EQ(EditDistance("seed", "save"), 3u);
  EXPECT_EQ(EditDistance("steps", "stpes"), EditDistance("stpes", "steps"));
}

TEST(EditDistanceTest, IsTheUnrestrictedForm) {
  // Optimal string alignment (a swapped pair never edited again) says 3 here.
  EXPECT_EQ(EditDistance("ca", "abc"), 2u);
}

const Choices& TrainLike() {
  static const Choices choices = {{"--steps"},        {"--seed"},
                                  {"--save"},         {"--lr"},
                                  {"--model"},        {"--data"},
                                  {"--quiet"},        {"-h", "--help"},
                                  {"--warmup-steps"}, {"--micro-batch", "--batch-size"}};
  return choices;
}

TEST(SuggestTest, ASwapOrATypo) {
  EXPECT_EQ(Suggest("--stpes", TrainLike()), Words{"--steps"});
  EXPECT_EQ(Suggest("--modle", TrainLike()), Words{"--model"});
  EXPECT_EQ(Suggest("--qiuet", TrainLike()), Words{"--quiet"});
  EXPECT_EQ(Suggest("--rl", TrainLike()), Words{"--lr"});
  EXPECT_EQ(Suggest("--warmup-stesp", TrainLike()), Words{"--warmup-steps"});
  EXPECT_EQ(Suggest("--STEPS", TrainLike()), Words{"--steps"});  // case is ignored
  EXPECT_EQ(Suggest("trian", {{"train"}, {"eval"}, {"tune-io"}}), Words{"train"});
  EXPECT_EQ(Suggest("ioo", {{"io"}, {"adam"}, {"tiers"}}), Words{"io"});
}

TEST(SuggestTest, AnOtherNameOfTheFlagUnderThatName) {
  EXPECT_EQ(Suggest("--batch-szie", TrainLike()), Words{"--batch-size"});
  EXPECT_EQ(Suggest("--micro-bacth", TrainLike()), Words{"--micro-batch"});
  EXPECT_EQ(Suggest("--hlep", TrainLike()), Words{"--help"});
}

TEST(SuggestTest, AUniqueAbbreviation) {
  EXPECT_EQ(Suggest("--warm", TrainLike()), Words{"--warmup-steps"});
  EXPECT_EQ(Suggest("--micro", TrainLike()), Words{"--micro-batch"});
  EXPECT_EQ(Suggest("tok", {{"train"}, {"tokenize"}, {"tune-io"}}), Words{"tokenize"});
}

TEST(SuggestTest, EquallyCloseOnesAreListedUpToThree) {
  const Choices four = {{"--mode"}, {"--node"}, {"--code"}, {"--rode"}};
  EXPECT_EQ(Suggest("--bode", four), (Words{"--mode", "--node", "--code"}));
  EXPECT_EQ(Suggest("--bode", four, 2), (Words{"--mode", "--node"}));
  // Only the closest: --mode is 1 away, --model 2.
  EXPECT_EQ(Suggest("--mdoe", {{"--model"}, {"--mode"}}), Words{"--mode"});
}

TEST(SuggestTest, NothingWhenNothingIsClose) {
  EXPECT_TRUE(Suggest("--verbose", TrainLike()).empty());
  EXPECT_TRUE(Suggest("--xyz", TrainLike()).empty());
  EXPECT_TRUE(Suggest("--foo", TrainLike()).empty());
  EXPECT_TRUE(Suggest("--sede", {{"--save"}, {"--steps"}}).empty());  // 2 edits from --save
  EXPECT_TRUE(Suggest("--x", {{"--lr"}}).empty());
  EXPECT_TRUE(Suggest("-s", TrainLike()).empty());          // 1 edit from -h, but all of it
  EXPECT_TRUE(Suggest("--stpesize", TrainLike()).empty());  // 4 edits: over 8 / 3
  EXPECT_TRUE(Suggest("deploy", {{"train"}, {"eval"}, {"estimate"}, {"report"}}).empty());
  EXPECT_TRUE(Suggest("", TrainLike()).empty());
  EXPECT_TRUE(Suggest("--", TrainLike()).empty());
  EXPECT_TRUE(Suggest("--steps", {}).empty());
}

TEST(SuggestTest, AnAmbiguousAbbreviationSuggestsNothing) {
  EXPECT_TRUE(Suggest("t", {{"train"}, {"tokenize"}, {"tune-io"}}).empty());
  EXPECT_TRUE(Suggest("--s", TrainLike()).empty());
}

TEST(JoinWithOrTest, ListsAsASentenceDoes) {
  EXPECT_EQ(JoinWithOr({}), "");
  EXPECT_EQ(JoinWithOr({"a"}), "a");
  EXPECT_EQ(JoinWithOr({"a", "b"}), "a or b");
  EXPECT_EQ(JoinWithOr({"a", "b", "c"}), "a, b or c");
}

}  // namespace
}  // namespace strata::runtime
