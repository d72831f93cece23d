#include "coordinator/scheduling/kv_cache_manager.h"

#include <algorithm>
#include <limits>
#include <numeric>
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
                               std::vector<int> num_chunks_per_rank, KvCacheOptions options,
                               InstanceCounters* counters)
    : block_size_(block_size),
      options_(options),
      slot_blocks_(block_size, options.enable_recycling),
      cache_(std::max<int>(1, int(num_chunks_per_rank.size())), options.block_hasher),
      counters_(counters != nullptr ? counters : &kNoCounters) {
  HW_CHECK(block_size > 0);
  HW_CHECK(tp_size >= 1 && static_cast<int>(num_chunks_per_rank.size()) == tp_size);
  HW_CHECK(ValidateTpSize(spec, tp_size).ok());
  // One class unless full and sliding slots both exist and their dtypes
  // differ; then the arena's geometry decides how many blocks a chunk holds.
  const KvCacheDtypes dtypes = options.dtypes;
  classes_ = KvBlockClasses(dtypes, spec.slot_specs);
  if (classes_.size() > 1) {
    const KvArenaLayout arena =
        MakeKvArenaLayout(block_size, spec.head_dim, dtypes, spec.slot_specs);
    for (KvCacheDtype d : classes_) blocks_per_chunk_.push_back(arena.BlocksPerChunk(d));
    shares_per_chunk_ = std::lcm(int64_t(blocks_per_chunk_[0]), int64_t(blocks_per_chunk_[1]));
  } else {
    blocks_per_chunk_ = {1};
    shares_per_chunk_ = 1;
  }
  const std::vector<SlotSpec> specs_kept = BookkeepingSpecs(spec, options.recycling_granularity);
  ranks_.reserve(tp_size);
  for (int r = 0; r < tp_size; ++r) {
    TpShard shard = ShardForRank(spec, tp_size, r);
    std::vector<SlotSpec> specs;
    std::vector<int> slot_class;
    specs.reserve(size_t(spec.num_layers) * shard.num_local_kv_heads());
    for (int layer = 0; layer < spec.num_layers; ++layer) {
      for (int h = shard.kv_head_begin; h < shard.kv_head_end; ++h) {
        size_t global = size_t(layer) * spec.num_kv_heads + h;
        specs.push_back(global < specs_kept.size() ? specs_kept[global] : SlotSpec{});
        // The class follows the slot's real spec: the worker stores the
        // slot in its dtype whatever the bookkeeping granularity.
        slot_class.push_back(KvBlockClassOf(classes_, dtypes, spec.slot_specs, global));
      }
    }
    ranks_.push_back(Rank{std::move(specs), std::move(slot_class),
                          BlockArena(num_chunks_per_rank[r], blocks_per_chunk_)});
  }
  cache_.set_evictable_observer([this](int r, int slot, int32_t block, bool evictable) {
    Rank& rank = ranks_[size_t(r)];
    rank.arena.SetEvictable(rank.slot_class[size_t(slot)], block, evictable);
  });
}

int KvCacheManager::num_slots(int tp_rank) const {
  return static_cast<int>(ranks_.at(tp_rank).slot_specs.size());
}

std::vector<int64_t> KvCacheManager::NeededByClass(int tp_rank, TableKey key,
                                                   int64_t num_positions) const {
  const Rank& rank = ranks_.at(tp_rank);
  auto it = tables_.find(key);
  const int64_t first = it == tables_.end() ? 0 : it->second.first_uncomputed;
  std::vector<int64_t> needed(classes_.size(), 0);
  for (size_t s = 0; s < rank.slot_specs.size(); ++s) {
    int64_t have = it == tables_.end() ? 0 : int64_t(it->second.rows[tp_rank][s].size());
    needed[size_t(rank.slot_class[s])] +=
        slot_blocks_.BlocksToAdd(rank.slot_specs[s], have, num_positions, first);
  }
  return needed;
}

int KvCacheManager::BlocksNeeded(int tp_rank, TableKey key, int64_t num_positions) const {
  int64_t needed = 0;
  for (int64_t n : NeededByClass(tp_rank, key, num_positions)) needed += n;
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
    int64_t num_freed = 0;
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
        if (block >= 0) {
          rank.arena.Free(rank.slot_class[s], std::span<const int32_t>(&block, 1));
          ++num_freed;
        }
        row[i] = -1;
        delta.recycled.push_back(int32_t(i));
      }
      if (delta.recycled.empty()) continue;
      delta.slot = int(s);
      delta.first_logical = int(row.size());
      deltas[r].push_back(std::move(delta));
    }
    num_recycled_blocks_ += uint64_t(num_freed);
    if (num_freed > 0) counters_->OnKvBlocksRecycled(num_freed);
  }
  return deltas;
}

void KvCacheManager::FreeSlotBlocks(int r, const std::vector<int32_t>& slot_blocks) {
  Rank& rank = ranks_[size_t(r)];
  for (size_t s = 0; s < slot_blocks.size(); ++s) {
    if (slot_blocks[s] >= 0) {
      rank.arena.Free(rank.slot_class[s], std::span<const int32_t>(&slot_blocks[s], 1));
    }
  }
}

void KvCacheManager::EnsureUnused(const std::vector<std::vector<int64_t>>& needed) {
  for (;;) {
    bool short_somewhere = false;
    for (int r = 0; r < tp_size(); ++r) {
      if (!ranks_[r].arena.CanAllocate(needed[r])) short_somewhere = true;
    }
    if (!short_somewhere) return;
    const CacheEntryId victim = cache_.NextEviction();
    // The victim's blocks by slot, read before the cache forgets them.
    const std::vector<std::vector<int32_t>> blocks = cache_.blocks(victim);
    int64_t by_kind[2] = {0, 0};  // full, sliding
    for (int r = 0; r < tp_size(); ++r) {
      for (size_t s = 0; s < blocks[r].size(); ++s) {
        if (blocks[r][s] >= 0) ++by_kind[ranks_[r].slot_specs[s].IsSliding() ? 1 : 0];
      }
    }
    counters_->OnKvBlocksEvicted(by_kind[0], by_kind[1]);
    (void)cache_.EvictLru();
    for (int r = 0; r < tp_size(); ++r) FreeSlotBlocks(r, blocks[r]);
  }
}

bool KvCacheManager::CanAppend(TableKey key, int64_t num_positions) const {
  for (int r = 0; r < tp_size(); ++r) {
    if (!ranks_[r].arena.CanAllocateEvicting(NeededByClass(r, key, num_positions))) return false;
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
  std::vector<std::vector<int64_t>> needed(ranks_.size());
  for (int r = 0; r < tp_size(); ++r) needed[r] = NeededByClass(r, key, num_positions);
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
      std::vector<int32_t> fresh = rank.arena.Allocate(rank.slot_class[s], static_cast<int>(add));
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
    const Rank& rank = ranks_[r];
    const std::vector<SlotSpec>& specs = rank.slot_specs;
    std::vector<int64_t> needed(classes_.size(), 0);
    for (size_t s = 0; s < specs.size(); ++s) {
      needed[size_t(rank.slot_class[s])] +=
          slot_blocks_.BlocksToAdd(specs[s], int64_t(match.entries.size()), num_positions, first);
    }
    std::vector<ClassBlock> taken;
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
        if (blocks[s] >= 0 && kept) taken.push_back({rank.slot_class[s], blocks[s]});
      }
    }
    if (!rank.arena.CanAllocateEvicting(needed, taken)) return false;
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
    Rank& rank = ranks_[r];
    for (size_t s = 0; s < table.rows[r].size(); ++s) {
      const std::vector<int32_t>& row = table.rows[r][s];
      std::vector<int32_t> own;
      for (size_t i = 0; i < row.size(); ++i) {
        bool cached = i < table.entries.size() && table.entries[i] != kNoCacheEntry;
        if (!cached && row[i] >= 0) own.push_back(row[i]);  // -1: already recycled
      }
      rank.arena.Free(rank.slot_class[s], own);
    }
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

int64_t KvCacheManager::FootprintShares(int tp_rank, int64_t max_positions,
                                        int64_t prompt_positions) const {
  const Rank& rank = ranks_.at(tp_rank);
  int64_t total = 0;
  for (size_t s = 0; s < rank.slot_specs.size(); ++s) {
    const int64_t blocks =
        slot_blocks_.FootprintBlocks(rank.slot_specs[s], max_positions,
                                     options_.enable_prefix_caching, max_positions - prompt_positions);
    total += blocks * (shares_per_chunk_ / blocks_per_chunk_[size_t(rank.slot_class[s])]);
  }
  return total;
}

int64_t KvCacheManager::ChunkReserveShares(int tp_rank, int max_chunk_tokens) const {
  const Rank& rank = ranks_.at(tp_rank);
  int64_t total = 0;
  for (size_t s = 0; s < rank.slot_specs.size(); ++s) {
    total += slot_blocks_.ChunkExtraBlocks(rank.slot_specs[s], max_chunk_tokens) *
             (shares_per_chunk_ / blocks_per_chunk_[size_t(rank.slot_class[s])]);
  }
  return total;
}

int64_t KvCacheManager::AdmissionShares(int tp_rank) const {
  const BlockArena& arena = ranks_.at(tp_rank).arena;
  const int slack = classes_.size() > 1 ? int(classes_.size()) : 0;
  return std::max(0, arena.num_chunks() - slack) * shares_per_chunk_;
}

int64_t KvCacheManager::MaxPositionsPerSequence(int max_chunk_tokens) const {
  HW_CHECK(max_chunk_tokens >= 1);
  constexpr int64_t kUnbounded = std::numeric_limits<int32_t>::max();
  int64_t best = kUnbounded;
  for (int r = 0; r < tp_size(); ++r) {
    if (ranks_[r].slot_specs.empty()) continue;
    const int64_t room = AdmissionShares(r) - ChunkReserveShares(r, max_chunk_tokens);
    if (FootprintShares(r, kUnbounded) <= room) continue;
    // The footprint grows with the length: the largest length that fits.
    int64_t lo = 0, hi = kUnbounded;  // fits(lo), !fits(hi)
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (FootprintShares(r, mid) <= room ? lo : hi) = mid;
    }
    best = std::min(best, lo);
  }
  return best;
}

RankBlockUsage KvCacheManager::Usage(int tp_rank) const {
  const BlockArena& arena = ranks_.at(tp_rank).arena;
  RankBlockUsage u;
  u.num_evictable = cache_.num_evictable_blocks(tp_rank);
  u.num_retained = cache_.num_retained_blocks(tp_rank);
  u.num_chunks = arena.num_chunks();
  u.num_free_chunks = arena.num_free_chunks();
  u.num_total = arena.num_free_chunks() * arena.blocks_per_chunk(0);
  for (int c = 0; c < arena.num_classes(); ++c) {
    u.lent_chunks.push_back(arena.num_lent_chunks(c));
    u.num_total += arena.num_lent_chunks(c) * arena.blocks_per_chunk(c);
    const int held = arena.num_allocated(c) - arena.num_evictable(c);
    u.num_referenced += held;
    u.used_shares += int64_t(held) * (shares_per_chunk_ / arena.blocks_per_chunk(c));
  }
  u.num_free = u.num_total - u.num_referenced;
  u.total_shares = int64_t(arena.num_chunks()) * shares_per_chunk_;
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
