// The one group/sub-group split (no libtorch): a model's trainable parameters form groups (one
// per offload unit, plus the resident group), and each group's flat range is cut into sub-groups
// of at most `sub_group_size` elements, the optimizer's unit of work and of NVMe swapping.
//
// SplitSubGroups is the only place that cuts: the engine (runtime/engine/engine_layout.h) builds
// its ModelLayout from the real model with it, and `strata estimate` from a preset's shape, so the
// memory plan of either is computed from the same sub-groups the engine allocates.
//
// Thread-safety: pure functions over values.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace strata::runtime {

struct SubGroupSpan {
  int group = 0;       // index into the groups given to SplitSubGroups
  uint64_t begin = 0;  // elements into the group's flat range
  uint64_t numel = 0;
  bool operator==(const SubGroupSpan&) const = default;
};

// Group g's range [0, numel[g]) in order, cut every `sub_group_size` elements; groups of 0
// elements get none. REQUIRES: sub_group_size > 0.
std::vector<SubGroupSpan> SplitSubGroups(std::span<const uint64_t> group_numel,
                                         uint64_t sub_group_size);

// What the memory plan needs of a partition: units' sizes, the resident group's, the sub-groups.
// Group indices of `subgroups`: units 0..n-1, the resident group n.
struct ModelLayout {
  std::vector<uint64_t> unit_numel;
  uint64_t resident_numel = 0;
  std::vector<SubGroupSpan> subgroups;
  // Data-parallel ranks: unit_numel are this rank's slices, and a gather assembles up to this
  // many elements on the device (the largest unit's padded block); 0: largest_unit().
  uint64_t largest_gathered = 0;
  // The ranks the units are partitioned over (unit_numel are slices of `part` elements when > 1).
  int world = 1;

  uint64_t largest_unit() const;
  uint64_t largest_gather() const {
    return largest_gathered != 0 ? largest_gathered : largest_unit();
  }
  uint64_t largest_sub_group() const;
};

// The layout of `unit_numel` units and a resident group, cut by SplitSubGroups.
ModelLayout MakeModelLayout(std::vector<uint64_t> unit_numel, uint64_t resident_numel,
                            uint64_t sub_group_size);

// Data-parallel ranks (ZeRO-3 partitioning): a group of `numel` elements is padded to `world`
// slices of `part` elements (a multiple of kPartitionAlign when world > 1) and rank r owns
// [r*part, (r+1)*part) ∩ [0, numel). With one rank, part == numel and nothing is padded.
inline constexpr uint64_t kPartitionAlign = 64;
struct Slice {
  uint64_t part = 0, begin = 0, numel = 0;
};
Slice SliceOf(uint64_t numel, int world, int rank);
// The sub-groups rank `rank` of `world` owns in groups of `group_numel` elements: its slice of each
// group cut every `sub_group_size` elements; begins are offsets into the whole group.
std::vector<SubGroupSpan> RankSubGroups(std::span<const uint64_t> group_numel,
                                        uint64_t sub_group_size, int world, int rank);
// What rank `rank` of `world` keeps of `whole` (a one-rank layout cut by `sub_group_size`): its
// units' slices, the resident group whole (padded: it stays on the device, all-gathered after
// each step), its sub-groups, and the padded largest unit a gather assembles.
ModelLayout RankLayout(const ModelLayout& whole, uint64_t sub_group_size, int world, int rank);

}  // namespace strata::runtime
