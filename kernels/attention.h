// append_kv and paged attention over head-wise discrete blocks (CPU), over a
// pool in any KV cache dtype (common/kv_layout.h); queries, keys, values and
// outputs are f32 at the interface.
//
// Both walk each (sequence, KV head)'s own block row. GQA: query head qh uses
// KV head qh / (num_heads / num_kv_heads) (llama.cpp / Hugging Face order).
#pragma once

#include "kernels/kv_cache.h"

namespace headway::cpu {

// Writes this step's K and V rows into the pool through the block table.
//   k, v:  [n_tokens, num_kv_heads, head_dim] f32, rows as in `batch`
//   pool:  the rank's KV pool, bytes (common/kv_layout.h), written in place:
//          each row encoded in layout.dtype (rounded or quantized; bits equal
//          reference::QuantizeKvRow)
// REQUIRES: every position written has a block id >= 0 in `table` (checked:
// HW_CHECK aborts otherwise); layout.Check() is empty and head_dim % 8 == 0.
void AppendKv(const float* k, const float* v, const BatchLayout& batch,
              const LayerBlockTable& table, const KvCacheLayout& layout, uint8_t* pool);

// Causal scaled-dot-product attention for every row of `batch`, reading keys
// and values of positions [0, pos] from the pool (so AppendKv for this step
// must run first), masked per KV head by `specs`. Keys and values in a
// dtype other than float32 are decoded to f32 first (kernels/cpu/kv_codec.h),
// so the output is what f32 attention over the decoded values gives
// (q4_0_hadamard: over the rotated values, with the queries rotated first
// and the outputs rotated back, common/kv_layout.h).
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
void PagedAttention(const float* q, const uint8_t* pool, const BatchLayout& batch,
                    const LayerBlockTable& table, const SlotSpec* specs,
                    const KvCacheLayout& layout, int num_heads, float scale, float* out);

}  // namespace headway::cpu
