#include "coordinator/scheduling/slot_blocks.h"

#include <algorithm>

#include "common/status.h"

namespace headway {

SlotBlocks::SlotBlocks(int block_size, bool enable_recycling)
    : block_size_(block_size), enable_recycling_(enable_recycling) {
  HW_CHECK(block_size >= 1);
}

int64_t SlotBlocks::LogicalBlocks(int64_t num_positions) const {
  return (num_positions + block_size_ - 1) / block_size_;
}

int64_t SlotBlocks::SinkBlocks(const SlotSpec& spec) const {
  return (int64_t(spec.sink) + block_size_ - 1) / block_size_;
}

BlockSpan SlotBlocks::Unneeded(const SlotSpec& spec, int64_t first_uncomputed) const {
  if (!Recycles(spec)) return {};
  const int64_t sink_blocks = SinkBlocks(spec);
  const int64_t live_begin =
      std::max<int64_t>(0, first_uncomputed - spec.window + 1) / block_size_;
  return {sink_blocks, std::max(sink_blocks, live_begin)};
}

int64_t SlotBlocks::BlocksToAdd(const SlotSpec& spec, int64_t have, int64_t num_positions,
                                int64_t first_uncomputed) const {
  const int64_t want = LogicalBlocks(num_positions);
  if (want <= have) return 0;
  const BlockSpan skip = Unneeded(spec, first_uncomputed);
  const int64_t skipped =
      std::max<int64_t>(0, std::min(want, skip.end) - std::max(have, skip.begin));
  return want - have - skipped;
}

int64_t SlotBlocks::PeakBlocks(const SlotSpec& spec, int64_t num_positions,
                               int max_chunk_tokens) const {
  const int64_t all = LogicalBlocks(num_positions);
  if (!Recycles(spec)) return all;
  const int64_t span = int64_t(spec.window) - 1 + max_chunk_tokens;
  return std::min(all, SinkBlocks(spec) + (span + 2 * block_size_ - 2) / block_size_);
}

BlockSpan SlotBlocks::RetainedSpan(const SlotSpec& spec, int64_t prompt_positions) const {
  if (!Recycles(spec)) return {};
  const int64_t committed_blocks = prompt_positions / block_size_;
  const int64_t earliest_match = std::max<int64_t>(0, (committed_blocks - 1) * block_size_);
  return {Unneeded(spec, earliest_match).end, committed_blocks};
}

int64_t SlotBlocks::FootprintBlocks(const SlotSpec& spec, int64_t max_positions, bool retains,
                                    int64_t decode_positions) const {
  const int64_t all = LogicalBlocks(max_positions);
  if (!Recycles(spec)) return all;
  const int64_t window = 1 + (int64_t(spec.window) - 1 + block_size_ - 1) / block_size_;
  const int64_t behind =
      retains ? std::min(window, LogicalBlocks(std::max<int64_t>(0, decode_positions)) + 2) : 0;
  return std::min(all, SinkBlocks(spec) + window + behind);
}

int64_t SlotBlocks::ChunkExtraBlocks(const SlotSpec& spec, int chunk_tokens) const {
  HW_CHECK(chunk_tokens >= 1);
  if (!Recycles(spec)) return 0;
  return (int64_t(chunk_tokens) - 1 + block_size_ - 1) / block_size_;
}

}  // namespace headway
