// append_kv and paged attention over head-wise discrete blocks (CPU, f32).
//
// Both walk each (sequence, KV head)'s own block row. GQA: query head qh uses
// KV head qh / (num_heads / num_kv_heads) (llama.cpp / Hugging Face order).
#pragma once

#include "kernels/kv_cache.h"

namespace headway::cpu {

// Writes this step's K and V rows into the pool through the block table.
//   k, v:  [n_tokens, num_kv_heads, head_dim] f32, rows as in `batch`
//   pool:  the rank's KV pool (see kv_cache.h), written in place
// REQUIRES: every position written has a block id >= 0 in `table` (checked:
// HW_CHECK aborts otherwise).
void AppendKv(const float* k, const float* v, const BatchLayout& batch,
              const LayerBlockTable& table, const KvCacheLayout& layout, float* pool);

// Causal scaled-dot-product attention for every row of `batch`, reading keys
// and values of positions [0, pos] from the pool (so AppendKv for this step
// must run first), masked per KV head by `specs`.
//   q:     [n_tokens, num_heads, head_dim] f32
//   specs: [num_kv_heads] attention spec of each KV head of this layer
//   out:   [n_tokens, num_heads, head_dim] f32
//   scale: usually 1/sqrt(head_dim)
// Each row reads only the blocks holding its visible keys (for a sliding
// slot: the sink blocks, then from position max(0, pos - window + 1)), so -1
// entries (recycled blocks) are never dereferenced. REQUIRES: every visible
// position has a block id >= 0 (a -1 there is a broken invariant and aborts
// through HW_CHECK). Softmax is computed online (FlashAttention, Dao et
// al. 2022) in f32, a whole block of keys at a time. Parallel
// (cpu::ParallelFor) over tiles of up to 4 consecutive rows of a sequence
// and one KV head: the tile's query vectors share each K/V read.
// A row's output is the same bits whichever rows share its step (prefill
// chunk, decode, any chunking) and for any thread count.
// REQUIRES: head_dim % 8 == 0 (checked: HW_CHECK).
void PagedAttention(const float* q, const float* pool, const BatchLayout& batch,
                    const LayerBlockTable& table, const SlotSpec* specs,
                    const KvCacheLayout& layout, int num_heads, float scale, float* out);

}  // namespace headway::cpu
