// KvCacheManager::CheckConsistency: a walk over every table, prefix-cache
// entry and block pool of the manager, which it only reads.
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
  // the pool's and the cache's counts.
  Status CheckBlockTotals(int r, const BlockCensus& census) const;
  // [entry][slot] how many tables' rows of rank `tp_rank` hold the entry's block.
  std::unordered_map<CacheEntryId, std::vector<int>> RowsHoldingEntries(int tp_rank) const;

  const KvCacheManager& kv_;
};

// What CheckConsistency finds on one rank: who holds each block and how the
// held blocks count.
struct KvCacheManager::ConsistencyCheck::BlockCensus {
  explicit BlockCensus(int num_blocks) : owner(size_t(num_blocks), 0) {}
  std::vector<int> owner;  // [block] 0 = unseen, 1 = a sequence's own, 2 = a cached entry's
  int num_referenced = 0;  // held by rows or retained
  int num_retained = 0;    // of those, an entry's block no row holds
  int num_evictable = 0;
};

Status KvCacheManager::ConsistencyCheck::Run() const {
  HW_RETURN_IF_ERROR(CheckEntryRefcounts());
  for (int r = 0; r < kv_.tp_size(); ++r) {
    BlockCensus census(kv_.ranks_[r].pool.num_total());
    HW_RETURN_IF_ERROR(CheckEntryBlocks(r, &census));
    HW_RETURN_IF_ERROR(CheckPrivateBlocks(r, &census));
    HW_RETURN_IF_ERROR(CheckBlockTotals(r, census));
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

Status KvCacheManager::ConsistencyCheck::CheckEntryBlocks(int r, BlockCensus* census) const {
  const BlockPool& pool = kv_.ranks_[r].pool;
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
      if (b >= pool.num_total() || !pool.is_allocated(b) || census->owner[b] != 0) {
        return RankViolation(r, "entry " + std::to_string(id) + " block " + std::to_string(b) +
                                    " is out of range, unallocated or held twice");
      }
      census->owner[b] = 2;
      (kv_.cache_.refcount(id) > 0 ? census->num_referenced : census->num_evictable) += 1;
      census->num_retained += kv_.cache_.refcount(id) > 0 && kv_.cache_.holders(id, r, int(s)) == 0;
    }
  }
  return Status::Ok();
}

Status KvCacheManager::ConsistencyCheck::CheckPrivateBlocks(int r, BlockCensus* census) const {
  const BlockPool& pool = kv_.ranks_[r].pool;
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
        if (b >= pool.num_total() || !pool.is_allocated(b) || census->owner[b] != 0) {
          return RankViolation(r, KeyName(key) + " block " + std::to_string(b) +
                                      " is out of range, unallocated or held twice");
        }
        census->owner[b] = 1;
        ++census->num_referenced;
      }
    }
  }
  return Status::Ok();
}

Status KvCacheManager::ConsistencyCheck::CheckBlockTotals(int r, const BlockCensus& census) const {
  const BlockPool& pool = kv_.ranks_[r].pool;
  int num_unused = 0;
  for (int b = 0; b < pool.num_total(); ++b) {
    if (census.owner[b] == 0) {
      if (pool.is_allocated(b)) return RankViolation(r, "block " + std::to_string(b) + " leaked");
      ++num_unused;
    }
  }
  const int num_referenced = census.num_referenced, num_evictable = census.num_evictable;
  if (census.num_retained != kv_.cache_.num_retained_blocks(r)) {
    return RankViolation(r, "retained " + std::to_string(census.num_retained) + " but the cache says " +
                                std::to_string(kv_.cache_.num_retained_blocks(r)));
  }
  if (num_unused != pool.num_free() || num_evictable != kv_.cache_.num_evictable_blocks(r) ||
      num_unused + num_referenced + num_evictable != pool.num_total()) {
    return RankViolation(r, "unused " + std::to_string(num_unused) + " (pool says " +
                                std::to_string(pool.num_free()) + ") + referenced " +
                                std::to_string(num_referenced) + " + evictable " +
                                std::to_string(num_evictable) + " (cache says " +
                                std::to_string(kv_.cache_.num_evictable_blocks(r)) + ") != total " +
                                std::to_string(pool.num_total()));
  }
  return Status::Ok();
}

Status KvCacheManager::CheckConsistency() const { return ConsistencyCheck(*this).Run(); }

}  // namespace headway
