// The KV block pool of one TP rank: one host allocation of `num_blocks`
// equal blocks (kernels/kv_cache.h lays out a block). Any slot can take any
// block; which block belongs to which (sequence, slot) is the coordinator's
// allocation, recorded in each sequence's head-wise block table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/status.h"
#include "kernels/kv_cache.h"

namespace headway {

class KvPool {
 public:
  // Alignment of the pool's first byte (a cache line; AVX-512 loads).
  static constexpr size_t kAlignmentBytes = 64;

  // Sizes the pool to the whole blocks that fit in `kv_memory_bytes`:
  // num_blocks = kv_memory_bytes / layout.BlockBytes(), zero-filled.
  // Errors: InvalidArgument if block_size or head_dim is not positive or
  // fewer than one block fits (the message gives both sizes);
  // ResourceExhausted if the allocation fails.
  static Result<std::unique_ptr<KvPool>> Create(const KvCacheLayout& layout,
                                                int64_t kv_memory_bytes);

  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  const KvCacheLayout& layout() const { return layout_; }
  int num_blocks() const { return num_blocks_; }
  size_t num_bytes() const { return size_t(num_blocks_) * layout_.BlockBytes(); }

  // [num_blocks, BlockFloats()] f32; valid for the pool's lifetime.
  float* data() { return data_; }
  const float* data() const { return data_; }

 private:
  KvPool(const KvCacheLayout& layout, int num_blocks, float* data)
      : layout_(layout), num_blocks_(num_blocks), data_(data) {}

  const KvCacheLayout layout_;
  const int num_blocks_;
  float* const data_;  // owned; std::aligned_alloc
};

}  // namespace headway
