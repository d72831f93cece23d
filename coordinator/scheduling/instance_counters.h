// What one instance's scheduler and KV cache manager count as it happens:
// the instance's Prometheus counters (ServingMetrics::Counters), or nothing
// (the defaults, for tests and tools that do not export metrics).
#pragma once

#include <cstdint>

namespace headway {

class InstanceCounters {
 public:
  virtual ~InstanceCounters() = default;
  // A running sequence was preempted (its blocks freed, to be recomputed).
  virtual void OnPreemption() {}
  // A sequence started: of its `queried_tokens` tokens looked up in the
  // prefix cache, the first `hit_tokens` were cached (0 <= hit <= queried).
  virtual void OnPrefixCacheQuery(int64_t queried_tokens, int64_t hit_tokens) {}
  // `num_blocks` sliding-window blocks went back to the pools (Recycle).
  virtual void OnKvBlocksRecycled(int64_t num_blocks) {}
  // Eviction of least recently used prefix-cache entries returned blocks to
  // the pools: `full_blocks` of full-attention slots, `sliding_blocks` of
  // sliding-window slots.
  virtual void OnKvBlocksEvicted(int64_t full_blocks, int64_t sliding_blocks) {}
};

}  // namespace headway
