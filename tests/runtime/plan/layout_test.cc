// SplitSubGroups and MakeModelLayout (runtime/plan/layout.h): the one group/sub-group split the
// engine allocates and the memory plan counts.
#include "runtime/plan/layout.h"

#include <gtest/gtest.h>

#include <vector>

namespace strata::runtime {
namespace {

TEST(PlanLayoutTest, SplitCutsEachGroupInOrder) {
  const std::vector<uint64_t> groups = {10, 0, 25};
  EXPECT_EQ(SplitSubGroups(groups, 10),
            (std::vector<SubGroupSpan>{{0, 0, 10}, {2, 0, 10}, {2, 10, 10}, {2, 20, 5}}));
  EXPECT_EQ(SplitSubGroups(groups, 25), (std::vector<SubGroupSpan>{{0, 0, 10}, {2, 0, 25}}));
  EXPECT_EQ(SplitSubGroups(groups, 1000), (std::vector<SubGroupSpan>{{0, 0, 10}, {2, 0, 25}}));
  EXPECT_EQ(SplitSubGroups(groups, 9),
            (std::vector<SubGroupSpan>{{0, 0, 9}, {0, 9, 1}, {2, 0, 9}, {2, 9, 9}, {2, 18, 7}}));
}

TEST(PlanLayoutTest, SplitCoversEveryElementExactlyOnce) {
  const std::vector<uint64_t> groups = {1, 4096, 4097, 12345, 0, 3};
  for (uint64_t size : {1ull, 2ull, 1000ull, 4096ull, 5000ull, 1ull << 40}) {
    SCOPED_TRACE(size);
    const std::vector<SubGroupSpan> s = SplitSubGroups(groups, size);
    std::vector<uint64_t> next(groups.size(), 0);
    int last_group = -1;
    for (const SubGroupSpan& sg : s) {
      ASSERT_GE(sg.group, last_group);  // groups in order
      last_group = sg.group;
      EXPECT_EQ(sg.begin, next[sg.group]);  // contiguous, no gap or overlap
      EXPECT_GT(sg.numel, 0u);
      EXPECT_LE(sg.numel, size);
      next[sg.group] += sg.numel;
    }
    EXPECT_EQ(next, groups);
  }
}

TEST(PlanLayoutTest, SplitOfNothingIsEmpty) {
  EXPECT_TRUE(SplitSubGroups(std::vector<uint64_t>{}, 10).empty());
  EXPECT_TRUE(SplitSubGroups(std::vector<uint64_t>{0, 0}, 10).empty());
}

TEST(PlanLayoutTest, ModelLayoutPutsTheResidentGroupLast) {
  const ModelLayout m = MakeModelLayout({100, 300, 200}, 50, 128);
  EXPECT_EQ(m.unit_numel, (std::vector<uint64_t>{100, 300, 200}));
  EXPECT_EQ(m.resident_numel, 50u);
  EXPECT_EQ(m.subgroups, (std::vector<SubGroupSpan>{{0, 0, 100},
                                                    {1, 0, 128},
                                                    {1, 128, 128},
                                                    {1, 256, 44},
                                                    {2, 0, 128},
                                                    {2, 128, 72},
                                                    {3, 0, 50}}));
  EXPECT_EQ(m.largest_unit(), 300u);
  EXPECT_EQ(m.largest_sub_group(), 128u);
  const std::vector<uint64_t> groups = {100, 300, 200, 50};
  EXPECT_EQ(m.subgroups, SplitSubGroups(groups, 128));
}

TEST(PlanLayoutTest, LargestOfAnEmptyLayoutIsZero) {
  const ModelLayout m = MakeModelLayout({}, 0, 128);
  EXPECT_TRUE(m.subgroups.empty());
  EXPECT_EQ(m.largest_unit(), 0u);
  EXPECT_EQ(m.largest_sub_group(), 0u);
  const ModelLayout resident_only = MakeModelLayout({}, 10, 4);
  EXPECT_EQ(resident_only.subgroups, (std::vector<SubGroupSpan>{{0, 0, 4}, {0, 4, 4}, {0, 8, 2}}));
  EXPECT_EQ(resident_only.largest_unit(), 0u);
  EXPECT_EQ(resident_only.largest_sub_group(), 4u);
}

}  // namespace
}  // namespace strata::runtime
