// append_kv fused with RoPE, and paged attention over head-wise discrete
// blocks, on a CUDA device: the contracts of kernels/attention.h (CPU) on
// device memory. The pool layout, the head-wise block table and slot specs
// are kernels/kv_cache.h's; a block is laid out in its layout's KV cache
// dtype exactly as on a CPU rank (common/kv_layout.h: float32, float16,
// q8_0, q4_0, q4_0_hadamard), written with the reference's rounding, so KV
// transfer pairs CPU and GPU ranks.
//
// GQA: query head qh uses KV head qh / (num_heads / num_kv_heads).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/elementwise.h"
#include "kernels/kv_cache.h"

namespace headway::cuda {

// The batch on the device. Arrays are device memory; the scalars are known
// on the host (the step executor computes them) and size the launch grids.
struct DeviceBatch {
  int num_seqs = 0;
  int num_tokens = 0;
  const int32_t* query_start = nullptr;  // [num_seqs + 1], as BatchLayout
  const int32_t* start_pos = nullptr;    // [num_seqs]
  const int32_t* token_seq = nullptr;    // [num_tokens]: sequence of each row
  const int32_t* positions = nullptr;    // [num_tokens]: start_pos[seq] + row offset
  int max_query_len = 0;    // max over sequences of query_start[s+1] - query_start[s]
  int max_context_len = 0;  // max over sequences of start_pos[s] + query length
};

// RoPE of this step's Q (in place) and K, and the write of rotated K and of
// V into the pool through the block table, in one kernel.
//   q: [num_tokens, num_heads, head_dim] f32, rotated in place
//   k, v: [num_tokens, num_kv_heads, head_dim] f32 (k is not modified)
//   table: device block ids [num_seqs, num_kv_heads, max_blocks]
//   pool: [num_blocks, layout.BlockBytes()] bytes, device; rows written in
//         layout.dtype. The K rows are f32 rotations with every rounding
//         explicit (no fused multiply-add), so for every dtype the bytes are
//         reference::QuantizeKvRow of the float32 kernel's rows.
// Angles as cpu::Rope (double precision, then f32 cos/sin). One CTA of 128
// threads per token, reading batch.token_seq and batch.positions; it encodes
// one KV head's K and V rows at a time through shared memory.
// REQUIRES: every position written has a block id >= 0 (the step executor
// checks this on the host before the step; the kernel skips a -1 entry, and
// a position outside the table, rather than write out of bounds);
// layout.head_dim even and <= 512, and layout.Check() empty; pool 16-byte
// aligned; table.block_ids device memory.
void RopeAppendKv(float* q, const float* k, const float* v, const DeviceBatch& batch,
                  const LayerBlockTable& table, const KvCacheLayout& layout, int num_heads,
                  float freq_base, cpu::RopeStyle style, uint8_t* pool, Stream stream);

// Scratch for PagedAttention, sized for the largest batch the caller will
// run: bytes for a DeviceBuffer. Workspace convention (the only one): the
// caller allocates once PagedAttentionWorkspaceBytes(max_tokens, num_heads,
// head_dim) and passes it to every PagedAttention call with num_tokens <=
// max_tokens (same num_heads and head_dim); the contents are scratch, not
// kept between calls, so calls sharing one workspace must be ordered on one
// stream. It holds, in this order, each 256-byte aligned:
//   tile_start:  int32 [max_tokens + 1]    first row tile of each sequence
//   partial_ml:  f32 [cap * num_heads, 2]  softmax max and sum of each split
//   partial_acc: f32 [cap * num_heads, head_dim]  unnormalised split outputs
// where cap = min(max_tokens * 64, 2048) is the number of (token row, split)
// pairs it holds (about 34 MB at 32 heads, head_dim 128, max_tokens >= 32);
// partial (row, query head, split) sits at index (row * num_heads + head) *
// splits + split. PagedAttention picks fewer splits rather than overrun it.
//   max_tokens: rows per step (>= 0); num_heads: local query heads.
size_t PagedAttentionWorkspaceBytes(int max_tokens, int num_heads, int head_dim);

// How many splits along the KV length PagedAttention uses for `batch` on the
// current device (1: no split, no merge kernel). Depends only on the host
// scalars of `batch` and the device's SM count; for tests and benchmarks.
int PagedAttentionSplits(const DeviceBatch& batch, int num_heads, int num_kv_heads,
                         int head_dim);

// Causal attention of every row of `batch` over the pool, masked per KV head
// by `specs` (device array [num_kv_heads]), as cpu::PagedAttention:
//   q: [num_tokens, num_heads, head_dim] f32 (after RoPE)
//   pool: [num_blocks, layout.BlockBytes()] bytes in layout.dtype, device;
//         keys and values are decoded to f32 as they are read, and for
//         q4_0_hadamard the queries are rotated and the outputs rotated back
//         (common/kv_layout.h), so the output is f32 attention over the
//         decoded values up to summation order
//   out: [num_tokens, num_heads, head_dim] f32
//   scale: usually 1 / sqrt(head_dim)
// Work split (FlashDecoding, Dao et al. 2023; vLLM paged attention v2): one
// CTA per (sequence, KV head, KV split) serves all query heads of the KV head
// for a tile of rows, so each K/V block is read once per tile; sequences long
// enough to leave SMs idle split along the KV length and a second kernel
// merges the partial softmaxes. Each CTA starts at its first live block (for
// a sliding slot: the sink blocks, then the window's first block), so -1
// entries are never loaded. Online softmax in f32.
// Launch: one CTA of 128 threads per (row tile, query-head chunk, KV split,
// KV head). A row tile is up to 4096 / head_dim query vectors (rows x query
// heads of the group) of one sequence; a group larger than that is cut into
// head chunks. Keys go through shared memory 16 at a time, double-buffered
// with cp.async. Splits: as many as make ~16 CTAs per SM, at most 64, at
// least 128 keys of max_context_len each, within the workspace's cap.
// REQUIRES: AppendKv for this step ran first; every visible position has a
// block; layout.head_dim in {64, 128, 256}; num_heads a
// multiple of table.num_kv_heads; every sequence has >= 1 row (so num_seqs <=
// num_tokens); batch.max_context_len >= the longest context (a smaller value
// only costs speed); q, out, pool, workspace 16-byte aligned (cudaMalloc'd);
// workspace of at least PagedAttentionWorkspaceBytes(num_tokens, num_heads,
// head_dim) bytes. Violations of the host-checkable ones abort (HW_CHECK).
void PagedAttention(const float* q, const uint8_t* pool, const DeviceBatch& batch,
                    const LayerBlockTable& table, const SlotSpec* specs,
                    const KvCacheLayout& layout, int num_heads, float scale, void* workspace,
                    float* out, Stream stream);

}  // namespace headway::cuda
