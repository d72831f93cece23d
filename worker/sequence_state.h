// What a worker remembers about one sequence between steps: its head-wise
// block table on this rank and how many positions have K/V in the pool.
// The coordinator owns allocation; the worker only mirrors the table through
// the deltas of each StepPlan (proto/control.proto SlotDelta).
#pragma once

#include <cstdint>
#include <vector>

#include "common/kv_layout.h"
#include "common/status.h"
#include "proto/control.pb.h"

namespace headway {

struct SequenceState {
  uint64_t seq_id = 0;
  // Seed of the sampling RNG when the request gives none (chosen at is_new).
  uint64_t rng_seed = 0;
  // Positions [0, num_computed) have their K/V in the blocks of the table.
  int64_t num_computed = 0;
  // block_rows[slot][i] = block id of logical block i of local slot `slot`
  // (= layer * num_local_kv_heads + local KV head), covering positions
  // [i*block_size, (i+1)*block_size); -1 = no block (recycled or never given).
  std::vector<std::vector<int32_t>> block_rows;  // [num_slots][logical blocks]
};

// Applies one slot delta to `state`: the appended ids become logical blocks
// first_logical, first_logical+1, ... (entries between the row's old end and
// first_logical become -1), then every recycled logical index becomes -1.
// The delta is checked in full before anything changes; on error `state` is
// untouched. Errors (InvalidArgument, naming seq, slot and values): slot out
// of [0, block_rows.size()); first_logical before the row's end (it would
// replace a block); a block id out of [0, num_blocks); a recycled index past
// the row's end.
Status ApplySlotDelta(const proto::SlotDelta& delta, int num_blocks, SequenceState* state);

// OK if every position that a step computing positions [begin, end) writes
// or lets a query see has a block on every slot: for slot spec S, the logical
// blocks covering [0, end) for full slots, and [0, sink) plus
// [begin - window + 1, end) for sliding ones. FailedPrecondition naming the
// seq, slot and logical block otherwise. Kernels must never read a -1 entry.
Status CheckBlocksCover(const SequenceState& state, const std::vector<SlotSpec>& slot_specs,
                        int block_size, int64_t begin, int64_t end);

}  // namespace headway
