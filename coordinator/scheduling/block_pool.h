// One TP rank's pool of KV block ids, as the coordinator sees it.
//
// The worker owns the memory; the coordinator owns the ids. Any slot of the
// rank can take any free block (DESIGN.md "Block"), so one free list serves
// every (layer, KV head) of the rank.
#pragma once

#include <cstdint>
#include <vector>

namespace headway {

class BlockPool {
 public:
  // A pool of ids [0, num_blocks). REQUIRES: num_blocks >= 0.
  explicit BlockPool(int num_blocks);

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  BlockPool(BlockPool&&) = default;
  BlockPool& operator=(BlockPool&&) = default;

  // True if `n` blocks are free now. n <= 0 is always allocatable.
  bool CanAllocate(int n) const { return n <= num_free(); }

  // Takes `n` free blocks and returns their ids (lowest ids first the first
  // time round, then in the order blocks were freed, most recent last).
  // REQUIRES: CanAllocate(n).
  std::vector<int32_t> Allocate(int n);

  // Returns blocks to the pool. REQUIRES: every id was allocated from this
  // pool and is not free (a double free or foreign id is a bug: HW_CHECK).
  void Free(const std::vector<int32_t>& ids);

  int num_free() const { return static_cast<int>(free_.size()); }
  int num_total() const { return static_cast<int>(allocated_.size()); }
  int num_allocated() const { return num_total() - num_free(); }
  // True while `id` is handed out. REQUIRES: 0 <= id < num_total().
  bool is_allocated(int32_t id) const { return allocated_[id]; }

 private:
  std::vector<int32_t> free_;    // a stack: back() is handed out next
  std::vector<bool> allocated_;  // [num_total] true while a block is in use
};

}  // namespace headway
