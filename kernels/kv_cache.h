// KV cache layout and the head-wise block table as kernels see them.
//
// A rank's KV pool is one array of `num_blocks` equal blocks (f32, host):
//   block b: K [block_size, head_dim] | V [block_size, head_dim]
// at pool + b * BlockFloats(). Any slot (layer, local KV head) can take any
// block. Logical block i of a slot covers positions [i*block_size,
// (i+1)*block_size); its block id comes from the slot's row of the block
// table. An entry of -1 means "no block" (recycled out of a sliding window);
// kernels never read such an entry.
#pragma once

#include <cstddef>
#include <cstdint>

namespace headway {

// Version of the block byte layout below. KV transfer refuses to pair ranks
// whose versions differ (their blocks would be misread): bump it whenever the
// layout of a block changes.
constexpr uint32_t kKvBlockLayoutVersion = 1;

struct KvCacheLayout {
  int block_size = 16;  // positions per block
  int head_dim = 64;    // values per head vector

  size_t BlockFloats() const { return size_t(2) * block_size * head_dim; }
  size_t BlockBytes() const { return BlockFloats() * sizeof(float); }
  // Offset (in floats) of K and V of `pos_in_block` inside a block.
  size_t KOffset(int pos_in_block) const { return size_t(pos_in_block) * head_dim; }
  size_t VOffset(int pos_in_block) const {
    return size_t(block_size) * head_dim + size_t(pos_in_block) * head_dim;
  }
};

// The batch's sequences and their new tokens. Rows of q/k/v/out tensors are
// tokens, grouped by sequence: sequence s owns rows [query_start[s],
// query_start[s+1]); row query_start[s] + j sits at position start_pos[s] + j.
// A decode token is a sequence with one row; a prefill chunk has many; both
// mix in one batch.
struct BatchLayout {
  int num_seqs = 0;
  const int32_t* query_start = nullptr;  // [num_seqs + 1], query_start[0] == 0
  const int32_t* start_pos = nullptr;    // [num_seqs]
  int num_tokens() const { return query_start[num_seqs]; }
};

// One layer's head-wise block table for the batch, dense:
//   block_ids[(s * num_kv_heads + h) * max_blocks + i] = block id of logical
//   block i of sequence s, local KV head h; -1 = none.
// Entries past a sequence's last block are -1.
struct LayerBlockTable {
  const int32_t* block_ids = nullptr;  // [num_seqs, num_kv_heads, max_blocks]
  int num_kv_heads = 0;
  int max_blocks = 0;

  const int32_t* Row(int seq, int kv_head) const {
    return block_ids + (size_t(seq) * num_kv_heads + kv_head) * max_blocks;
  }
};

// Attention spec of one slot. window == 0: full causal attention. Otherwise
// sliding: a query at position p sees keys k <= p with k > p - window or
// k < sink (DESIGN.md "Attention spec").
struct SlotSpec {
  int32_t window = 0;
  int32_t sink = 0;

  bool IsSliding() const { return window > 0; }
  bool Sees(int64_t query_pos, int64_t key_pos) const {
    if (key_pos > query_pos) return false;
    if (window <= 0) return true;
    return key_pos > query_pos - window || key_pos < sink;
  }
};

}  // namespace headway
