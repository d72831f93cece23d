// KvCacheManager::CheckConsistency: a walk over every table, prefix-cache
// entry and block arena of the manager, which it only reads.
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/scheduling/kv_cache_manager.h"

namespace headway {
namespace {

// A violation on TP rank `tp_rank`.
Status RankViolation(int tp_rank, const std::string& what) {
  return Status::Internal("rank " + std::to_string(tp_rank) + ": " + what);
}

}  // namespace

// Each check returns Internal naming the first violation it finds.
class KvCacheManager::ConsistencyCheck {
 public:
  explicit ConsistencyCheck(const KvCacheManager& kv) : kv_(kv) {}

  // The checks below, rank by rank after the refcounts.
  Status Run() const;

 private:
  struct BlockCensus;
  // Tables reference only known entries; each entry's refcount is the
  // number of tables referencing it.
  Status CheckEntryRefcounts() const;
  // On rank `r`: each entry's per-slot holder counts match the rows holding
  // its blocks, and its blocks are allocated and held once (counted into
  // `census`).
  Status CheckEntryBlocks(int r, BlockCensus* census) const;
  // The tables' own blocks (not an entry's) likewise; a table's block of an
  // entry is the entry's.
  Status CheckPrivateBlocks(int r, BlockCensus* census) const;
  // No block leaked, and unused + referenced + evictable blocks add up to
  // the arena's and the cache's counts.
  Status CheckBlockTotals(int r, const BlockCensus& census) const;
  // Every chunk is free or lent to one class whose blocks in it are each
  // allocated or on the chunk's free list, free + lent chunks = total, and
  // the arena's evictable marks are the census's evictable blocks.
  Status CheckChunks(int r, const BlockCensus& census) const;
  // Whether block `b` of the class of rank r's slot `s` is a block the
  // arena lent and nobody else counted yet.
  static bool Claimable(const BlockArena& arena, int cls, int32_t b, const BlockCensus& census);
  // [entry][slot] how many tables' rows of rank `tp_rank` hold the entry's block.
  std::unordered_map<CacheEntryId, std::vector<int>> RowsHoldingEntries(int tp_rank) const;

  const KvCacheManager& kv_;
};

// What CheckConsistency finds on one rank: who holds each block and how the
// held blocks count.
struct KvCacheManager::ConsistencyCheck::BlockCensus {
  explicit BlockCensus(const BlockArena& arena) : owner(size_t(arena.num_classes())) {
    for (int c = 0; c < arena.num_classes(); ++c) owner[size_t(c)].assign(size_t(arena.num_block_ids(c)), 0);
  }
  // [class][block] 0 = unseen, 1 = a sequence's own, 2 = a cached entry's,
  // 3 = a cached entry's, evictable
  std::vector<std::vector<int>> owner;
  int num_referenced = 0;  // held by rows or retained
  int num_retained = 0;    // of those, an entry's block no row holds
  int num_evictable = 0;
};

Status KvCacheManager::ConsistencyCheck::Run() const {
  HW_RETURN_IF_ERROR(CheckEntryRefcounts());
  for (int r = 0; r < kv_.tp_size(); ++r) {
    BlockCensus census(kv_.ranks_[r].arena);
    HW_RETURN_IF_ERROR(CheckEntryBlocks(r, &census));
    HW_RETURN_IF_ERROR(CheckPrivateBlocks(r, &census));
    HW_RETURN_IF_ERROR(CheckBlockTotals(r, census));
    HW_RETURN_IF_ERROR(CheckChunks(r, census));
  }
  return Status::Ok();
}

Status KvCacheManager::ConsistencyCheck::CheckEntryRefcounts() const {
  std::unordered_map<CacheEntryId, int> refs;  // references found in tables
  for (const auto& [key, table] : kv_.tables_) {
    for (CacheEntryId id : table.entries) {
      if (id == kNoCacheEntry) continue;
      if (!kv_.cache_.Contains(id)) {
        return Status::Internal(KeyName(key) + " holds unknown entry " +
                                std::to_string(id));
      }
      ++refs[id];
    }
  }
  for (CacheEntryId id : kv_.cache_.EntryIds()) {
    if (kv_.cache_.refcount(id) != refs[id]) {
      return Status::Internal("entry " + std::to_string(id) + " refcount " +
                              std::to_string(kv_.cache_.refcount(id)) + " but " +
                              std::to_string(refs[id]) + " sequences hold it");
    }
  }
  return Status::Ok();
}

std::unordered_map<CacheEntryId, std::vector<int>>
KvCacheManager::ConsistencyCheck::RowsHoldingEntries(int tp_rank) const {
  std::unordered_map<CacheEntryId, std::vector<int>> holding;
  for (const auto& [key, table] : kv_.tables_) {
    const std::vector<std::vector<int32_t>>& rows = table.rows[tp_rank];
    for (size_t i = 0; i < table.entries.size(); ++i) {
      const CacheEntryId e = table.entries[i];
      if (e == kNoCacheEntry) continue;
      std::vector<int>& h = holding[e];
      h.resize(rows.size(), 0);
      for (size_t s = 0; s < rows.size(); ++s) h[s] += rows[s][i] >= 0;
    }
  }
  return holding;
}

bool KvCacheManager::ConsistencyCheck::Claimable(const BlockArena& arena, int cls, int32_t b,
                                                 const BlockCensus& census) {
  return b < arena.num_block_ids(cls) && arena.is_allocated(cls, b) &&
         arena.chunk_owner(arena.ChunkOf(cls, b)) == cls && census.owner[size_t(cls)][size_t(b)] == 0;
}

Status KvCacheManager::ConsistencyCheck::CheckEntryBlocks(int r, BlockCensus* census) const {
  const Rank& rank = kv_.ranks_[r];
  std::unordered_map<CacheEntryId, std::vector<int>> holding = RowsHoldingEntries(r);
  for (CacheEntryId id : kv_.cache_.EntryIds()) {
    const std::vector<int32_t>& blocks = kv_.cache_.blocks(id)[r];
    for (size_t s = 0; s < blocks.size(); ++s) {
      const int held = holding.count(id) ? holding[id][s] : 0;
      if (kv_.cache_.holders(id, r, int(s)) != held) {
        return RankViolation(r, "entry " + std::to_string(id) + " slot " + std::to_string(s) +
                                    " has " + std::to_string(kv_.cache_.holders(id, r, int(s))) +
                                    " holders but " + std::to_string(held) + " rows hold it");
      }
    }
    for (size_t s = 0; s < blocks.size(); ++s) {
      const int32_t b = blocks[s];
      if (b < 0) continue;  // recycled out of a sliding window
      const int cls = rank.slot_class[s];
      if (!Claimable(rank.arena, cls, b, *census)) {
        return RankViolation(r, "entry " + std::to_string(id) + " block " + std::to_string(b) +
                                    " (class " + std::to_string(cls) +
                                    ") is out of range, unallocated, in another class's chunk "
                                    "or held twice");
      }
      census->owner[size_t(cls)][size_t(b)] = kv_.cache_.refcount(id) > 0 ? 2 : 3;
      (kv_.cache_.refcount(id) > 0 ? census->num_referenced : census->num_evictable) += 1;
      census->num_retained += kv_.cache_.refcount(id) > 0 && kv_.cache_.holders(id, r, int(s)) == 0;
    }
  }
  return Status::Ok();
}

Status KvCacheManager::ConsistencyCheck::CheckPrivateBlocks(int r, BlockCensus* census) const {
  const Rank& rank = kv_.ranks_[r];
  for (const auto& [key, table] : kv_.tables_) {
    for (size_t s = 0; s < table.rows[r].size(); ++s) {
      const std::vector<int32_t>& row = table.rows[r][s];
      for (size_t i = 0; i < row.size(); ++i) {
        int32_t b = row[i];
        if (b < 0) continue;
        CacheEntryId e = i < table.entries.size() ? table.entries[i] : kNoCacheEntry;
        if (e != kNoCacheEntry) {
          if (kv_.cache_.blocks(e)[r][s] != b) {
            return RankViolation(r, KeyName(key) + " slot " + std::to_string(s) +
                                        " logical " + std::to_string(i) +
                                        " differs from its entry");
          }
          continue;
        }
        const int cls = rank.slot_class[s];
        if (!Claimable(rank.arena, cls, b, *census)) {
          return RankViolation(r, KeyName(key) + " block " + std::to_string(b) + " (class " +
                                      std::to_string(cls) +
                                      ") is out of range, unallocated, in another class's chunk "
                                      "or held twice");
        }
        census->owner[size_t(cls)][size_t(b)] = 1;
        ++census->num_referenced;
      }
    }
  }
  return Status::Ok();
}

Status KvCacheManager::ConsistencyCheck::CheckBlockTotals(int r, const BlockCensus& census) const {
  const BlockArena& arena = kv_.ranks_[r].arena;
  for (int c = 0; c < arena.num_classes(); ++c) {
    for (int32_t b = 0; b < arena.num_block_ids(c); ++b) {
      if (census.owner[size_t(c)][size_t(b)] == 0 && arena.is_allocated(c, b)) {
        return RankViolation(r, "block " + std::to_string(b) + " of class " + std::to_string(c) +
                                    " leaked");
      }
    }
  }
  if (census.num_retained != kv_.cache_.num_retained_blocks(r)) {
    return RankViolation(r, "retained " + std::to_string(census.num_retained) + " but the cache says " +
                                std::to_string(kv_.cache_.num_retained_blocks(r)));
  }
  const RankBlockUsage u = kv_.Usage(r);
  const int num_referenced = census.num_referenced, num_evictable = census.num_evictable;
  const int num_unused = u.num_total - num_referenced - num_evictable;
  if (num_evictable != kv_.cache_.num_evictable_blocks(r) || num_referenced != u.num_referenced ||
      num_unused < 0) {
    return RankViolation(r, "referenced " + std::to_string(num_referenced) + " (arena says " +
                                std::to_string(u.num_referenced) + ") + evictable " +
                                std::to_string(num_evictable) + " (cache says " +
                                std::to_string(kv_.cache_.num_evictable_blocks(r)) +
                                ") exceed or miss the total " + std::to_string(u.num_total));
  }
  return Status::Ok();
}

Status KvCacheManager::ConsistencyCheck::CheckChunks(int r, const BlockCensus& census) const {
  const BlockArena& arena = kv_.ranks_[r].arena;
  std::vector<int> lent(size_t(arena.num_classes()), 0);
  int num_free = 0;
  for (int k = 0; k < arena.num_chunks(); ++k) {
    const int c = arena.chunk_owner(k);
    if (c < 0) {
      ++num_free;
      continue;
    }
    ++lent[size_t(c)];
    const int n = arena.blocks_per_chunk(c);
    int allocated = 0;
    for (int32_t b = k * n; b < (k + 1) * n; ++b) {
      allocated += arena.is_allocated(c, b);
      const bool evictable = census.owner[size_t(c)][size_t(b)] == 3;
      if (arena.is_evictable(c, b) != evictable) {
        return RankViolation(r, "block " + std::to_string(b) + " of class " + std::to_string(c) +
                                    (evictable ? " is evictable but not marked so"
                                               : " is marked evictable but is not"));
      }
    }
    // A lent chunk with nothing allocated should have gone back.
    if (allocated == 0) {
      return RankViolation(r, "chunk " + std::to_string(k) + " is lent to class " +
                                  std::to_string(c) + " but holds no block");
    }
    // Blocks of other classes never lie in this chunk's bytes.
    for (int o = 0; o < arena.num_classes(); ++o) {
      if (o == c) continue;
      const int m = arena.blocks_per_chunk(o);
      for (int32_t b = k * m; b < (k + 1) * m; ++b) {
        if (arena.is_allocated(o, b)) {
          return RankViolation(r, "chunk " + std::to_string(k) + " of class " + std::to_string(c) +
                                      " also holds block " + std::to_string(b) + " of class " +
                                      std::to_string(o));
        }
      }
    }
  }
  int total_lent = 0;
  for (int c = 0; c < arena.num_classes(); ++c) {
    if (lent[size_t(c)] != arena.num_lent_chunks(c)) {
      return RankViolation(r, "class " + std::to_string(c) + " has " + std::to_string(lent[size_t(c)]) +
                                  " chunks but the arena counts " +
                                  std::to_string(arena.num_lent_chunks(c)));
    }
    total_lent += lent[size_t(c)];
  }
  if (num_free != arena.num_free_chunks() || num_free + total_lent != arena.num_chunks()) {
    return RankViolation(r, "free chunks " + std::to_string(num_free) + " (arena says " +
                                std::to_string(arena.num_free_chunks()) + ") + lent " +
                                std::to_string(total_lent) + " != total " +
                                std::to_string(arena.num_chunks()));
  }
  return Status::Ok();
}

Status KvCacheManager::CheckConsistency() const { return ConsistencyCheck(*this).Run(); }

}  // namespace headway
