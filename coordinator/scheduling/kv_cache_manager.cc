#include "coordinator/scheduling/kv_cache_manager.h"

#include <algorithm>
#include <limits>
#include <string>

namespace headway {
namespace {

InstanceCounters kNoCounters;

}  // namespace

std::vector<SlotSpec> KvCacheManager::BookkeepingSpecs(const ModelSpec& spec,
                                                       KvCacheOptions::Granularity granularity) {
  std::vector<SlotSpec> specs = spec.slot_specs;
  if (granularity != KvCacheOptions::Granularity::kLayer) return specs;
  const size_t heads = size_t(spec.num_kv_heads);
  for (size_t first = 0; first + heads <= specs.size(); first += heads) {
    bool uniform = true;
    for (size_t h = 1; h < heads; ++h) {
      uniform = uniform && specs[first + h].window == specs[first].window &&
                specs[first + h].sink == specs[first].sink;
    }
    if (!uniform) std::fill_n(specs.begin() + first, heads, SlotSpec{});
  }
  return specs;
}

KvCacheManager::KvCacheManager(const ModelSpec& spec, int tp_size, int block_size,
                               std::vector<int> num_blocks_per_rank, KvCacheOptions options,
                               InstanceCounters* counters)
    : block_size_(block_size),
      options_(options),
      slot_blocks_(block_size, options.enable_recycling),
      cache_(std::max<int>(1, int(num_blocks_per_rank.size())), options.block_hasher),
      counters_(counters != nullptr ? counters : &kNoCounters) {
  HW_CHECK(block_size > 0);
  HW_CHECK(tp_size >= 1 && static_cast<int>(num_blocks_per_rank.size()) == tp_size);
  HW_CHECK(ValidateTpSize(spec, tp_size).ok());
  const std::vector<SlotSpec> specs_kept = BookkeepingSpecs(spec, options.recycling_granularity);
  ranks_.reserve(tp_size);
  for (int r = 0; r < tp_size; ++r) {
    TpShard shard = ShardForRank(spec, tp_size, r);
    std::vector<SlotSpec> specs;
    specs.reserve(size_t(spec.num_layers) * shard.num_local_kv_heads());
    for (int layer = 0; layer < spec.num_layers; ++layer) {
      for (int h = shard.kv_head_begin; h < shard.kv_head_end; ++h) {
        size_t global = size_t(layer) * spec.num_kv_heads + h;
        specs.push_back(global < specs_kept.size() ? specs_kept[global] : SlotSpec{});
      }
    }
    ranks_.push_back(Rank{std::move(specs), BlockPool(num_blocks_per_rank[r])});
  }
}

int KvCacheManager::num_slots(int tp_rank) const {
  return static_cast<int>(ranks_.at(tp_rank).slot_specs.size());
}

int KvCacheManager::BlocksNeeded(int tp_rank, TableKey key, int64_t num_positions) const {
  const Rank& rank = ranks_.at(tp_rank);
  auto it = tables_.find(key);
  const int64_t first = it == tables_.end() ? 0 : it->second.first_uncomputed;
  int64_t needed = 0;
  for (size_t s = 0; s < rank.slot_specs.size(); ++s) {
    int64_t have = it == tables_.end() ? 0 : int64_t(it->second.rows[tp_rank][s].size());
    needed += slot_blocks_.BlocksToAdd(rank.slot_specs[s], have, num_positions, first);
  }
  return static_cast<int>(std::min<int64_t>(needed, std::numeric_limits<int>::max()));
}

const std::vector<std::vector<int32_t>>& KvCacheManager::Rows(TableKey key,
                                                              int tp_rank) const {
  return tables_.at(key).rows.at(tp_rank);
}

void KvCacheManager::AppendRunDeltas(int slot, const std::vector<int32_t>& row,
                                     std::vector<SlotBlockDelta>* out) {
  for (size_t i = 0; i < row.size();) {
    if (row[i] < 0) {
      ++i;
      continue;
    }
    SlotBlockDelta d;
    d.slot = slot;
    d.first_logical = int(i);
    while (i < row.size() && row[i] >= 0) d.appended.push_back(row[i++]);
    out->push_back(std::move(d));
  }
}

std::vector<std::vector<SlotBlockDelta>> KvCacheManager::Recycle(TableKey key,
                                                                 int64_t first_uncomputed) {
  std::vector<std::vector<SlotBlockDelta>> deltas(ranks_.size());
  auto it = tables_.find(key);
  if (it == tables_.end()) return deltas;
  SeqTable& table = it->second;
  table.first_uncomputed = std::max(table.first_uncomputed, first_uncomputed);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Rank& rank = ranks_[r];
    std::vector<int32_t> freed;
    for (size_t s = 0; s < rank.slot_specs.size(); ++s) {
      const BlockSpan drop = slot_blocks_.Unneeded(rank.slot_specs[s], table.first_uncomputed);
      std::vector<int32_t>& row = table.rows[r][s];
      SlotBlockDelta delta;
      const BlockSpan retain =
          slot_blocks_.RetainedSpan(rank.slot_specs[s], table.prompt_positions);
      for (int64_t i = drop.begin; i < std::min(drop.end, int64_t(row.size())); ++i) {
        if (row[i] < 0) continue;  // recycled already
        const CacheEntryId e = i < int64_t(table.entries.size()) ? table.entries[i] : kNoCacheEntry;
        const int32_t block =
            e == kNoCacheEntry ? row[i] : cache_.DropBlock(e, int(r), int(s), retain.Contains(i));
        if (block >= 0) freed.push_back(block);
        row[i] = -1;
        delta.recycled.push_back(int32_t(i));
      }
      if (delta.recycled.empty()) continue;
      delta.slot = int(s);
      delta.first_logical = int(row.size());
      deltas[r].push_back(std::move(delta));
    }
    num_recycled_blocks_ += freed.size();
    if (!freed.empty()) counters_->OnKvBlocksRecycled(int64_t(freed.size()));
    rank.pool.Free(freed);
  }
  return deltas;
}

int KvCacheManager::Available(int tp_rank) const {
  return ranks_[tp_rank].pool.num_free() + cache_.num_evictable_blocks(tp_rank);
}

void KvCacheManager::EnsureUnused(const std::vector<int>& needed) {
  for (;;) {
    bool short_somewhere = false;
    for (int r = 0; r < tp_size(); ++r) {
      if (!ranks_[r].pool.CanAllocate(needed[r])) short_somewhere = true;
    }
    if (!short_somewhere) return;
    const CacheEntryId victim = cache_.NextEviction();
    int64_t by_kind[2] = {0, 0};  // full, sliding
    for (int r = 0; r < tp_size(); ++r) {
      const std::vector<int32_t>& blocks = cache_.blocks(victim)[size_t(r)];
      for (size_t s = 0; s < blocks.size(); ++s) {
        if (blocks[s] >= 0) ++by_kind[ranks_[r].slot_specs[s].IsSliding() ? 1 : 0];
      }
    }
    counters_->OnKvBlocksEvicted(by_kind[0], by_kind[1]);
    std::vector<std::vector<int32_t>> evicted = cache_.EvictLru();
    for (int r = 0; r < tp_size(); ++r) ranks_[r].pool.Free(evicted[r]);
  }
}

bool KvCacheManager::CanAppend(TableKey key, int64_t num_positions) const {
  for (int r = 0; r < tp_size(); ++r) {
    if (BlocksNeeded(r, key, num_positions) > Available(r)) return false;
  }
  return true;
}

std::vector<std::vector<SlotBlockDelta>> KvCacheManager::Append(TableKey key,
                                                                int64_t num_positions) {
  HW_CHECK(CanAppend(key, num_positions));
  SeqTable& table = tables_[key];
  if (table.rows.empty()) {
    table.rows.resize(ranks_.size());
    for (size_t r = 0; r < ranks_.size(); ++r) table.rows[r].resize(ranks_[r].slot_specs.size());
  }
  std::vector<int> needed(ranks_.size());
  for (int r = 0; r < tp_size(); ++r) needed[r] = BlocksNeeded(r, key, num_positions);
  EnsureUnused(needed);
  std::vector<std::vector<SlotBlockDelta>> deltas(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Rank& rank = ranks_[r];
    for (size_t s = 0; s < rank.slot_specs.size(); ++s) {
      std::vector<int32_t>& row = table.rows[r][s];
      const SlotSpec& spec = rank.slot_specs[s];
      const int64_t want = slot_blocks_.LogicalBlocks(num_positions);
      if (want <= int64_t(row.size())) continue;
      // Blocks a sliding slot does not need (between its sink and its
      // window) stay -1: one delta per run of new blocks.
      const int64_t have = int64_t(row.size());
      const int64_t add =
          slot_blocks_.BlocksToAdd(spec, have, num_positions, table.first_uncomputed);
      std::vector<int32_t> fresh = rank.pool.Allocate(static_cast<int>(add));
      size_t next = 0;
      const BlockSpan skip = slot_blocks_.Unneeded(spec, table.first_uncomputed);
      for (int64_t i = have; i < want; ++i) row.push_back(skip.Contains(i) ? -1 : fresh[next++]);
      std::vector<int32_t> tail(row.begin() + have, row.end());
      std::vector<SlotBlockDelta> runs;
      AppendRunDeltas(static_cast<int>(s), tail, &runs);
      for (SlotBlockDelta& d : runs) {
        d.first_logical += static_cast<int>(have);
        deltas[r].push_back(std::move(d));
      }
    }
  }
  table.num_positions = std::max(table.num_positions, num_positions);
  return deltas;
}

PrefixMatch KvCacheManager::MatchPrefix(const TokenIds& token_ids, int64_t max_positions) const {
  PrefixMatch match;
  if (!options_.enable_prefix_caching) return match;
  int64_t max_blocks = std::min(max_positions, token_ids.size()) / block_size_;
  BlockHash hash = kRootBlockHash;
  CacheEntryId parent = kNoCacheEntry;
  std::vector<int32_t> block;
  for (int64_t i = 0; i < max_blocks; ++i) {
    FillBlockTokens(token_ids, i, &block);
    hash = cache_.Hash(hash, block);
    CacheEntryId id = cache_.Find(hash, parent, block);
    if (id == kNoCacheEntry) break;
    match.entries.push_back(id);
    parent = id;
  }
  // Cut the hit until every sliding slot still holds what the window and
  // sink of its first uncomputed position need.
  auto resident = [&](int64_t k) {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      for (size_t s = 0; s < ranks_[r].slot_specs.size(); ++s) {
        if (!ranks_[r].slot_specs[s].IsSliding()) continue;  // full slots never miss one
        auto all_present = [&](int64_t from, int64_t to) {
          for (int64_t i = from; i < to; ++i) {
            if (cache_.blocks(match.entries[size_t(i)])[r][s] < 0) return false;
          }
          return true;
        };
        // The sink, then the window of position k * block_size.
        const BlockSpan skip = slot_blocks_.Unneeded(ranks_[r].slot_specs[s], k * block_size_);
        if (!all_present(0, std::min(k, skip.begin)) || !all_present(skip.end, k)) return false;
      }
    }
    return true;
  };
  while (!match.entries.empty() && !resident(int64_t(match.entries.size()))) {
    match.entries.pop_back();
  }
  match.num_positions = int64_t(match.entries.size()) * block_size_;
  return match;
}

bool KvCacheManager::CanStart(const PrefixMatch& match, int64_t num_positions,
                              int64_t first_uncomputed, int64_t prompt_positions) const {
  if (!options_.enable_prefix_caching) prompt_positions = 0;
  HW_CHECK(num_positions >= match.num_positions);
  const int64_t first = first_uncomputed < 0 ? match.num_positions : first_uncomputed;
  for (int r = 0; r < tp_size(); ++r) {
    const std::vector<SlotSpec>& specs = ranks_[r].slot_specs;
    int64_t needed = 0;
    for (const SlotSpec& spec : specs) {
      needed += slot_blocks_.BlocksToAdd(spec, int64_t(match.entries.size()), num_positions, first);
    }
    int64_t available = Available(r);
    for (size_t i = 0; i < match.entries.size(); ++i) {
      // Taking a reference makes an evictable entry's blocks unavailable,
      // but for those a sliding slot drops at once and does not retain.
      const CacheEntryId id = match.entries[i];
      if (cache_.refcount(id) != 0) continue;
      const std::vector<int32_t>& blocks = cache_.blocks(id)[r];
      for (size_t s = 0; s < blocks.size(); ++s) {
        const bool kept = !slot_blocks_.Unneeded(specs[s], first).Contains(int64_t(i)) ||
                          cache_.retained(id, r, int(s)) ||
                          slot_blocks_.RetainedSpan(specs[s], prompt_positions).Contains(int64_t(i));
        if (blocks[s] >= 0 && kept) --available;
      }
    }
    if (needed > available) return false;
  }
  return true;
}

std::vector<std::vector<SlotBlockDelta>> KvCacheManager::Start(TableKey key,
                                                               const PrefixMatch& match,
                                                               int64_t num_positions,
                                                               int64_t first_uncomputed,
                                                               int64_t prompt_positions) {
  HW_CHECK(!Contains(key));
  HW_CHECK(CanStart(match, num_positions, first_uncomputed, prompt_positions));
  SeqTable& table = tables_[key];
  table.prompt_positions = options_.enable_prefix_caching ? prompt_positions : 0;
  table.rows.resize(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) table.rows[r].resize(ranks_[r].slot_specs.size());
  for (CacheEntryId id : match.entries) {
    cache_.Acquire(id);
    const std::vector<std::vector<int32_t>>& blocks = cache_.blocks(id);
    for (size_t r = 0; r < ranks_.size(); ++r) {
      for (size_t s = 0; s < blocks[r].size(); ++s) table.rows[r][s].push_back(blocks[r][s]);
    }
    table.entries.push_back(id);
    table.chain_hash = cache_.hash(id);
    table.chain_entry = id;
  }
  table.num_positions = match.num_positions;
  // Shared blocks outside the windows are dropped at once (no delta: the
  // worker meets the rows below).
  (void)Recycle(key, first_uncomputed < 0 ? match.num_positions : first_uncomputed);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    for (size_t s = 0; s < table.rows[r].size(); ++s) {
      for (size_t i = 0; i < table.rows[r][s].size(); ++i) {
        // MatchPrefix's cut guarantees what the windows need.
        const BlockSpan unneeded =
            slot_blocks_.Unneeded(ranks_[r].slot_specs[s], table.first_uncomputed);
        HW_CHECK(table.rows[r][s][i] >= 0 || unneeded.Contains(int64_t(i)));
      }
    }
  }
  (void)Append(key, num_positions);
  // The worker meets the sequence now: it needs every row from logical 0.
  std::vector<std::vector<SlotBlockDelta>> deltas(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    for (size_t s = 0; s < table.rows[r].size(); ++s) {
      AppendRunDeltas(int(s), table.rows[r][s], &deltas[r]);
    }
  }
  return deltas;
}

void KvCacheManager::FillBlockTokens(const TokenIds& token_ids, int64_t logical,
                                     std::vector<int32_t>* out) const {
  out->resize(block_size_);
  for (int j = 0; j < block_size_; ++j) (*out)[j] = token_ids[logical * block_size_ + j];
}

void KvCacheManager::CacheComputedBlocks(TableKey key, const TokenIds& token_ids,
                                         int64_t num_computed) {
  if (!options_.enable_prefix_caching) return;
  auto it = tables_.find(key);
  if (it == tables_.end()) return;
  SeqTable& table = it->second;
  int64_t full = std::min({num_computed, token_ids.size(), table.num_positions}) / block_size_;
  std::vector<int32_t> block;
  while (!table.chain_broken && int64_t(table.entries.size()) < full) {
    const int64_t i = int64_t(table.entries.size());
    std::vector<std::vector<int32_t>> blocks(ranks_.size());
    for (size_t r = 0; r < ranks_.size(); ++r) {
      for (size_t s = 0; s < table.rows[r].size(); ++s) {
        const std::vector<int32_t>& row = table.rows[r][s];
        // A sliding slot may have recycled the block already; a full slot
        // must hold it for the entry to be a whole block set.
        const int32_t b = i < int64_t(row.size()) ? row[i] : -1;
        if (b < 0 && !ranks_[r].slot_specs[s].IsSliding()) table.chain_broken = true;
        blocks[r].push_back(b);
      }
    }
    if (table.chain_broken) break;
    FillBlockTokens(token_ids, i, &block);
    BlockHash hash = cache_.Hash(table.chain_hash, block);
    PrefixCache::InsertResult inserted =
        cache_.Insert(hash, table.chain_entry, block, std::move(blocks));
    // A duplicate's blocks stay this sequence's own; the chain goes on from
    // the equal entry so later blocks are still found by MatchPrefix.
    table.entries.push_back(inserted.outcome == PrefixCache::InsertOutcome::kInserted
                                ? inserted.id
                                : kNoCacheEntry);
    table.chain_hash = hash;
    table.chain_entry = inserted.id;
  }
}

void KvCacheManager::Release(TableKey key) {
  auto it = tables_.find(key);
  if (it == tables_.end()) return;
  SeqTable& table = it->second;
  // Tail first: the LRU order then evicts a prefix's tail before its head.
  for (size_t i = table.entries.size(); i-- > 0;) {
    const CacheEntryId e = table.entries[i];
    if (e == kNoCacheEntry) continue;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      for (size_t s = 0; s < table.rows[r].size(); ++s) {
        if (table.rows[r][s][i] >= 0) cache_.ReleaseBlock(e, int(r), int(s));
      }
    }
    cache_.Release(e);
  }
  for (size_t r = 0; r < ranks_.size(); ++r) {
    std::vector<int32_t> own;
    for (const std::vector<int32_t>& row : table.rows[r]) {
      for (size_t i = 0; i < row.size(); ++i) {
        bool cached = i < table.entries.size() && table.entries[i] != kNoCacheEntry;
        if (!cached && row[i] >= 0) own.push_back(row[i]);  // -1: already recycled
      }
    }
    ranks_[r].pool.Free(own);
  }
  tables_.erase(it);
}

int64_t KvCacheManager::NumCoveredPositions(TableKey key) const {
  auto it = tables_.find(key);
  return it == tables_.end() ? 0 : it->second.num_positions;
}

int64_t KvCacheManager::FootprintBlocks(int tp_rank, int64_t max_positions,
                                        int64_t prompt_positions) const {
  int64_t total = 0;
  for (const SlotSpec& spec : ranks_.at(tp_rank).slot_specs) {
    total += slot_blocks_.FootprintBlocks(spec, max_positions, options_.enable_prefix_caching,
                                          max_positions - prompt_positions);
  }
  return total;
}

int64_t KvCacheManager::ChunkReserveBlocks(int tp_rank, int max_chunk_tokens) const {
  int64_t total = 0;
  for (const SlotSpec& spec : ranks_.at(tp_rank).slot_specs) {
    total += slot_blocks_.ChunkExtraBlocks(spec, max_chunk_tokens);
  }
  return total;
}

int64_t KvCacheManager::MaxPositionsPerSequence(int max_chunk_tokens) const {
  HW_CHECK(max_chunk_tokens >= 1);
  constexpr int64_t kUnbounded = std::numeric_limits<int32_t>::max();
  int64_t best = kUnbounded;
  for (int r = 0; r < tp_size(); ++r) {
    if (ranks_[r].slot_specs.empty()) continue;
    const int64_t room = ranks_[r].pool.num_total() - ChunkReserveBlocks(r, max_chunk_tokens);
    if (FootprintBlocks(r, kUnbounded) <= room) continue;
    // The footprint grows with the length: the largest length that fits.
    int64_t lo = 0, hi = kUnbounded;  // fits(lo), !fits(hi)
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (FootprintBlocks(r, mid) <= room ? lo : hi) = mid;
    }
    best = std::min(best, lo);
  }
  return best;
}

RankBlockUsage KvCacheManager::Usage(int tp_rank) const {
  const BlockPool& pool = ranks_.at(tp_rank).pool;
  RankBlockUsage u;
  u.num_evictable = cache_.num_evictable_blocks(tp_rank);
  u.num_retained = cache_.num_retained_blocks(tp_rank);
  u.num_free = pool.num_free() + u.num_evictable;
  u.num_total = pool.num_total();
  u.num_referenced = u.num_total - u.num_free;
  return u;
}

const std::vector<int32_t>& KvCacheManager::TEST_Row(TableKey key, int tp_rank,
                                                     int slot) const {
  return tables_.at(key).rows.at(tp_rank).at(slot);
}

std::string KvCacheManager::KeyName(TableKey key) {
  switch (key.kind) {
    case TableKey::Kind::kSequence: return "seq " + std::to_string(key.id);
    case TableKey::Kind::kPin: return "pin " + std::to_string(key.id);
    case TableKey::Kind::kReservation: return "reservation " + std::to_string(key.id);
  }
  return "table " + std::to_string(key.id);
}

size_t KvCacheManager::num_sequences() const {
  return size_t(std::count_if(tables_.begin(), tables_.end(), [](const auto& entry) {
    return entry.first.kind == TableKey::Kind::kSequence;
  }));
}

PinId KvCacheManager::Pin(const PrefixMatch& match) {
  const PinId pin{next_pin_id_++};
  (void)Start(Key(pin), match, match.num_positions, -1, match.num_positions);
  return pin;
}

ReservationId KvCacheManager::Reserve(const PrefixMatch& have, int64_t num_positions) {
  const ReservationId reservation{next_reservation_id_++};
  (void)Start(Key(reservation), have, num_positions, num_positions, num_positions);
  return reservation;
}

void KvCacheManager::CommitReceived(ReservationId reservation, const TokenIds& token_ids,
                                    int64_t num_positions) {
  CacheComputedBlocks(Key(reservation), token_ids, num_positions);
  Release(Key(reservation));
}

}  // namespace headway
