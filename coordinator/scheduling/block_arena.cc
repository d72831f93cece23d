#include "coordinator/scheduling/block_arena.h"

#include <algorithm>
#include <limits>

#include "common/status.h"

namespace headway {

BlockArena::BlockArena(int num_chunks, std::vector<int> blocks_per_chunk)
    : per_chunk_(std::move(blocks_per_chunk)),
      owner_(size_t(std::max(num_chunks, 0)), -1),
      chunk_free_(owner_.size(), 0),
      chunk_held_(owner_.size(), 0),
      chunk_free_ids_(owner_.size()),
      with_room_(per_chunk_.size()),
      allocated_(per_chunk_.size()),
      evictable_(per_chunk_.size()),
      lent_(per_chunk_.size(), 0),
      free_lent_(per_chunk_.size(), 0),
      allocated_count_(per_chunk_.size(), 0),
      evictable_count_(per_chunk_.size(), 0),
      evicting_free_chunks_(num_chunks),
      evicting_free_lent_(per_chunk_.size(), 0) {
  HW_CHECK(num_chunks >= 0 && !per_chunk_.empty());
  for (size_t c = 0; c < per_chunk_.size(); ++c) {
    HW_CHECK(per_chunk_[c] >= 1);
    HW_CHECK(int64_t(num_chunks) * per_chunk_[c] <= std::numeric_limits<int32_t>::max());
    allocated_[c].assign(size_t(num_chunks) * size_t(per_chunk_[c]), false);
    evictable_[c].assign(allocated_[c].size(), false);
  }
  free_chunks_.reserve(size_t(num_chunks));
  for (int k = num_chunks; k-- > 0;) free_chunks_.push_back(k);
}

void BlockArena::AddEvictingTotals(int chunk, int sign) {
  const int c = owner_[size_t(chunk)];
  if (c < 0 || chunk_held_[size_t(chunk)] == 0) {
    evicting_free_chunks_ += sign;
  } else {
    evicting_free_lent_[size_t(c)] += sign * (per_chunk_[size_t(c)] - chunk_held_[size_t(chunk)]);
  }
}

int64_t BlockArena::ChunksToBorrow(std::span<const int64_t> needed,
                                   std::span<const int64_t> have) const {
  HW_CHECK(needed.size() == per_chunk_.size());
  int64_t chunks = 0;
  for (size_t c = 0; c < per_chunk_.size(); ++c) {
    const int64_t short_by = needed[c] - have[c];
    if (short_by > 0) chunks += (short_by + per_chunk_[c] - 1) / per_chunk_[c];
  }
  return chunks;
}

bool BlockArena::CanAllocate(std::span<const int64_t> needed) const {
  std::vector<int64_t> have(free_lent_.begin(), free_lent_.end());
  return ChunksToBorrow(needed, have) <= int64_t(free_chunks_.size());
}

bool BlockArena::CanAllocateEvicting(std::span<const int64_t> needed,
                                     std::span<const ClassBlock> also_held) const {
  std::vector<int64_t> have = evicting_free_lent_;
  int64_t chunks = evicting_free_chunks_;
  if (!also_held.empty()) {
    // Count the extra holds per chunk, then redo those chunks' share.
    std::vector<std::pair<int, int>> by_chunk;  // (chunk, class)
    by_chunk.reserve(also_held.size());
    for (const ClassBlock& b : also_held) {
      HW_CHECK(is_evictable(b.cls, b.id));
      by_chunk.emplace_back(ChunkOf(b.cls, b.id), b.cls);
    }
    std::sort(by_chunk.begin(), by_chunk.end());
    for (size_t i = 0; i < by_chunk.size();) {
      const auto [chunk, c] = by_chunk[i];
      size_t j = i;
      while (j < by_chunk.size() && by_chunk[j].first == chunk) ++j;
      const int64_t n = per_chunk_[size_t(c)], held = chunk_held_[size_t(chunk)];
      if (held == 0) {
        --chunks;  // it would no longer come back whole
      } else {
        have[size_t(c)] -= n - held;
      }
      have[size_t(c)] += n - held - int64_t(j - i);
      i = j;
    }
  }
  return ChunksToBorrow(needed, have) <= chunks;
}

void BlockArena::Borrow(int cls) {
  HW_CHECK(!free_chunks_.empty());
  const int k = free_chunks_.back();
  free_chunks_.pop_back();
  AddEvictingTotals(k, -1);
  const int n = per_chunk_[size_t(cls)];
  owner_[size_t(k)] = cls;
  chunk_free_[size_t(k)] = n;
  chunk_held_[size_t(k)] = 0;
  std::vector<int32_t>& ids = chunk_free_ids_[size_t(k)];
  ids.clear();
  for (int i = n; i-- > 0;) ids.push_back(int32_t(k) * n + i);  // lowest id handed out first
  with_room_[size_t(cls)].emplace(n, k);
  ++lent_[size_t(cls)];
  free_lent_[size_t(cls)] += n;
  AddEvictingTotals(k, +1);
}

void BlockArena::Return(int chunk) {
  const int c = owner_[size_t(chunk)];
  const int n = per_chunk_[size_t(c)];
  HW_CHECK(chunk_free_[size_t(chunk)] == n);
  AddEvictingTotals(chunk, -1);
  with_room_[size_t(c)].erase({n, chunk});
  --lent_[size_t(c)];
  free_lent_[size_t(c)] -= n;
  owner_[size_t(chunk)] = -1;
  chunk_free_[size_t(chunk)] = 0;
  chunk_free_ids_[size_t(chunk)].clear();
  free_chunks_.push_back(chunk);
  AddEvictingTotals(chunk, +1);
}

std::vector<int32_t> BlockArena::Allocate(int cls, int n) {
  std::vector<int32_t> ids;
  ids.reserve(size_t(std::max(n, 0)));
  std::set<std::pair<int, int>>& room = with_room_[size_t(cls)];
  for (int i = 0; i < n; ++i) {
    if (room.empty()) Borrow(cls);
    const auto [free, k] = *room.begin();
    room.erase(room.begin());
    if (free > 1) room.emplace(free - 1, k);
    AddEvictingTotals(k, -1);
    --chunk_free_[size_t(k)];
    ++chunk_held_[size_t(k)];
    AddEvictingTotals(k, +1);
    const int32_t id = chunk_free_ids_[size_t(k)].back();
    chunk_free_ids_[size_t(k)].pop_back();
    allocated_[size_t(cls)][size_t(id)] = true;
    --free_lent_[size_t(cls)];
    ++allocated_count_[size_t(cls)];
    ids.push_back(id);
  }
  return ids;
}

void BlockArena::Free(int cls, std::span<const int32_t> ids) {
  const int n = per_chunk_[size_t(cls)];
  for (int32_t id : ids) {
    HW_CHECK(id >= 0 && id < num_block_ids(cls) && allocated_[size_t(cls)][size_t(id)]);
    const int k = ChunkOf(cls, id);
    HW_CHECK(owner_[size_t(k)] == cls);
    AddEvictingTotals(k, -1);
    if (evictable_[size_t(cls)][size_t(id)]) {
      evictable_[size_t(cls)][size_t(id)] = false;
      --evictable_count_[size_t(cls)];
    } else {
      --chunk_held_[size_t(k)];
    }
    const int free = chunk_free_[size_t(k)]++;
    AddEvictingTotals(k, +1);
    allocated_[size_t(cls)][size_t(id)] = false;
    --allocated_count_[size_t(cls)];
    ++free_lent_[size_t(cls)];
    chunk_free_ids_[size_t(k)].push_back(id);
    std::set<std::pair<int, int>>& room = with_room_[size_t(cls)];
    if (free > 0) room.erase({free, k});
    room.emplace(free + 1, k);
    if (free + 1 == n) Return(k);
  }
}

void BlockArena::SetEvictable(int cls, int32_t id, bool evictable) {
  HW_CHECK(id >= 0 && id < num_block_ids(cls) && allocated_[size_t(cls)][size_t(id)]);
  HW_CHECK(evictable_[size_t(cls)][size_t(id)] != evictable);
  const int k = ChunkOf(cls, id);
  AddEvictingTotals(k, -1);
  chunk_held_[size_t(k)] += evictable ? -1 : 1;
  AddEvictingTotals(k, +1);
  evictable_[size_t(cls)][size_t(id)] = evictable;
  evictable_count_[size_t(cls)] += evictable ? 1 : -1;
}

}  // namespace headway
