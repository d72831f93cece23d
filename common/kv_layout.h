// What a KV block is, byte for byte, and what attention a slot applies: the
// facts the coordinator (allocation, transfer planning, registration), the
// worker (pools, transfer) and the kernels must agree on. Kernel argument
// views over a batch (BatchLayout, LayerBlockTable) are kernels/kv_cache.h's.
//
// A rank's KV pool is one array of `num_blocks` equal blocks (f32, host or
// device):
//   block b: K [block_size, head_dim] | V [block_size, head_dim]
// at pool + b * BlockFloats(). Any slot (layer, local KV head) can take any
// block. Logical block i of a slot covers positions [i*block_size,
// (i+1)*block_size); its block id comes from the slot's row of the head-wise
// block table, where -1 means "no block" (recycled out of a sliding window).
#pragma once

#include <cstddef>
#include <cstdint>

namespace headway {

// Version of the block byte layout below. KV transfer refuses to pair ranks
// whose versions differ (their blocks would be misread): bump it whenever the
// layout of a block changes.
constexpr uint32_t kKvBlockLayoutVersion = 1;

// The shape of one block. Sizes are counts of f32 values unless named bytes.
struct KvCacheLayout {
  int block_size = 16;  // positions per block
  int head_dim = 64;    // values per head vector

  // Values (f32) in one block: K and V, [block_size, head_dim] each.
  size_t BlockFloats() const { return size_t(2) * block_size * head_dim; }
  size_t BlockBytes() const { return BlockFloats() * sizeof(float); }
  // Offset (in floats) of K and V of `pos_in_block` inside a block.
  // REQUIRES: 0 <= pos_in_block < block_size.
  size_t KOffset(int pos_in_block) const { return size_t(pos_in_block) * head_dim; }
  size_t VOffset(int pos_in_block) const {
    return size_t(block_size) * head_dim + size_t(pos_in_block) * head_dim;
  }
};

// Attention spec of one slot. window == 0: full causal attention. Otherwise
// sliding: a query at position p sees keys k <= p with k > p - window or
// k < sink (DESIGN.md "Attention spec").
struct SlotSpec {
  int32_t window = 0;  // positions; 0 = full attention
  int32_t sink = 0;    // leading positions every query sees; used only when sliding

  bool IsSliding() const { return window > 0; }
  // Whether a query at `query_pos` attends to the key at `key_pos`.
  bool Sees(int64_t query_pos, int64_t key_pos) const {
    if (key_pos > query_pos) return false;
    if (window <= 0) return true;
    return key_pos > query_pos - window || key_pos < sink;
  }
};

}  // namespace headway
