// How a rank's KV pool holds blocks of more than one byte size: one byte
// arena of equal chunks, each lent to one block size at a time.
//
// Slots store K and V in their own KV cache dtype: full-attention slots in
// cache.kv_cache_dtype, sliding-window slots in cache.kv_cache_dtype_sliding
// (KvCacheDtypes). A block's bytes (common/kv_layout.h) depend on its
// dtype, so one rank's blocks come in up to two sizes. The pool is then
//   arena: num_chunks chunks of chunk_bytes, chunk k at arena + k * chunk_bytes
// where chunk_bytes is the least common multiple of the block sizes in use,
// so a chunk holds a whole number of blocks of either size. A block id
// names a block of one dtype d: block b of d lies at arena + b *
// BlockBytes(d), and chunk k, while lent to d, holds d's ids [k * n_d,
// (k + 1) * n_d), n_d = chunk_bytes / BlockBytes(d). The coordinator lends
// chunks (coordinator/scheduling/kv_arena.h); the worker only needs the
// slot's dtype to find a block. With one dtype a chunk is one block and the
// arena is today's array of equal blocks.
//
// After the unified KV arena of ATOM (AMD's inference engine, DeepSeek-V4
// support: "one arena of equal-size physical byte chunks that owners borrow
// elastically").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/kv_layout.h"

namespace headway {

// The KV cache dtype of each kind of slot.
struct KvCacheDtypes {
  KvCacheDtype full = KvCacheDtype::kFloat32;     // cache.kv_cache_dtype
  KvCacheDtype sliding = KvCacheDtype::kFloat32;  // cache.kv_cache_dtype_sliding

  // The dtype of a slot whose attention spec is `spec`.
  KvCacheDtype For(const SlotSpec& spec) const { return spec.IsSliding() ? sliding : full; }
  bool operator==(const KvCacheDtypes&) const = default;
};

// One rank's arena geometry: which dtypes its slots use and the chunk size.
struct KvArenaLayout {
  int block_size = 16;  // positions per block
  int head_dim = 64;    // values per head vector
  KvCacheDtypes dtypes;
  // The dtypes some slot of the model uses, full slots' first; one or two
  // entries (distinct).
  std::vector<KvCacheDtype> classes;
  // Least common multiple of BlockLayout(d).BlockBytes() over `classes`.
  size_t chunk_bytes = 0;
  // Greatest common divisor of the same: KV transfer addresses the arena in
  // granules of this size, a block of dtype d being GranulesPerBlock(d) of
  // them (one, with one class).
  size_t granule_bytes = 0;

  KvCacheLayout BlockLayout(KvCacheDtype dtype) const { return {block_size, head_dim, dtype}; }
  KvCacheLayout SlotLayout(const SlotSpec& spec) const { return BlockLayout(dtypes.For(spec)); }
  // Blocks of `dtype` one chunk holds: chunk_bytes / BlockBytes(dtype).
  int BlocksPerChunk(KvCacheDtype dtype) const {
    return int(chunk_bytes / BlockLayout(dtype).BlockBytes());
  }
  int GranulesPerBlock(KvCacheDtype dtype) const {
    return int(BlockLayout(dtype).BlockBytes() / granule_bytes);
  }
  // Index of `dtype` in `classes`, or -1.
  int ClassOf(KvCacheDtype dtype) const;
  bool mixed() const { return classes.size() > 1; }
};

// The block classes of slots with attention specs `slot_specs` (empty
// counts as one full slot): the full slots' dtype if any slot is full, then
// the sliding slots' if some slot slides and it differs. KvArenaLayout's
// `classes`; the coordinator's allocator numbers classes the same way.
std::vector<KvCacheDtype> KvBlockClasses(KvCacheDtypes dtypes,
                                         const std::vector<SlotSpec>& slot_specs);

// The block class, an index into `classes` (= KvBlockClasses(dtypes,
// slot_specs)), of global slot `global` = layer * num_kv_heads + kv_head; a
// slot past the end of `slot_specs` is full. The one place the coordinator's
// allocator, the transfer planner and the arena map a slot to its class.
int KvBlockClassOf(const std::vector<KvCacheDtype>& classes, KvCacheDtypes dtypes,
                   const std::vector<SlotSpec>& slot_specs, size_t global);

// The arena geometry for slots with attention specs `slot_specs` (a model's
// ModelSpec::slot_specs; empty counts as one full slot). Every rank uses
// the same one, whichever slots it holds. REQUIRES: each dtype in use has
// an empty KvCacheLayout::Check() for block_size and head_dim.
KvArenaLayout MakeKvArenaLayout(int block_size, int head_dim, KvCacheDtypes dtypes,
                                const std::vector<SlotSpec>& slot_specs);

}  // namespace headway
