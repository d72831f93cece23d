// The batch and its head-wise block table as attention kernels take them:
// views over arrays the caller owns, valid for one kernel call. The block
// byte layout (KvCacheLayout), its version and the slot attention spec
// (SlotSpec) are common/kv_layout.h's, shared with the coordinator; an entry
// of -1 in a block table means "no block" and kernels never read such an
// entry.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/kv_layout.h"

namespace headway {

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

}  // namespace headway
