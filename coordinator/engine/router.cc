#include "coordinator/engine/router.h"

#include <algorithm>

namespace headway {

bool Disaggregated(const InstanceRegistry& registry) {
  return std::any_of(registry.instances().begin(), registry.instances().end(),
                     [](const Instance& i) { return i.role == PoolRole::kPrefill; });
}

Instance* LeastLoaded(InstanceRegistry& registry, PoolRole role) {
  Instance* best = nullptr;
  for (Instance& inst : registry.instances()) {
    if (!inst.accepting() || inst.role != role) continue;
    if (best == nullptr || inst.load() < best->load()) best = &inst;
  }
  return best;
}

Instance* DecodeInstanceFor(InstanceRegistry& registry, const TokenIds& prompt,
                            int64_t num_positions) {
  Instance* best = nullptr;
  int64_t best_hit = -1;
  for (Instance& inst : registry.instances()) {
    if (!inst.accepting() || inst.role != PoolRole::kDecode) continue;
    const int64_t hit = inst.scheduler->kv().MatchPrefix(prompt, num_positions).num_positions;
    if (best == nullptr || hit > best_hit || (hit == best_hit && inst.load() < best->load())) {
      best = &inst;
      best_hit = hit;
    }
  }
  return best;
}

}  // namespace headway
