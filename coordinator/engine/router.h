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

// The ready instance of pool role `role` with the fewest waiting + running
// sequences (the first of equals); nullptr if none is ready.
Instance* LeastLoaded(InstanceRegistry& registry, PoolRole role);

// The ready decode instance whose prefix cache holds the most of `prompt`'s
// first `num_positions` positions, the least loaded of equals; nullptr if
// none is ready.
Instance* DecodeInstanceFor(InstanceRegistry& registry, const TokenIds& prompt,
                            int64_t num_positions);

}  // namespace headway
