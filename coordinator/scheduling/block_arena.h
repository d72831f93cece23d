// One TP rank's KV arena as the coordinator sees it: equal chunks, each
// free or lent to one block class and carved into that class's blocks.
//
// The worker owns the memory; the coordinator owns the ids
// (common/kv_arena.h lays them out). A class is a block byte size (a KV
// cache dtype); class c's chunk k holds c's block ids [k * n_c, (k + 1) *
// n_c), n_c = blocks_per_chunk(c). A class borrows a free chunk when none
// of its chunks has a free block, and a chunk goes back to the arena as
// soon as all its blocks are free, so an under-used class holds at most
// its partly used chunks. Allocation takes the blocks of the class's
// fullest chunk with room first, so that emptier chunks drain and return.
// With one class of one block per chunk this is a free list of block ids,
// handed out lowest first, then most recently freed first.
//
// Prefix-cache eviction: blocks that an eviction would free are marked
// *evictable* (SetEvictable). CanAllocateEvicting answers whether evicting
// every one of them would let an allocation proceed (what the coordinator
// checks before it evicts), CanAllocate whether it proceeds now.
//
// Not thread-safe: owned by one KvCacheManager.
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <utility>
#include <vector>

namespace headway {

// A block of class `cls` with id `id`.
struct ClassBlock {
  int cls = 0;
  int32_t id = 0;
};

class BlockArena {
 public:
  // `num_chunks` free chunks; class c carves a chunk into
  // blocks_per_chunk[c] blocks. REQUIRES: num_chunks >= 0, at least one
  // class, every blocks_per_chunk >= 1, num_chunks * blocks_per_chunk fits
  // int32.
  BlockArena(int num_chunks, std::vector<int> blocks_per_chunk);

  BlockArena(const BlockArena&) = delete;
  BlockArena& operator=(const BlockArena&) = delete;
  BlockArena(BlockArena&&) = default;
  BlockArena& operator=(BlockArena&&) = default;

  int num_classes() const { return int(per_chunk_.size()); }
  int blocks_per_chunk(int cls) const { return per_chunk_[size_t(cls)]; }
  int num_chunks() const { return int(owner_.size()); }
  int num_free_chunks() const { return int(free_chunks_.size()); }
  int num_lent_chunks(int cls) const { return lent_[size_t(cls)]; }
  // Block ids class `cls` can ever use: [0, num_chunks * blocks_per_chunk).
  int32_t num_block_ids(int cls) const { return num_chunks() * blocks_per_chunk(cls); }
  // The class chunk `chunk` is lent to; -1 while it is free.
  int chunk_owner(int chunk) const { return owner_[size_t(chunk)]; }
  int ChunkOf(int cls, int32_t id) const { return id / blocks_per_chunk(cls); }

  // Blocks of `cls` allocated (evictable ones included) / free in its lent chunks.
  int num_allocated(int cls) const { return allocated_count_[size_t(cls)]; }
  int num_free_lent(int cls) const { return free_lent_[size_t(cls)]; }
  int num_evictable(int cls) const { return evictable_count_[size_t(cls)]; }

  // True if Allocate(c, needed[c]) for every class c, in any order, would
  // succeed now. needed.size() == num_classes(); entries <= 0 need nothing.
  bool CanAllocate(std::span<const int64_t> needed) const;

  // True if it would once every evictable block is freed, with the blocks
  // in `also_held` (evictable now) taken out of what can be freed.
  bool CanAllocateEvicting(std::span<const int64_t> needed,
                           std::span<const ClassBlock> also_held = {}) const;

  // Takes `n` free blocks of `cls`, borrowing free chunks (lowest first the
  // first time round) as needed. REQUIRES: CanAllocate of n for cls.
  std::vector<int32_t> Allocate(int cls, int n);

  // Returns blocks (evictable or not); a chunk whose blocks are all free
  // goes back to the arena. REQUIRES: each id is allocated in `cls` (a
  // double free or foreign id is a bug: HW_CHECK).
  void Free(int cls, std::span<const int32_t> ids);

  // Marks an allocated block as one an eviction would free, or not.
  // REQUIRES: allocated, and the mark changes.
  void SetEvictable(int cls, int32_t id, bool evictable);

  bool is_allocated(int cls, int32_t id) const { return allocated_[size_t(cls)][size_t(id)]; }
  bool is_evictable(int cls, int32_t id) const { return evictable_[size_t(cls)][size_t(id)]; }

 private:
  // What chunk k adds to the "after evicting everything" sums: its held
  // (allocated, not evictable) blocks decide whether it would return.
  void AddEvictingTotals(int chunk, int sign);
  // Chunks to borrow so that class c gets needed[c] given `have[c]` free.
  int64_t ChunksToBorrow(std::span<const int64_t> needed,
                         std::span<const int64_t> have) const;
  void Borrow(int cls);
  void Return(int chunk);

  std::vector<int> per_chunk_;      // [class]
  std::vector<int> owner_;          // [chunk] class, -1 = free
  std::vector<int> chunk_free_;     // [chunk] free blocks while lent
  std::vector<int> chunk_held_;     // [chunk] allocated, not evictable
  std::vector<std::vector<int32_t>> chunk_free_ids_;  // [chunk] stack, back() next
  std::vector<int32_t> free_chunks_;  // stack: back() is lent next
  // [class] lent chunks with a free block, by (free blocks, chunk): begin()
  // is the fullest.
  std::vector<std::set<std::pair<int, int>>> with_room_;
  std::vector<std::vector<bool>> allocated_;  // [class][id]
  std::vector<std::vector<bool>> evictable_;  // [class][id]
  std::vector<int> lent_, free_lent_, allocated_count_, evictable_count_;  // [class]
  // After evicting every evictable block: free chunks, and [class] free
  // blocks in the chunks that would stay lent (some block held).
  int64_t evicting_free_chunks_ = 0;
  std::vector<int64_t> evicting_free_lent_;
};

}  // namespace headway
