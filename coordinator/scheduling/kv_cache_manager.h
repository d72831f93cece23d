// The head-wise block table of one instance, and its per-rank block pools.
//
// table[seq][tp_rank][slot] -> block ids, where a rank's slots are its
// (layer, local KV head) pairs, slot = layer * num_local_kv_heads + local
// head (ShardForRank). Logical block i of a slot covers positions
// [i * block_size, (i + 1) * block_size). Every rank has its own pool, so a
// KV head replicated on several ranks (num_kv_heads < tp_size) takes blocks
// on every replica rank.
//
// Check, then commit: CanAppend answers whether Append would succeed (and
// CanStart whether Start would); Append either allocates everything a
// sequence needs on every rank or (when the precondition is broken) aborts,
// so a sequence is never half-allocated.
//
// Prefix cache (prefix_cache.h): a sequence's full, computed logical blocks
// are cached (CacheComputedBlocks) and shared by later sequences whose
// tokens start the same way (MatchPrefix, Start). On Release a sequence's
// cached blocks lose a reference and, once unreferenced, stay resident as
// *evictable*; its other blocks (the partial last one, full ones not yet
// computed, duplicates of an entry cached first by another sequence) go back
// to the pool. Allocation takes free blocks first and evicts the least
// recently released entries only when a rank runs short. On every rank, at
// every point: unused + referenced + evictable = total (CheckConsistency).
//
// Sliding-window slots (DESIGN.md "Recycling"; the arithmetic is
// slot_blocks.h's): a sequence's table knows its first uncomputed position p
// (Recycle, Start). A sliding slot (window
// W, sink S) needs only its sink blocks, logical [0, ceil(S / B)), and the
// blocks from floor(max(0, p - W + 1) / B) on: earlier blocks are wholly
// outside the window of every position still to be computed. Recycle
// returns them to the pool and their entries become -1; Append and Start
// never allocate them. A cached block goes back to the pool once no row
// holds it any more (PrefixCache::DropBlock), except the prompt-boundary
// window (SlotBlocks::RetainedSpan of the table's prompt length, given to
// Start, Pin and Reserve): those blocks stay in the cache, retained while
// some sequence references their entry and evictable after, so a later
// request with the same prompt finds its window. A prefix hit of L
// positions is cut to the longest L whose sliding slots still have their
// sink blocks and their blocks from floor(max(0, L - W + 1) / B) on.
//
// Footprints (FootprintShares, ChunkReserveShares) are what admission
// reserves: the most KV memory a request can hold at once, by slot kind.
//
// Block sizes (common/kv_arena.h): a slot's blocks are of its KV cache
// dtype's class (full-attention slots cache.kv_cache_dtype, sliding ones
// cache.kv_cache_dtype_sliding). Each rank's pool is a BlockArena of equal
// chunks lent to one class at a time, so memory that one class frees
// serves the other. Admission counts *shares*: a chunk is
// shares_per_chunk() shares, a block of class c costs shares_per_chunk() /
// blocks_per_chunk(c) of them (proportional to its bytes); with one class a
// share is a block.
//
// Not thread-safe: owned by one instance's scheduler on the engine thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/kv_arena.h"
#include "common/kv_layout.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "coordinator/scheduling/block_arena.h"
#include "coordinator/scheduling/instance_counters.h"
#include "coordinator/scheduling/prefix_cache.h"
#include "coordinator/scheduling/slot_blocks.h"

namespace headway {

// Blocks appended to and recycled from one slot's row (proto::SlotDelta
// without the wire). Applied in order: entries between the row's end and
// first_logical become -1, appended extend the row, recycled entries become
// -1.
struct SlotBlockDelta {
  int slot = 0;
  int first_logical = 0;          // logical index of appended[0]
  std::vector<int32_t> appended;  // ids for logical blocks first_logical, ...
  std::vector<int32_t> recycled;  // logical indices whose block went back to the pool
};

// Per-rank block usage, for /health, /metrics and tests. Block counts sum
// every class; num_total counts a lent chunk as its class's blocks and a
// free chunk as blocks of the first class (full-attention slots'), so with
// one class they are plain block counts.
struct RankBlockUsage {
  int num_free = 0;        // blocks an allocation can take: unused + evictable
  int num_total = 0;
  int num_evictable = 0;   // cached, referenced by no sequence (part of num_free)
  int num_referenced = 0;  // not free (= total - free): held by rows, or retained
  int num_retained = 0;    // of those, cached blocks no row holds whose entry is
                           // referenced (PrefixCache), e.g. a prompt's window
  // The arena: its chunks, the free ones, and per class (in
  // KvCacheManager::block_classes() order) those lent to it.
  int num_chunks = 0;
  int num_free_chunks = 0;
  std::vector<int> lent_chunks;
  // Shares held: by rows or retained (evictable blocks count as free).
  int64_t used_shares = 0;
  int64_t total_shares = 0;
};

struct KvCacheOptions {
  // Cache full, computed blocks and share them between sequences (config
  // key cache.enable_prefix_caching). Off: every block is a sequence's own
  // and goes back to the pool on Release.
  bool enable_prefix_caching = true;
  // Return sliding slots' blocks outside every window and sink to the pool
  // (config key cache.enable_recycling). Off: sliding slots keep every block
  // like full ones (the kernels still attend only within the window).
  bool enable_recycling = true;
  // Which slots recycle (config key cache.recycling_granularity):
  // kKvHead, every sliding slot by its own spec (Headway's head-wise
  // layout); kLayer, only the slots of layers whose KV heads all share one
  // sliding spec, the others kept whole like full slots, which is what an
  // allocator with one block table per layer can do (vLLM's hybrid KV cache
  // manager, SGLang's SWA pool). kLayer exists as the baseline of
  // bench/recycling_bench.py.
  enum class Granularity { kKvHead, kLayer };
  Granularity recycling_granularity = Granularity::kKvHead;
  // The hash of the chain; tests force collisions through it.
  BlockHasher block_hasher = HashBlockTokens;
  // KV cache dtypes of full and sliding slots (cache.kv_cache_dtype,
  // cache.kv_cache_dtype_sliding): when they differ and the model has both
  // kinds of slot, blocks come in two classes (common/kv_arena.h).
  KvCacheDtypes dtypes;
};

// A sequence's token ids, prompt then output, viewed without copying.
struct TokenIds {
  std::span<const int32_t> prompt;
  std::span<const int32_t> output;
  int64_t size() const { return int64_t(prompt.size() + output.size()); }
  // REQUIRES: 0 <= pos < size().
  int32_t operator[](int64_t pos) const {
    return pos < int64_t(prompt.size()) ? prompt[pos] : output[pos - prompt.size()];
  }
};

// The cached prefix a starting sequence can share (MatchPrefix).
struct PrefixMatch {
  int64_t num_positions = 0;          // = entries.size() * block_size
  std::vector<CacheEntryId> entries;  // logical blocks 0, 1, ...
};

// Blocks that KV transfer holds outside any sequence (KvCacheManager::Pin,
// Reserve). Ids are the manager's own: a new manager (an instance that
// restarted) starts them again, so callers check the instance's generation
// before they use an old one.
struct PinId {
  uint64_t value = 0;
  bool operator==(const PinId&) const = default;
};
struct ReservationId {
  uint64_t value = 0;
  bool operator==(const ReservationId&) const = default;
};

class KvCacheManager {
 public:
  // `num_chunks_per_rank[r]` is rank r's arena size in chunks (from its
  // RegisterRequest; with one block class a chunk is a block).
  // REQUIRES: ValidateTpSize(spec, tp_size).ok(), block_size > 0,
  // num_chunks_per_rank.size() == tp_size, and with two classes
  // spec.head_dim valid for both dtypes. `counters` (optional) counts
  // recycled blocks and must outlive the manager.
  KvCacheManager(const ModelSpec& spec, int tp_size, int block_size,
                 std::vector<int> num_chunks_per_rank, KvCacheOptions options = {},
                 InstanceCounters* counters = nullptr);

  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  int tp_size() const { return static_cast<int>(ranks_.size()); }
  int block_size() const { return block_size_; }
  int num_slots(int tp_rank) const;
  // The block classes' dtypes (one, or full then sliding), and the class of
  // a rank's slot.
  const std::vector<KvCacheDtype>& block_classes() const { return classes_; }
  int slot_class(int tp_rank, int slot) const { return ranks_.at(tp_rank).slot_class.at(slot); }
  // Blocks of class `cls` one chunk holds; shares one chunk counts.
  int blocks_per_chunk(int cls) const { return blocks_per_chunk_.at(cls); }
  int64_t shares_per_chunk() const { return shares_per_chunk_; }
  bool prefix_caching_enabled() const { return options_.enable_prefix_caching; }

  // Blocks rank `tp_rank` must allocate so that `seq_id` (known or not)
  // covers positions [0, num_positions) (sliding slots: what its window and
  // sink need). 0 if it already does.
  int BlocksNeeded(int tp_rank, uint64_t seq_id, int64_t num_positions) const {
    return BlocksNeeded(tp_rank, Key(seq_id), num_positions);
  }

  // True if Append(seq_id, num_positions) would find enough free or
  // evictable blocks on every rank.
  bool CanAppend(uint64_t seq_id, int64_t num_positions) const {
    return CanAppend(Key(seq_id), num_positions);
  }

  // Grows `seq_id` (creating its table, with no prefix hit, on first use;
  // Start shares cached blocks) so every slot covers
  // positions [0, num_positions). Returns, per rank, the deltas of the slots
  // that received blocks (empty when nothing was needed).
  // REQUIRES: CanAppend(seq_id, num_positions).
  std::vector<std::vector<SlotBlockDelta>> Append(uint64_t seq_id, int64_t num_positions) {
    return Append(Key(seq_id), num_positions);
  }

  // The longest prefix of `token_ids` the cache holds, in whole blocks and
  // at most `max_positions` positions (callers pass num_tokens - 1 so at
  // least one token is computed and yields logits). Nothing is referenced:
  // pass the match to CanStart / Start before the cache changes again.
  // Empty when prefix caching is off.
  PrefixMatch MatchPrefix(const TokenIds& token_ids, int64_t max_positions) const;

  // True if Start(seq_id, match, num_positions, first_uncomputed,
  // prompt_positions) would find its blocks: the match's evictable entries
  // are taken out of what can be evicted, but for the blocks Start drops at
  // once and does not retain. REQUIRES: match came from MatchPrefix with no
  // change to the cache since, num_positions >= match.num_positions.
  bool CanStart(const PrefixMatch& match, int64_t num_positions,
                int64_t first_uncomputed = -1, int64_t prompt_positions = 0) const;

  // Creates `seq_id`'s table: logical blocks [0, match.entries.size()) are
  // the match's shared blocks (referenced now), the rest are new blocks up
  // to num_positions. `first_uncomputed` (-1 = match.num_positions) is the
  // sequence's first position still to be computed: sliding slots take no
  // block outside its window and sink. The deltas carry every block from
  // logical 0, shared ones included, one delta per run of blocks (the
  // worker meets the sequence with is_new and start_pos =
  // match.num_positions). `prompt_positions` (0 = none) is the sequence's
  // prompt length: its sliding slots' blocks in SlotBlocks::RetainedSpan of
  // it stay cached when the sequence moves past them. REQUIRES:
  // !Contains(seq_id), CanStart(match, num_positions, first_uncomputed).
  std::vector<std::vector<SlotBlockDelta>> Start(uint64_t seq_id, const PrefixMatch& match,
                                                 int64_t num_positions,
                                                 int64_t first_uncomputed = -1,
                                                 int64_t prompt_positions = 0) {
    return Start(Key(seq_id), match, num_positions, first_uncomputed, prompt_positions);
  }

  // Positions before `first_uncomputed` are computed: returns to the pool
  // every sliding-slot block of `seq_id` that lies wholly outside the
  // window and sink of every position from first_uncomputed on (a cached
  // block once no other row holds it), sets its entry to -1 and returns the
  // deltas (recycled indices only, first_logical = the row's end) per rank.
  // No-op for an unknown id or when nothing is recyclable.
  std::vector<std::vector<SlotBlockDelta>> Recycle(uint64_t seq_id, int64_t first_uncomputed) {
    return Recycle(Key(seq_id), first_uncomputed);
  }

  // Blocks Recycle has returned to the pools since construction (all ranks).
  uint64_t num_recycled_blocks() const { return num_recycled_blocks_; }

  // Rank `tp_rank`'s rows of `seq_id` ([slot][logical], -1 = no block).
  // REQUIRES: Contains(seq_id).
  const std::vector<std::vector<int32_t>>& Rows(uint64_t seq_id, int tp_rank) const {
    return Rows(Key(seq_id), tp_rank);
  }

  // Caches `seq_id`'s full blocks inside [0, num_computed) that are not
  // cached yet (called once a step's KV is written). `token_ids` must cover
  // [0, num_computed). No-op when prefix caching is off or for an unknown id.
  void CacheComputedBlocks(uint64_t seq_id, const TokenIds& token_ids, int64_t num_computed) {
    CacheComputedBlocks(Key(seq_id), token_ids, num_computed);
  }

  // Forgets the sequence: its cached blocks lose a reference (tail first,
  // so a prefix outlives its tail in the LRU order), every other block
  // returns to its pool. No-op for an unknown id.
  void Release(uint64_t seq_id) { Release(Key(seq_id)); }

  bool Contains(uint64_t seq_id) const { return Contains(Key(seq_id)); }
  // Positions [0, n) the sequence's blocks cover; 0 for an unknown id.
  int64_t NumCoveredPositions(uint64_t seq_id) const { return NumCoveredPositions(Key(seq_id)); }
  size_t num_sequences() const;


  // ---- KV transfer: blocks held for a transfer, outside any sequence ----
  //
  // The sending side pins the cached blocks of a prefix (Pin) so that no
  // eviction reuses them while they are read; the receiving side reserves
  // the blocks its prefix cache lacks (Reserve), and once they are written
  // caches them (CommitReceived) or, after a failed transfer, gives them
  // back (CancelReservation). Pins and reservations count in Usage and
  // CheckConsistency like sequences.

  // True if Pin(match) would find its blocks: nothing new is allocated, but
  // evictable entries of the match must stay. REQUIRES: as CanStart's.
  bool CanPin(const PrefixMatch& match) const {
    return CanStart(match, match.num_positions, -1, match.num_positions);
  }
  // References every block of `match` (and drops sliding slots' blocks
  // outside the window of position match.num_positions, which no receiver
  // needs). REQUIRES: CanPin(match), with no change to the cache since
  // MatchPrefix.
  PinId Pin(const PrefixMatch& match);
  // Rank `tp_rank`'s rows of a pin ([slot][logical], -1 = no block).
  // REQUIRES: the pin is held.
  const std::vector<std::vector<int32_t>>& Rows(PinId pin, int tp_rank) const {
    return Rows(Key(pin), tp_rank);
  }
  // Lets the pinned blocks go (cached ones stay cached, evictable once
  // unreferenced). No-op for an unknown pin.
  void Unpin(PinId pin) { Release(Key(pin)); }

  // True if Reserve(have, num_positions) would find its blocks.
  // REQUIRES: as CanStart's.
  bool CanReserve(const PrefixMatch& have, int64_t num_positions) const {
    return CanStart(have, num_positions, num_positions, num_positions);
  }
  // Blocks to receive positions [have.num_positions, num_positions) into:
  // logical blocks [0, have.entries.size()) are the cached ones the
  // receiver already holds (referenced, so they stay), the rest are new;
  // sliding slots take only the sink and the window of position
  // num_positions (the first the receiver will compute).
  // REQUIRES: CanReserve(have, num_positions).
  ReservationId Reserve(const PrefixMatch& have, int64_t num_positions);
  bool Contains(ReservationId reservation) const { return Contains(Key(reservation)); }
  // Rank `tp_rank`'s rows of a reservation ([slot][logical], -1 = no block).
  // REQUIRES: Contains(reservation).
  const std::vector<std::vector<int32_t>>& Rows(ReservationId reservation, int tp_rank) const {
    return Rows(Key(reservation), tp_rank);
  }
  // The reserved blocks now hold the KV of `token_ids`' positions [0,
  // num_positions): caches them (prefix caching) and ends the reservation,
  // so a sequence with that prefix finds them (MatchPrefix). No-op for an
  // unknown reservation.
  void CommitReceived(ReservationId reservation, const TokenIds& token_ids,
                      int64_t num_positions);
  // Ends a reservation whose blocks were not (or not wholly) written: they
  // go back to the pool, none is cached. No-op for an unknown reservation.
  void CancelReservation(ReservationId reservation) { Release(Key(reservation)); }

  // The model's slot specs as the allocator keeps blocks for them
  // ([num_layers * num_kv_heads]): under Granularity::kLayer, the slots of a
  // layer whose KV heads differ in spec count as full.
  static std::vector<SlotSpec> BookkeepingSpecs(const ModelSpec& spec,
                                                KvCacheOptions::Granularity granularity);

  // A request's footprint on rank `tp_rank`: the most blocks it holds at
  // once as it grows to `max_positions` (prompt + max_tokens), summed over
  // the rank's slots (SlotBlocks::FootprintBlocks: every block of a full
  // slot; a recycling sliding slot's sink, the window of a one-token step
  // and, with prefix caching, the part of its retained prompt window that
  // can fall behind, given a prompt of `prompt_positions`; 0 = unknown, the
  // most).
  int64_t FootprintBlocks(int tp_rank, int64_t max_positions, int64_t prompt_positions = 0) const;
  // What rank `tp_rank` keeps on top of the footprints so that prefill
  // chunks of up to `max_chunk_tokens` proceed: the blocks one such chunk
  // spans in the recycling sliding slots beyond a one-token step
  // (SlotBlocks::ChunkExtraBlocks). REQUIRES: max_chunk_tokens >= 1.
  int64_t ChunkReserveBlocks(int tp_rank, int max_chunk_tokens) const;
  // The two above in shares (class comment): each slot's blocks at its
  // class's price.
  int64_t FootprintShares(int tp_rank, int64_t max_positions, int64_t prompt_positions = 0) const;
  int64_t ChunkReserveShares(int tp_rank, int max_chunk_tokens) const;
  // Shares admission may reserve on rank `tp_rank`: the arena's, less one
  // chunk per class when there are two (a class's last chunk may be partly
  // used while the other class waits for a whole one).
  int64_t AdmissionShares(int tp_rank) const;

  // The most positions one sequence could ever hold with the pools empty of
  // everything else (min over ranks), when it is computed in chunks of at
  // most `max_chunk_tokens` positions (scheduler.max_num_batched_tokens):
  // the largest L whose FootprintBlocks + ChunkReserveBlocks fit every
  // rank's pool. Admission rejects longer requests so a sequence can never
  // wait forever for blocks that do not exist. With recycling the bound
  // grows with the share of sliding slots; unbounded (INT32_MAX) when every
  // slot recycles and the footprint fits. REQUIRES: max_chunk_tokens >= 1.
  int64_t MaxPositionsPerSequence(int max_chunk_tokens) const;

  RankBlockUsage Usage(int tp_rank) const;

  // Walks every table, entry and arena (O(blocks)): OK if on every rank each
  // block is exactly one of unused, held by sequences (a private block by
  // one, a cached block by its entry's refcount many), or evictable, and the
  // three add up to the total; every block a slot holds is of the slot's
  // class and lies in a chunk lent to that class; every lent chunk's blocks
  // are allocated or free, free + lent chunks = total, and the arena's
  // evictable marks are the cache's evictable blocks. Internal naming the
  // first violation.
  Status CheckConsistency() const;

  const PrefixCache& prefix_cache() const { return cache_; }

  // The row of one slot (block ids by logical index). REQUIRES: known seq.
  const std::vector<int32_t>& TEST_Row(uint64_t seq_id, int tp_rank, int slot) const {
    return TEST_Row(Key(seq_id), tp_rank, slot);
  }

 private:
  // Whose table: a sequence's, a pin's or a reservation's. Each kind has
  // its own id space.
  struct TableKey {
    enum class Kind : uint8_t { kSequence, kPin, kReservation };
    Kind kind = Kind::kSequence;
    uint64_t id = 0;
    bool operator==(const TableKey&) const = default;
  };
  struct TableKeyHash {
    size_t operator()(const TableKey& k) const {
      return std::hash<uint64_t>()(k.id * 3 + uint64_t(k.kind));
    }
  };
  static TableKey Key(uint64_t seq_id) { return {TableKey::Kind::kSequence, seq_id}; }
  static TableKey Key(PinId pin) { return {TableKey::Kind::kPin, pin.value}; }
  static TableKey Key(ReservationId r) { return {TableKey::Kind::kReservation, r.value}; }
  static std::string KeyName(TableKey key);  // "seq 3", "pin 1", "reservation 2"

  // The table operations behind the public ones (class comment).
  int BlocksNeeded(int tp_rank, TableKey key, int64_t num_positions) const;
  bool CanAppend(TableKey key, int64_t num_positions) const;
  std::vector<std::vector<SlotBlockDelta>> Append(TableKey key, int64_t num_positions);
  std::vector<std::vector<SlotBlockDelta>> Start(TableKey key, const PrefixMatch& match,
                                                 int64_t num_positions, int64_t first_uncomputed,
                                                 int64_t prompt_positions);
  std::vector<std::vector<SlotBlockDelta>> Recycle(TableKey key, int64_t first_uncomputed);
  const std::vector<std::vector<int32_t>>& Rows(TableKey key, int tp_rank) const;
  void CacheComputedBlocks(TableKey key, const TokenIds& token_ids, int64_t num_computed);
  void Release(TableKey key);
  bool Contains(TableKey key) const { return tables_.count(key) > 0; }
  int64_t NumCoveredPositions(TableKey key) const;
  const std::vector<int32_t>& TEST_Row(TableKey key, int tp_rank, int slot) const;

  struct Rank {
    std::vector<SlotSpec> slot_specs;  // [num_slots], as kept (BookkeepingSpecs)
    std::vector<int> slot_class;       // [num_slots] block class
    BlockArena arena;
  };
  struct SeqTable {
    int64_t num_positions = 0;
    int64_t first_uncomputed = 0;  // sliding slots need nothing wholly before its window
    int64_t prompt_positions = 0;  // sliding slots retain this prompt's boundary window
    std::vector<std::vector<std::vector<int32_t>>> rows;  // [rank][slot][logical]
    // [logical] the entry this sequence references for the block, or
    // kNoCacheEntry for a block of its own. Covers the hashed blocks.
    std::vector<CacheEntryId> entries;
    // The hash chain after the last hashed block: its hash, and the entry
    // holding equal tokens (the parent of the next block's entry).
    BlockHash chain_hash = kRootBlockHash;
    CacheEntryId chain_entry = kNoCacheEntry;
    bool chain_broken = false;  // a block without blocks on every slot
  };

  // Splits a row into deltas, one per run of blocks (-1 between runs).
  static void AppendRunDeltas(int slot, const std::vector<int32_t>& row,
                              std::vector<SlotBlockDelta>* out);
  // Blocks of each class rank `tp_rank` must allocate for `key` to cover
  // [0, num_positions).
  std::vector<int64_t> NeededByClass(int tp_rank, TableKey key, int64_t num_positions) const;
  // Evicts LRU entries until every rank r can allocate `needed[r]` (per
  // class) without evicting. REQUIRES: CanAllocateEvicting(needed[r]) on
  // every rank.
  void EnsureUnused(const std::vector<std::vector<int64_t>>& needed);
  // Frees `blocks` ([slot] -> id, -1 = none) of rank `r` to its arena.
  void FreeSlotBlocks(int r, const std::vector<int32_t>& slot_blocks);
  void FillBlockTokens(const TokenIds& token_ids, int64_t logical, std::vector<int32_t>* out) const;

  // CheckConsistency's walk (kv_cache_consistency.cc).
  class ConsistencyCheck;

  int block_size_;
  KvCacheOptions options_;
  std::vector<KvCacheDtype> classes_;
  std::vector<int> blocks_per_chunk_;  // [class]
  int64_t shares_per_chunk_ = 1;
  SlotBlocks slot_blocks_;  // which logical blocks each slot needs
  std::vector<Rank> ranks_;
  PrefixCache cache_;
  std::unordered_map<TableKey, SeqTable, TableKeyHash> tables_;
  uint64_t next_pin_id_ = 1;
  uint64_t next_reservation_id_ = 1;
  uint64_t num_recycled_blocks_ = 0;
  InstanceCounters* counters_;  // never null (a no-op default)
};

}  // namespace headway
