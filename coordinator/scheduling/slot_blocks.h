// Which logical blocks of one slot a sequence needs (DESIGN.md "Recycling"),
// for a block size B and a recycling setting: pure arithmetic over a slot's
// attention spec, no blocks are held here. The KvCacheManager asks it what
// to allocate, what to recycle and how long a sequence can grow.
//
// A full slot (or any slot with recycling off) needs every logical block
// [0, ceil(L / B)) of a sequence of L positions. A sliding slot (window W,
// sink S) whose first uncomputed position is p needs only its sink blocks,
// logical [0, ceil(S / B)), and the blocks from floor(max(0, p - W + 1) / B)
// on: earlier ones lie wholly outside the window of every position still to
// be computed. Ranges are [begin, end).
//
// Immutable after construction: thread-safe.
#pragma once

#include <cstdint>

#include "common/kv_layout.h"

namespace headway {

// Logical blocks [begin, end); empty when end <= begin.
struct BlockSpan {
  int64_t begin = 0;
  int64_t end = 0;
  bool Contains(int64_t i) const { return i >= begin && i < end; }
};

class SlotBlocks {
 public:
  // REQUIRES: block_size >= 1.
  SlotBlocks(int block_size, bool enable_recycling);

  // Logical blocks [0, n) cover positions [0, num_positions).
  int64_t LogicalBlocks(int64_t num_positions) const;

  // Logical blocks that lie wholly outside the sink and the window of every
  // position from `first_uncomputed` on: what the slot does not need.
  // end >= begin; empty for full slots and with recycling off.
  BlockSpan Unneeded(const SlotSpec& spec, int64_t first_uncomputed) const;

  // Blocks the slot still has to allocate, logical [have, want), to cover
  // [0, num_positions) from `first_uncomputed` on (Unneeded ones skipped).
  int64_t BlocksToAdd(const SlotSpec& spec, int64_t have, int64_t num_positions,
                      int64_t first_uncomputed) const;

  // The most blocks the slot holds at once for a sequence of
  // `num_positions` positions computed in chunks of at most
  // `max_chunk_tokens`: at a step computing [p, p + c) a recycling sliding
  // slot holds its sink blocks and blocks floor((p - W + 1) / B) ..
  // ceil((p + c) / B) - 1, at most sink_blocks + ceil((W - 1 + c + B - 1) / B)
  // of them; any other slot all of them.
  int64_t PeakBlocks(const SlotSpec& spec, int64_t num_positions, int max_chunk_tokens) const;

  // Prompt-boundary retention (DESIGN.md "Recycling"): the logical blocks a
  // recycling sliding slot keeps cached after a sequence with a prompt of
  // `prompt_positions` positions moves past them, so that a later request
  // with that prompt, or one diverging inside its last committed block,
  // finds the window its first uncomputed position needs. With L =
  // floor(prompt_positions / B) * B the committed length, that is the
  // window of every match of L - B .. L positions: logical
  // [Unneeded(spec, max(0, L - B)).end, L / B), at most 1 + ceil((W - 1) /
  // B) blocks (one window rounded out to whole blocks, plus the one-block
  // gap for a match that ends a block early). The sink is never recycled,
  // so it is not part of the span. Empty for slots that do not recycle.
  BlockSpan RetainedSpan(const SlotSpec& spec, int64_t prompt_positions) const;

  // A request's footprint in this slot (Scheduler admission): the most
  // blocks it can hold at once, decode tail included, as it grows to
  // `max_positions`, computing one token per step. A full slot (or any slot
  // with recycling off): LogicalBlocks(max_positions). A recycling sliding
  // slot (window W, sink S): min(LogicalBlocks(max_positions), sink blocks
  // + the window of a one-token step, 1 + ceil((W - 1) / B) blocks, + when
  // `retains` (prefix caching) the retained span's blocks that can lie
  // behind that window: as many again, but no more than the request moves
  // past its prompt: ceil(decode_positions / B) + 2, since the committed
  // length starts up to B - 1 positions before the prompt's end and the
  // window's first block may be partial).
  int64_t FootprintBlocks(const SlotSpec& spec, int64_t max_positions, bool retains,
                          int64_t decode_positions) const;

  // Blocks a prefill chunk of `chunk_tokens` can span in this slot beyond
  // a one-token step's: ceil((chunk_tokens - 1) / B) for a recycling
  // sliding slot, 0 for any other (its footprint already covers every
  // position). REQUIRES: chunk_tokens >= 1.
  int64_t ChunkExtraBlocks(const SlotSpec& spec, int chunk_tokens) const;

  int block_size() const { return block_size_; }

 private:
  bool Recycles(const SlotSpec& spec) const { return spec.IsSliding() && enable_recycling_; }
  int64_t SinkBlocks(const SlotSpec& spec) const;

  const int block_size_;
  const bool enable_recycling_;
};

}  // namespace headway
