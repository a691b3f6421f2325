#include "runtime/plan/layout.h"

#include <algorithm>
#include <utility>

namespace strata::runtime {

std::vector<SubGroupSpan> SplitSubGroups(std::span<const uint64_t> group_numel,
                                         uint64_t sub_group_size) {
  std::vector<SubGroupSpan> out;
  for (size_t g = 0; g < group_numel.size(); ++g) {
    for (uint64_t b = 0; b < group_numel[g]; b += sub_group_size) {
      out.push_back({static_cast<int>(g), b, std::min(sub_group_size, group_numel[g] - b)});
    }
  }
  return out;
}

uint64_t ModelLayout::largest_unit() const {
  uint64_t m = 0;
  for (uint64_t n : unit_numel) m = std::max(m, n);
  return m;
}

uint64_t ModelLayout::largest_sub_group() const {
  uint64_t m = 0;
  for (const SubGroupSpan& s : subgroups) m = std::max(m, s.numel);
  return m;
}

ModelLayout MakeModelLayout(std::vector<uint64_t> unit_numel, uint64_t resident_numel,
                            uint64_t sub_group_size) {
  ModelLayout m;
  m.unit_numel = std::move(unit_numel);
  m.resident_numel = resident_numel;
  std::vector<uint64_t> groups = m.unit_numel;
  groups.push_back(resident_numel);
  m.subgroups = SplitSubGroups(groups, sub_group_size);
  return m;
}

Slice SliceOf(uint64_t numel, int world, int rank) {
  Slice s;
  if (world <= 1) {
    s.part = s.numel = numel;
    return s;
  }
  const uint64_t w = static_cast<uint64_t>(world);
  const uint64_t per_rank = (numel + w - 1) / w;
  s.part = (per_rank + kPartitionAlign - 1) / kPartitionAlign * kPartitionAlign;
  s.begin = std::min(numel, s.part * static_cast<uint64_t>(rank));
  s.numel = std::min(numel, s.begin + s.part) - s.begin;
  return s;
}

std::vector<SubGroupSpan> RankSubGroups(std::span<const uint64_t> group_numel,
                                        uint64_t sub_group_size, int world, int rank) {
  std::vector<uint64_t> own;
  std::vector<uint64_t> begin;
  for (uint64_t n : group_numel) {
    const Slice s = SliceOf(n, world, rank);
    own.push_back(s.numel);
    begin.push_back(s.begin);
  }
  std::vector<SubGroupSpan> out = SplitSubGroups(own, sub_group_size);
  for (SubGroupSpan& sg : out) sg.begin += begin[sg.group];
  return out;
}

ModelLayout RankLayout(const ModelLayout& whole, uint64_t sub_group_size, int world, int rank) {
  if (world <= 1) return whole;
  ModelLayout m;
  m.world = world;
  std::vector<uint64_t> groups = whole.unit_numel;
  groups.push_back(whole.resident_numel);
  for (uint64_t n : whole.unit_numel) {
    const Slice s = SliceOf(n, world, rank);
    m.unit_numel.push_back(s.part);
    m.largest_gathered = std::max(m.largest_gathered, s.part * static_cast<uint64_t>(world));
  }
  m.resident_numel = SliceOf(whole.resident_numel, world, rank).part * static_cast<uint64_t>(world);
  m.subgroups = RankSubGroups(groups, sub_group_size, world, rank);
  return m;
}

}  // namespace strata::runtime
