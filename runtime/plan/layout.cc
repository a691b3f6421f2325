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

}  // namespace strata::runtime
