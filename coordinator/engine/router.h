// Where a request runs: the instance of a pool that takes it. Today by load
// alone, except a disaggregated request's decode instance, which is the one
// already holding the longest prefix of its prompt (least KV to move).
#pragma once

#include <cstdint>

#include "coordinator/engine/instance_registry.h"

namespace headway {

// True when the deployment has a prefill pool (and so a decode pool):
// requests are prefilled on one instance and decoded on another.
bool Disaggregated(const InstanceRegistry& registry);

// The accepting instance (ready, not draining) of pool role `role` with the
// fewest waiting + running sequences (the first of equals); nullptr if none.
Instance* LeastLoaded(InstanceRegistry& registry, PoolRole role);

// The accepting decode instance whose prefix cache holds the most of
// `prompt`'s first `num_positions` positions, the least loaded of equals;
// nullptr if none.
Instance* DecodeInstanceFor(InstanceRegistry& registry, const TokenIds& prompt,
                            int64_t num_positions);

}  // namespace headway
