// The prefix cache index of one instance (DESIGN.md "Prefix cache"), after
// vLLM's automatic prefix caching, adapted to head-wise blocks.
//
// An entry is one full, computed logical block of some sequence: the set of
// physical blocks that hold positions [i*B, (i+1)*B) on every slot of every
// TP rank (one block per slot per rank), cached under one hash. Hashes form
// a chain: hash_i = Hash(hash_{i-1}, tokens of block i), hash_{-1} =
// kRootBlockHash, so equal hashes mean equal prefixes up to a collision.
// Collisions can never return wrong KV: every entry also keeps its block's
// token ids and the id of its parent entry, and Find matches both, so a
// chain of Find calls from the root verifies the whole prefix token by
// token.
//
// Entries are reference counted by the sequences whose block tables hold
// them. An entry nobody references stays resident (its blocks keep their
// KV) and is *evictable*; the owner of the pools evicts the least recently
// released one only when it needs blocks. The cache owns no pool: it hands
// evicted blocks back to the caller.
//
// Sliding-window slots: a sequence whose window has moved past a cached
// block drops it from its row (DropBlock). Each block of an entry counts
// the rows that still hold it; when the last one drops it, the block goes
// back to the caller's pool and the entry keeps -1 for that slot (DESIGN.md
// "Recycling"), unless the block is *retained*: a row that drops a block
// of its prompt-boundary window asks to keep it (SlotBlocks::RetainedSpan),
// and from then on the entry keeps that block however many rows drop it,
// until the entry is evicted. An entry missing some blocks still serves
// prefix hits whose windows do not need them (the caller checks which,
// KvCacheManager::MatchPrefix).
//
// Every present block of an entry is, on each rank, exactly one of: held
// (by at least one row), retained (no row holds it, the entry is
// referenced: it waits for a prefix hit while some sequence still uses the
// entry), or evictable (the entry is unreferenced).
//
// Not thread-safe: owned by one instance's KvCacheManager.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace headway {

using BlockHash = uint64_t;

// The parent hash of a sequence's first block.
inline constexpr BlockHash kRootBlockHash = 0x6a09e667f3bcc908ull;

// Hash of one full block given its parent's hash and its token ids.
using BlockHasher = BlockHash (*)(BlockHash parent, std::span<const int32_t> token_ids);

// The default BlockHasher: a 64-bit chained hash built from the splitmix64
// finaliser (Steele, Lea, Flood, "Fast splittable pseudorandom number
// generators", OOPSLA 2014), which is a bijection with full avalanche, fed
// one token at a time with its index. Deterministic across processes.
BlockHash HashBlockTokens(BlockHash parent, std::span<const int32_t> token_ids);

// Id of a cache entry. Ids are never reused; 0 means "no entry" (and is the
// parent id of a first block).
using CacheEntryId = uint64_t;
inline constexpr CacheEntryId kNoCacheEntry = 0;

class PrefixCache {
 public:
  // Entries hold blocks on `tp_size` ranks. REQUIRES: tp_size >= 1,
  // hasher != nullptr.
  explicit PrefixCache(int tp_size, BlockHasher hasher = HashBlockTokens);

  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Told of every present block of an entry that becomes evictable (true:
  // its entry's refcount fell to 0) or stops being so (false: the entry is
  // acquired again, or evicted, just before EvictLru returns its blocks).
  using EvictableObserver =
      std::function<void(int tp_rank, int slot, int32_t block, bool evictable)>;
  void set_evictable_observer(EvictableObserver observer) { observer_ = std::move(observer); }

  BlockHash Hash(BlockHash parent, std::span<const int32_t> token_ids) const {
    return hasher_(parent, token_ids);
  }

  // The indexed entry whose hash is `hash`, whose parent is `parent` and
  // whose tokens equal `token_ids`; kNoCacheEntry if there is none (a miss,
  // or a collision with a different block).
  CacheEntryId Find(BlockHash hash, CacheEntryId parent,
                    std::span<const int32_t> token_ids) const;

  enum class InsertOutcome {
    kInserted,   // a new entry holds `blocks`; the caller holds one reference
    kDuplicate,  // an equal entry exists; `blocks` stay the caller's own
  };
  struct InsertResult {
    InsertOutcome outcome;
    CacheEntryId id;  // the new entry, or the equal one (not referenced by the caller)
  };

  // Caches a full, computed block whose KV lives in `blocks` ([tp_rank] ->
  // one block id per slot of that rank; -1 for a sliding slot whose block
  // was already recycled). The caller's row holds every present block. If
  // an entry with the same hash but
  // different parent or tokens is indexed (a hash collision, or a stale
  // chain), the new entry replaces it in the index; the old one stays valid
  // for whoever holds it and is evicted as usual once unreferenced.
  // REQUIRES: blocks.size() == tp_size.
  InsertResult Insert(BlockHash hash, CacheEntryId parent, std::span<const int32_t> token_ids,
                      std::vector<std::vector<int32_t>> blocks);

  // Adds a reference (an evictable entry stops being evictable); the
  // caller's row holds every present block of the entry.
  // REQUIRES: Contains(id).
  void Acquire(CacheEntryId id);

  // Drops a reference; at zero the entry becomes the most recently used
  // evictable entry. The caller must first ReleaseBlock every block its row
  // still holds. REQUIRES: Contains(id), refcount(id) > 0.
  void Release(CacheEntryId id);

  // The caller's row stops holding the block of (tp_rank, slot), which stays
  // cached (a sequence that ends). REQUIRES: Contains(id), the block is
  // present and held.
  void ReleaseBlock(CacheEntryId id, int tp_rank, int slot);

  // The caller's row stops holding the block of (tp_rank, slot) for good (its
  // sliding window moved past it). When no row holds it any more, the entry
  // forgets it (-1) and the block id is returned for the caller to free,
  // unless `retain` asks to keep it or an earlier drop did: then the entry
  // keeps it (retained). Otherwise -1. REQUIRES: Contains(id),
  // refcount(id) > 0, the block is present and held.
  int32_t DropBlock(CacheEntryId id, int tp_rank, int slot, bool retain = false);

  // Rows holding the block of (tp_rank, slot); 0 for a forgotten block.
  // REQUIRES: Contains(id).
  int holders(CacheEntryId id, int tp_rank, int slot) const;

  // Removes the least recently released evictable entry and returns its
  // present blocks ([tp_rank] -> block ids, no -1), which the caller frees.
  // REQUIRES: num_evictable_entries() > 0.
  std::vector<std::vector<int32_t>> EvictLru();

  bool Contains(CacheEntryId id) const { return entries_.count(id) > 0; }
  // REQUIRES: Contains(id) for the three below.
  int refcount(CacheEntryId id) const;
  const std::vector<std::vector<int32_t>>& blocks(CacheEntryId id) const;
  BlockHash hash(CacheEntryId id) const;

  size_t num_entries() const { return entries_.size(); }
  // Entries evicted since construction.
  uint64_t num_evicted() const { return num_evicted_; }
  size_t num_evictable_entries() const { return lru_.size(); }
  // Blocks of rank `tp_rank` held by evictable entries.
  int num_evictable_blocks(int tp_rank) const { return num_evictable_blocks_.at(tp_rank); }
  // Present blocks of rank `tp_rank` of referenced entries that no row holds
  // (class comment): neither free nor evictable.
  int num_retained_blocks(int tp_rank) const { return num_retained_blocks_.at(tp_rank); }
  // Whether the block of (tp_rank, slot) is marked to stay cached when no
  // row holds it. REQUIRES: Contains(id).
  bool retained(CacheEntryId id, int tp_rank, int slot) const;

  // Every entry id, in no particular order (for consistency checks).
  std::vector<CacheEntryId> EntryIds() const;
  // Evictable entry ids, least recently released first.
  std::vector<CacheEntryId> LruOrder() const { return {lru_.begin(), lru_.end()}; }
  // The entry EvictLru removes next. REQUIRES: num_evictable_entries() > 0.
  CacheEntryId NextEviction() const { return lru_.front(); }

 private:
  struct Entry {
    BlockHash hash = 0;
    CacheEntryId parent = kNoCacheEntry;
    std::vector<int32_t> token_ids;                 // [block_size]
    std::vector<std::vector<int32_t>> blocks;       // [tp_rank][slot]; -1 = forgotten
    std::vector<std::vector<int>> holders;          // [tp_rank][slot]: rows holding it
    std::vector<std::vector<bool>> retained;        // [tp_rank][slot]: kept when unheld
    int refcount = 0;
    bool indexed = false;                           // index_[hash] == this entry
    std::list<CacheEntryId>::iterator lru_pos;      // valid while refcount == 0
  };

  void AddEvictableBlocks(const Entry& e, int sign);
  // Adds `sign` times the entry's present, unheld blocks to the retained counts.
  void AddUnheldBlocks(const Entry& e, int sign);

  const BlockHasher hasher_;
  EvictableObserver observer_;  // may be empty
  CacheEntryId next_id_ = 1;
  std::unordered_map<CacheEntryId, Entry> entries_;
  std::unordered_map<BlockHash, CacheEntryId> index_;
  std::list<CacheEntryId> lru_;              // evictable; front = evicted first
  std::vector<int> num_evictable_blocks_;    // [tp_rank]
  std::vector<int> num_retained_blocks_;     // [tp_rank]
  uint64_t num_evicted_ = 0;
};

}  // namespace headway
