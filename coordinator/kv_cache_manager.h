// The head-wise block table of one instance, and its per-rank block pools.
//
// table[seq][tp_rank][slot] -> block ids, where a rank's slots are its
// (layer, local KV head) pairs, slot = layer * num_local_kv_heads + local
// head (ShardForRank). Logical block i of a slot covers positions
// [i * block_size, (i + 1) * block_size). Every rank has its own pool, so a
// KV head replicated on several ranks (num_kv_heads < tp_size) takes blocks
// on every replica rank.
//
// Check, then commit: CanAppend answers whether Append would succeed; Append
// either allocates everything a sequence needs on every rank or (when the
// precondition is broken) aborts, so a sequence is never half-allocated.
//
// Not thread-safe: owned by one instance's scheduler on the engine thread.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/model_spec.h"
#include "coordinator/block_pool.h"
#include "kernels/kv_cache.h"

namespace headway {

// Blocks appended to one slot's row (proto::SlotDelta without the wire).
struct SlotBlockDelta {
  int slot = 0;
  int first_logical = 0;          // logical index of appended[0]
  std::vector<int32_t> appended;  // ids for logical blocks first_logical, ...
};

// Per-rank block usage, for /health and tests.
struct RankBlockUsage {
  int num_free = 0;
  int num_total = 0;
};

class KvCacheManager {
 public:
  // `num_blocks_per_rank[r]` is rank r's pool size (from its RegisterRequest).
  // REQUIRES: ValidateTpSize(spec, tp_size).ok(), block_size > 0,
  // num_blocks_per_rank.size() == tp_size.
  KvCacheManager(const ModelSpec& spec, int tp_size, int block_size,
                 std::vector<int> num_blocks_per_rank);

  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  int tp_size() const { return static_cast<int>(ranks_.size()); }
  int block_size() const { return block_size_; }
  int num_slots(int tp_rank) const;

  // Blocks rank `tp_rank` must allocate so that `seq_id` (known or not)
  // covers positions [0, num_positions). 0 if it already does.
  int BlocksNeeded(int tp_rank, uint64_t seq_id, int64_t num_positions) const;

  // True if Append(seq_id, num_positions) would find enough free blocks on
  // every rank.
  bool CanAppend(uint64_t seq_id, int64_t num_positions) const;

  // Grows `seq_id` (creating its table on first use) so every slot covers
  // positions [0, num_positions). Returns, per rank, the deltas of the slots
  // that received blocks (empty when nothing was needed).
  // REQUIRES: CanAppend(seq_id, num_positions).
  std::vector<std::vector<SlotBlockDelta>> Append(uint64_t seq_id, int64_t num_positions);

  // Returns every block of `seq_id` to its pool and forgets the sequence.
  // No-op for an unknown id.
  void Release(uint64_t seq_id);

  bool Contains(uint64_t seq_id) const { return tables_.count(seq_id) > 0; }
  // Positions [0, n) the sequence's blocks cover; 0 for an unknown id.
  int64_t NumCoveredPositions(uint64_t seq_id) const;
  size_t num_sequences() const { return tables_.size(); }

  // The most positions one sequence could ever hold with the pools empty of
  // everything else (min over ranks). Admission rejects longer requests so a
  // sequence can never wait forever for blocks that do not exist.
  int64_t MaxPositionsPerSequence() const;

  RankBlockUsage Usage(int tp_rank) const;

  // The row of one slot (block ids by logical index). REQUIRES: known seq.
  const std::vector<int32_t>& TEST_Row(uint64_t seq_id, int tp_rank, int slot) const;

 private:
  struct Rank {
    std::vector<SlotSpec> slot_specs;  // [num_slots]
    BlockPool pool;
  };
  struct SeqTable {
    int64_t num_positions = 0;
    std::vector<std::vector<std::vector<int32_t>>> rows;  // [rank][slot][logical]
  };

  // Logical blocks slot `spec` must hold to cover [0, num_positions). Every
  // slot keeps all of them today. Sliding-window recycling plugs in here and
  // in Append: a sliding slot's blocks wholly outside its sink and window
  // return to the pool and their entries become -1 (DESIGN.md "Recycling").
  int64_t LogicalBlocks(const SlotSpec& spec, int64_t num_positions) const;

  int block_size_;
  std::vector<Rank> ranks_;
  std::unordered_map<uint64_t, SeqTable> tables_;
};

}  // namespace headway
