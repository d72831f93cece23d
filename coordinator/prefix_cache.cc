#include "coordinator/prefix_cache.h"

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
    : hasher_(hasher), num_evictable_blocks_(std::max(tp_size, 0), 0) {
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
  e.refcount = 1;
  e.indexed = true;
  index_[hash] = id;
  return {InsertOutcome::kInserted, id};
}

void PrefixCache::AddEvictableBlocks(const Entry& e, int sign) {
  for (size_t r = 0; r < e.blocks.size(); ++r) {
    num_evictable_blocks_[r] += sign * int(e.blocks[r].size());
  }
}

void PrefixCache::Acquire(CacheEntryId id) {
  Entry& e = entries_.at(id);
  if (e.refcount == 0) {
    lru_.erase(e.lru_pos);
    AddEvictableBlocks(e, -1);
  }
  ++e.refcount;
}

void PrefixCache::Release(CacheEntryId id) {
  Entry& e = entries_.at(id);
  HW_CHECK(e.refcount > 0);
  if (--e.refcount > 0) return;
  e.lru_pos = lru_.insert(lru_.end(), id);
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
  entries_.erase(it);
  ++num_evicted_;
  return blocks;
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
