// Transfer planning for disaggregated prefill/decode (DESIGN.md "A request,
// end to end"): which KV blocks each prefill TP rank writes into which decode
// TP rank's pool, when the two instances may run different TP sizes.
//
// KV memory is head-wise: every rank holds one block row per (layer, local
// KV head), its slot `layer * num_local_kv_heads + local_head`. A global KV
// head lives on the ranks the TP sharding rule gives it (DESIGN.md; heads
// are replicated when tp_size > num_kv_heads). Each head's blocks come from
// the first prefill rank that holds it and go to every decode rank that
// holds it: a replicated head is sent once per destination, never once per
// source replica.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/kv_arena.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "coordinator/scheduling/kv_cache_manager.h"

namespace headway {

// The blocks of one class one prefill rank writes into one decode rank's
// pool.
struct RankBlockCopies {
  int src_rank = 0;                  // prefill TP rank (the writer)
  int dst_rank = 0;                  // decode TP rank (the pool written)
  // The blocks' class (common/kv_arena.h KvBlockClasses order): with two
  // KV cache dtypes, ids of different classes address the arena in
  // different units, so each class travels in its own list.
  int block_class = 0;
  std::vector<uint32_t> src_blocks;  // block ids in the writer's pool
  std::vector<uint32_t> dst_blocks;  // the same length: ids in the receiver's pool
};

// One rank's block rows of a sequence: [slot][logical], -1 = no block (a
// sliding slot's block outside its window and sink), as
// KvCacheManager::Rows returns them.
using RankRows = std::vector<std::vector<int32_t>>;

// Plans the copies of logical blocks [first_new_block, ...) of every slot
// that the decode side holds a block for (a sliding slot's -1 entries get
// nothing: only its sink and window move). `src` are the prefill side's rows
// per prefill rank (src_tp_size of them), `dst` the decode side's per decode
// rank (dst_tp_size); blocks [0, first_new_block) are the prefix the decode
// side already holds. Copies are ordered by (src_rank, dst_rank,
// block_class), then slot, then logical block; triples with nothing to copy
// are left out. `dtypes` decides each slot's class (KvBlockClasses).
// Errors: InvalidArgument when a TP size is invalid for `spec`, the rank
// counts differ from the TP sizes, or the prefill side lacks a block the
// decode side wants (the two tables do not describe the same positions).
Result<std::vector<RankBlockCopies>> PlanBlockCopies(const ModelSpec& spec, int src_tp_size,
                                                     const std::vector<RankRows>& src,
                                                     int dst_tp_size,
                                                     const std::vector<RankRows>& dst,
                                                     size_t first_new_block,
                                                     const KvCacheDtypes& dtypes = {});

}  // namespace headway
