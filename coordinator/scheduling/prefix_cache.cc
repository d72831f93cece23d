#include "coordinator/scheduling/prefix_cache.h"

#include <algorithm>

#include "common/status.h"

namespace headway {
namespace {

// splitmix64's finaliser: a bijection on 64 bits with full avalanche.
uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

}  // namespace

BlockHash HashBlockTokens(BlockHash parent, std::span<const int32_t> token_ids) {
  uint64_t h = Mix64(parent ^ kGolden) ^ Mix64(uint64_t(token_ids.size()) + kGolden);
  for (size_t i = 0; i < token_ids.size(); ++i) {
    // The index keeps equal tokens at different offsets from cancelling.
    uint64_t t = uint64_t(uint32_t(token_ids[i])) | (uint64_t(i) << 32);
    h = Mix64(h ^ Mix64(t + kGolden));
  }
  return h;
}

PrefixCache::PrefixCache(int tp_size, BlockHasher hasher)
    : hasher_(hasher),
      num_evictable_blocks_(std::max(tp_size, 0), 0),
      num_retained_blocks_(std::max(tp_size, 0), 0) {
  HW_CHECK(tp_size >= 1);
  HW_CHECK(hasher != nullptr);
}

CacheEntryId PrefixCache::Find(BlockHash hash, CacheEntryId parent,
                               std::span<const int32_t> token_ids) const {
  auto it = index_.find(hash);
  if (it == index_.end()) return kNoCacheEntry;
  const Entry& e = entries_.at(it->second);
  if (e.parent != parent || !std::equal(e.token_ids.begin(), e.token_ids.end(),
                                        token_ids.begin(), token_ids.end())) {
    return kNoCacheEntry;  // a collision: never someone else's KV
  }
  return it->second;
}

PrefixCache::InsertResult PrefixCache::Insert(BlockHash hash, CacheEntryId parent,
                                              std::span<const int32_t> token_ids,
                                              std::vector<std::vector<int32_t>> blocks) {
  HW_CHECK(blocks.size() == num_evictable_blocks_.size());
  CacheEntryId same = Find(hash, parent, token_ids);
  if (same != kNoCacheEntry) return {InsertOutcome::kDuplicate, same};
  auto old = index_.find(hash);
  if (old != index_.end()) entries_.at(old->second).indexed = false;
  CacheEntryId id = next_id_++;
  Entry& e = entries_[id];
  e.hash = hash;
  e.parent = parent;
  e.token_ids.assign(token_ids.begin(), token_ids.end());
  e.blocks = std::move(blocks);
  e.holders.resize(e.blocks.size());
  e.retained.resize(e.blocks.size());
  for (size_t r = 0; r < e.blocks.size(); ++r) {
    for (int32_t b : e.blocks[r]) e.holders[r].push_back(b >= 0 ? 1 : 0);
    e.retained[r].assign(e.blocks[r].size(), false);
  }
  e.refcount = 1;
  e.indexed = true;
  index_[hash] = id;
  return {InsertOutcome::kInserted, id};
}

void PrefixCache::AddEvictableBlocks(const Entry& e, int sign) {
  for (size_t r = 0; r < e.blocks.size(); ++r) {
    const int present = int(std::count_if(e.blocks[r].begin(), e.blocks[r].end(),
                                          [](int32_t b) { return b >= 0; }));
    num_evictable_blocks_[r] += sign * present;
    if (!observer_) continue;
    for (size_t s = 0; s < e.blocks[r].size(); ++s) {
      if (e.blocks[r][s] >= 0) observer_(int(r), int(s), e.blocks[r][s], sign > 0);
    }
  }
}

void PrefixCache::AddUnheldBlocks(const Entry& e, int sign) {
  for (size_t r = 0; r < e.blocks.size(); ++r) {
    for (size_t s = 0; s < e.blocks[r].size(); ++s) {
      if (e.blocks[r][s] >= 0 && e.holders[r][s] == 0) num_retained_blocks_[r] += sign;
    }
  }
}

void PrefixCache::Acquire(CacheEntryId id) {
  Entry& e = entries_.at(id);
  if (e.refcount == 0) {
    lru_.erase(e.lru_pos);
    AddEvictableBlocks(e, -1);
  } else {
    AddUnheldBlocks(e, -1);  // the new row holds them all
  }
  ++e.refcount;
  for (size_t r = 0; r < e.blocks.size(); ++r) {
    for (size_t s = 0; s < e.blocks[r].size(); ++s) {
      if (e.blocks[r][s] >= 0) ++e.holders[r][s];
    }
  }
}

void PrefixCache::ReleaseBlock(CacheEntryId id, int tp_rank, int slot) {
  Entry& e = entries_.at(id);
  HW_CHECK(e.blocks[tp_rank][slot] >= 0 && e.holders[tp_rank][slot] > 0);
  if (--e.holders[tp_rank][slot] == 0) ++num_retained_blocks_[tp_rank];  // until Release
}

int32_t PrefixCache::DropBlock(CacheEntryId id, int tp_rank, int slot, bool retain) {
  Entry& e = entries_.at(id);
  HW_CHECK(e.refcount > 0 && e.blocks[tp_rank][slot] >= 0 && e.holders[tp_rank][slot] > 0);
  if (--e.holders[tp_rank][slot] > 0) return -1;
  if (retain || e.retained[tp_rank][slot]) {
    e.retained[tp_rank][slot] = true;
    ++num_retained_blocks_[tp_rank];
    return -1;
  }
  const int32_t block = e.blocks[tp_rank][slot];
  e.blocks[tp_rank][slot] = -1;
  return block;
}

int PrefixCache::holders(CacheEntryId id, int tp_rank, int slot) const {
  return entries_.at(id).holders.at(tp_rank).at(slot);
}

void PrefixCache::Release(CacheEntryId id) {
  Entry& e = entries_.at(id);
  HW_CHECK(e.refcount > 0);
  if (--e.refcount > 0) return;
  e.lru_pos = lru_.insert(lru_.end(), id);
  AddUnheldBlocks(e, -1);  // every present block is unheld now: evictable
  AddEvictableBlocks(e, +1);
}

std::vector<std::vector<int32_t>> PrefixCache::EvictLru() {
  HW_CHECK(!lru_.empty());
  CacheEntryId id = lru_.front();
  lru_.pop_front();
  auto it = entries_.find(id);
  Entry& e = it->second;
  AddEvictableBlocks(e, -1);
  if (e.indexed) index_.erase(e.hash);
  std::vector<std::vector<int32_t>> blocks = std::move(e.blocks);
  for (std::vector<int32_t>& rank : blocks) std::erase(rank, -1);
  entries_.erase(it);
  ++num_evicted_;
  return blocks;
}

bool PrefixCache::retained(CacheEntryId id, int tp_rank, int slot) const {
  return entries_.at(id).retained.at(tp_rank).at(slot);
}

int PrefixCache::refcount(CacheEntryId id) const { return entries_.at(id).refcount; }

const std::vector<std::vector<int32_t>>& PrefixCache::blocks(CacheEntryId id) const {
  return entries_.at(id).blocks;
}

BlockHash PrefixCache::hash(CacheEntryId id) const { return entries_.at(id).hash; }

std::vector<CacheEntryId> PrefixCache::EntryIds() const {
  std::vector<CacheEntryId> ids;
  ids.reserve(entries_.size());
  for (const auto& [id, e] : entries_) ids.push_back(id);
  return ids;
}

}  // namespace headway
