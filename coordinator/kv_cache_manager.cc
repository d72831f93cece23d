#include "coordinator/kv_cache_manager.h"

#include <algorithm>
#include <limits>

#include "common/status.h"

namespace headway {

KvCacheManager::KvCacheManager(const ModelSpec& spec, int tp_size, int block_size,
                               std::vector<int> num_blocks_per_rank)
    : block_size_(block_size) {
  HW_CHECK(block_size > 0);
  HW_CHECK(tp_size >= 1 && static_cast<int>(num_blocks_per_rank.size()) == tp_size);
  HW_CHECK(ValidateTpSize(spec, tp_size).ok());
  ranks_.reserve(tp_size);
  for (int r = 0; r < tp_size; ++r) {
    TpShard shard = ShardForRank(spec, tp_size, r);
    std::vector<SlotSpec> specs;
    specs.reserve(size_t(spec.num_layers) * shard.num_local_kv_heads());
    for (int layer = 0; layer < spec.num_layers; ++layer) {
      for (int h = shard.kv_head_begin; h < shard.kv_head_end; ++h) {
        size_t global = size_t(layer) * spec.num_kv_heads + h;
        specs.push_back(global < spec.slot_specs.size() ? spec.slot_specs[global] : SlotSpec{});
      }
    }
    ranks_.push_back(Rank{std::move(specs), BlockPool(num_blocks_per_rank[r])});
  }
}

int KvCacheManager::num_slots(int tp_rank) const {
  return static_cast<int>(ranks_.at(tp_rank).slot_specs.size());
}

int64_t KvCacheManager::LogicalBlocks(const SlotSpec& spec, int64_t num_positions) const {
  return (num_positions + block_size_ - 1) / block_size_;
}

int KvCacheManager::BlocksNeeded(int tp_rank, uint64_t seq_id, int64_t num_positions) const {
  const Rank& rank = ranks_.at(tp_rank);
  auto it = tables_.find(seq_id);
  int64_t needed = 0;
  for (size_t s = 0; s < rank.slot_specs.size(); ++s) {
    int64_t have = it == tables_.end() ? 0 : int64_t(it->second.rows[tp_rank][s].size());
    needed += std::max<int64_t>(0, LogicalBlocks(rank.slot_specs[s], num_positions) - have);
  }
  return static_cast<int>(std::min<int64_t>(needed, std::numeric_limits<int>::max()));
}

bool KvCacheManager::CanAppend(uint64_t seq_id, int64_t num_positions) const {
  for (int r = 0; r < tp_size(); ++r) {
    if (!ranks_[r].pool.CanAllocate(BlocksNeeded(r, seq_id, num_positions))) return false;
  }
  return true;
}

std::vector<std::vector<SlotBlockDelta>> KvCacheManager::Append(uint64_t seq_id,
                                                                int64_t num_positions) {
  HW_CHECK(CanAppend(seq_id, num_positions));
  SeqTable& table = tables_[seq_id];
  if (table.rows.empty()) {
    table.rows.resize(ranks_.size());
    for (size_t r = 0; r < ranks_.size(); ++r) table.rows[r].resize(ranks_[r].slot_specs.size());
  }
  std::vector<std::vector<SlotBlockDelta>> deltas(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Rank& rank = ranks_[r];
    for (size_t s = 0; s < rank.slot_specs.size(); ++s) {
      std::vector<int32_t>& row = table.rows[r][s];
      int64_t want = LogicalBlocks(rank.slot_specs[s], num_positions);
      if (want <= int64_t(row.size())) continue;
      SlotBlockDelta delta;
      delta.slot = static_cast<int>(s);
      delta.first_logical = static_cast<int>(row.size());
      delta.appended = rank.pool.Allocate(static_cast<int>(want - int64_t(row.size())));
      row.insert(row.end(), delta.appended.begin(), delta.appended.end());
      deltas[r].push_back(std::move(delta));
    }
  }
  table.num_positions = std::max(table.num_positions, num_positions);
  return deltas;
}

void KvCacheManager::Release(uint64_t seq_id) {
  auto it = tables_.find(seq_id);
  if (it == tables_.end()) return;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    for (std::vector<int32_t>& row : it->second.rows[r]) {
      std::vector<int32_t> held;
      held.reserve(row.size());
      for (int32_t id : row) {
        if (id >= 0) held.push_back(id);  // -1: already recycled
      }
      ranks_[r].pool.Free(held);
    }
  }
  tables_.erase(it);
}

int64_t KvCacheManager::NumCoveredPositions(uint64_t seq_id) const {
  auto it = tables_.find(seq_id);
  return it == tables_.end() ? 0 : it->second.num_positions;
}

int64_t KvCacheManager::MaxPositionsPerSequence() const {
  int64_t best = std::numeric_limits<int64_t>::max();
  for (const Rank& rank : ranks_) {
    int64_t slots = int64_t(rank.slot_specs.size());
    if (slots == 0) continue;
    // Full slots keep every block, so the pool divides evenly among them.
    best = std::min(best, (rank.pool.num_total() / slots) * block_size_);
  }
  return best == std::numeric_limits<int64_t>::max() ? 0 : best;
}

RankBlockUsage KvCacheManager::Usage(int tp_rank) const {
  const BlockPool& pool = ranks_.at(tp_rank).pool;
  return RankBlockUsage{pool.num_free(), pool.num_total()};
}

const std::vector<int32_t>& KvCacheManager::TEST_Row(uint64_t seq_id, int tp_rank,
                                                     int slot) const {
  return tables_.at(seq_id).rows.at(tp_rank).at(slot);
}

}  // namespace headway
