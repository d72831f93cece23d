#include "coordinator/scheduling/block_pool.h"

#include "common/status.h"

namespace headway {

BlockPool::BlockPool(int num_blocks) {
  HW_CHECK(num_blocks >= 0);
  allocated_.assign(num_blocks, false);
  free_.reserve(num_blocks);
  // Reverse order so the first allocations get ids 0, 1, 2, ... which keeps
  // logs and tests readable.
  for (int id = num_blocks - 1; id >= 0; --id) free_.push_back(id);
}

std::vector<int32_t> BlockPool::Allocate(int n) {
  HW_CHECK(CanAllocate(n));
  std::vector<int32_t> ids;
  if (n <= 0) return ids;
  ids.reserve(n);
  for (int i = 0; i < n; ++i) {
    int32_t id = free_.back();
    free_.pop_back();
    allocated_[id] = true;
    ids.push_back(id);
  }
  return ids;
}

void BlockPool::Free(const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    HW_CHECK(id >= 0 && id < num_total());
    HW_CHECK(allocated_[id]);
    allocated_[id] = false;
    free_.push_back(id);
  }
}

}  // namespace headway
