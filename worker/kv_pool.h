// The KV block pool of one TP rank: one allocation of `num_blocks` equal
// blocks (common/kv_layout.h lays out a block), in host memory or on the
// rank's CUDA device (worker/cuda/device_kv_pool.h). Any slot can take any
// block; which block belongs to which (sequence, slot) is the coordinator's
// allocation, recorded in each sequence's head-wise block table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/kv_layout.h"
#include "common/status.h"

namespace headway {

class KvPool {
 public:
  // Alignment of the pool's first byte (a cache line; AVX-512 loads).
  static constexpr size_t kAlignmentBytes = 64;

  // Sizes the pool to the whole blocks that fit in `kv_memory_bytes`:
  // num_blocks = kv_memory_bytes / layout.BlockBytes(), zero-filled.
  // Errors: InvalidArgument if layout.Check() fails (block_size or head_dim
  // not positive, head_dim not a multiple of the dtype's group) or fewer
  // than one block fits (the message gives both sizes);
  // ResourceExhausted if the allocation fails.
  static Result<std::unique_ptr<KvPool>> Create(const KvCacheLayout& layout,
                                                int64_t kv_memory_bytes);

  // A pool over memory allocated elsewhere (a CUDA device's, by
  // worker/cuda/): `data` holds num_blocks blocks of layout.BlockBytes(),
  // already zeroed, and stays valid while `owner` lives. `device` is the CUDA
  // device ordinal holding it.
  // REQUIRES: num_blocks >= 1, data != nullptr, device >= 0.
  static std::unique_ptr<KvPool> WrapDeviceMemory(const KvCacheLayout& layout, int num_blocks,
                                                  uint8_t* data, int device,
                                                  std::shared_ptr<void> owner);

  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  const KvCacheLayout& layout() const { return layout_; }
  int num_blocks() const { return num_blocks_; }
  size_t num_bytes() const { return size_t(num_blocks_) * layout_.BlockBytes(); }

  // [num_blocks, BlockBytes()] bytes, laid out as common/kv_layout.h says
  // for layout().dtype; valid for the pool's lifetime. Device memory when
  // on_device(): only kernels and cuda copies may touch it.
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }

  // -1 for host memory, else the CUDA device ordinal holding data().
  int device() const { return device_; }
  bool on_device() const { return device_ >= 0; }

 private:
  KvPool(const KvCacheLayout& layout, int num_blocks, uint8_t* data, int device,
         std::shared_ptr<void> owner)
      : layout_(layout), num_blocks_(num_blocks), data_(data), device_(device),
        owner_(std::move(owner)) {}

  const KvCacheLayout layout_;
  const int num_blocks_;
  uint8_t* const data_;
  const int device_;
  const std::shared_ptr<void> owner_;  // frees data_ (std::free, or the device's allocator)
};

}  // namespace headway
