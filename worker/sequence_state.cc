#include "worker/sequence_state.h"

#include <algorithm>
#include <string>

namespace headway {
namespace {

std::string Where(const SequenceState& state, uint32_t slot) {
  return "seq " + std::to_string(state.seq_id) + " slot " + std::to_string(slot);
}

}  // namespace

Status ApplySlotDelta(const proto::SlotDelta& delta, int num_blocks, SequenceState* state) {
  const uint32_t slot = delta.slot();
  if (slot >= state->block_rows.size()) {
    return Status::InvalidArgument("delta for " + Where(*state, slot) + ": slot out of [0, " +
                                   std::to_string(state->block_rows.size()) + ")");
  }
  std::vector<int32_t>& row = state->block_rows[slot];
  const uint64_t first = delta.first_logical();
  if (delta.appended_size() > 0 && first < row.size()) {
    return Status::InvalidArgument("delta for " + Where(*state, slot) + ": first_logical " +
                                   std::to_string(first) + " would replace logical block(s) " +
                                   "already in the row (row has " +
                                   std::to_string(row.size()) + ")");
  }
  for (int32_t id : delta.appended()) {
    if (id < 0 || id >= num_blocks) {
      return Status::InvalidArgument("delta for " + Where(*state, slot) + ": block id " +
                                     std::to_string(id) + " out of [0, " +
                                     std::to_string(num_blocks) + ")");
    }
  }
  const uint64_t new_size =
      delta.appended_size() > 0 ? first + uint64_t(delta.appended_size()) : row.size();
  for (uint32_t i : delta.recycled()) {
    if (i >= new_size) {
      return Status::InvalidArgument("delta for " + Where(*state, slot) +
                                     ": recycled logical block " + std::to_string(i) +
                                     " past the row's end " + std::to_string(new_size));
    }
  }
  // Checked: commit.
  if (delta.appended_size() > 0) {
    row.resize(first, -1);
    row.insert(row.end(), delta.appended().begin(), delta.appended().end());
  }
  for (uint32_t i : delta.recycled()) row[i] = -1;
  return Status::Ok();
}

Status CheckBlocksCover(const SequenceState& state, const std::vector<SlotSpec>& slot_specs,
                        int block_size, int64_t begin, int64_t end) {
  if (end <= 0) return Status::Ok();
  const int64_t last_block = (end - 1) / block_size;
  for (size_t slot = 0; slot < state.block_rows.size(); ++slot) {
    const std::vector<int32_t>& row = state.block_rows[slot];
    const SlotSpec& spec = slot_specs[slot];
    for (int64_t i = 0; i <= last_block; ++i) {
      const int64_t lo = i * block_size;
      const int64_t hi = lo + block_size;  // block covers [lo, hi)
      bool needed = true;
      if (spec.IsSliding()) {
        const int64_t window_lo = std::max<int64_t>(0, begin - spec.window + 1);
        needed = lo < spec.sink || (hi > window_lo && lo < end);
      }
      if (needed && (size_t(i) >= row.size() || row[i] < 0)) {
        return Status::FailedPrecondition(
            Where(state, uint32_t(slot)) + ": logical block " + std::to_string(i) +
            " (positions [" + std::to_string(lo) + ", " + std::to_string(hi) +
            ")) has no block but the step computing positions [" + std::to_string(begin) +
            ", " + std::to_string(end) + ") needs it");
      }
    }
  }
  return Status::Ok();
}

}  // namespace headway
