#include "common/kv_arena.h"

#include <algorithm>
#include <numeric>

#include "common/status.h"

namespace headway {

int KvArenaLayout::ClassOf(KvCacheDtype dtype) const {
  auto it = std::find(classes.begin(), classes.end(), dtype);
  return it == classes.end() ? -1 : int(it - classes.begin());
}

std::vector<KvCacheDtype> KvBlockClasses(KvCacheDtypes dtypes,
                                         const std::vector<SlotSpec>& slot_specs) {
  bool any_full = slot_specs.empty(), any_sliding = false;
  for (const SlotSpec& s : slot_specs) (s.IsSliding() ? any_sliding : any_full) = true;
  std::vector<KvCacheDtype> classes;
  if (any_full) classes.push_back(dtypes.full);
  if (any_sliding && (!any_full || dtypes.sliding != dtypes.full)) classes.push_back(dtypes.sliding);
  return classes;
}

int KvBlockClassOf(const std::vector<KvCacheDtype>& classes, KvCacheDtypes dtypes,
                   const std::vector<SlotSpec>& slot_specs, size_t global) {
  const SlotSpec slot = global < slot_specs.size() ? slot_specs[global] : SlotSpec{};
  const auto it = std::find(classes.begin(), classes.end(), dtypes.For(slot));
  HW_CHECK(it != classes.end());  // classes come from the same slot specs
  return int(it - classes.begin());
}

KvArenaLayout MakeKvArenaLayout(int block_size, int head_dim, KvCacheDtypes dtypes,
                                const std::vector<SlotSpec>& slot_specs) {
  KvArenaLayout arena;
  arena.block_size = block_size;
  arena.head_dim = head_dim;
  arena.dtypes = dtypes;
  arena.classes = KvBlockClasses(dtypes, slot_specs);
  arena.chunk_bytes = 1;
  arena.granule_bytes = 0;
  for (KvCacheDtype d : arena.classes) {
    const KvCacheLayout layout = arena.BlockLayout(d);
    HW_CHECK(layout.Check().empty());
    arena.chunk_bytes = std::lcm(arena.chunk_bytes, layout.BlockBytes());
    arena.granule_bytes = std::gcd(arena.granule_bytes, layout.BlockBytes());
  }
  return arena;
}

}  // namespace headway
