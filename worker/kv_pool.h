// The KV block pool of one TP rank: one allocation of `num_chunks` equal
// chunks (common/kv_arena.h), each holding a whole number of blocks of
// either dtype the rank's slots use (common/kv_layout.h lays out a block),
// in host memory or on the rank's CUDA device (worker/cuda/device_kv_pool.h).
// With one dtype a chunk is one block. Any slot can take any block of its
// dtype; which block belongs to which (sequence, slot), and which chunk
// holds which dtype's blocks, is the coordinator's allocation, recorded in
// each sequence's head-wise block table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/kv_arena.h"
#include "common/kv_layout.h"
#include "common/status.h"

namespace headway {

class KvPool {
 public:
  // Alignment of the pool's first byte (a cache line; AVX-512 loads).
  static constexpr size_t kAlignmentBytes = 64;

  // Sizes the pool to the whole chunks that fit in `kv_memory_bytes`:
  // num_chunks = kv_memory_bytes / arena.chunk_bytes, zero-filled.
  // Errors: InvalidArgument if `arena` has no block class, a class's layout
  // fails KvCacheLayout::Check(), fewer than one chunk fits (the message
  // gives both sizes), or some dtype's block ids would pass 2^31 - 1;
  // ResourceExhausted if the allocation fails.
  static Result<std::unique_ptr<KvPool>> CreateArena(const KvArenaLayout& arena,
                                                     int64_t kv_memory_bytes);

  // A pool of blocks of one `layout` (an arena of one class, chunk = block):
  // num_blocks = kv_memory_bytes / layout.BlockBytes(). Errors as above,
  // InvalidArgument naming the block size when no block fits.
  static Result<std::unique_ptr<KvPool>> Create(const KvCacheLayout& layout,
                                                int64_t kv_memory_bytes);

  // A pool over memory allocated elsewhere (a CUDA device's, by
  // worker/cuda/): `data` holds num_chunks * arena.chunk_bytes bytes, already
  // zeroed, and stays valid while `owner` lives. `device` is the CUDA device
  // ordinal holding it.
  // REQUIRES: 1 <= num_chunks <= MaxChunks(arena), data != nullptr,
  // device >= 0, every class's layout passes Check().
  static std::unique_ptr<KvPool> WrapDeviceMemory(const KvArenaLayout& arena, int num_chunks,
                                                  uint8_t* data, int device,
                                                  std::shared_ptr<void> owner);
  // The same for blocks of one `layout` (a chunk is a block).
  static std::unique_ptr<KvPool> WrapDeviceMemory(const KvCacheLayout& layout, int num_blocks,
                                                  uint8_t* data, int device,
                                                  std::shared_ptr<void> owner);

  // Empty when a pool can be laid out as `arena`: it has a block class and
  // every class's layout passes KvCacheLayout::Check(). Otherwise why not,
  // prefixed "KV pool: ".
  static std::string CheckArena(const KvArenaLayout& arena);
  // The arena of blocks of one `layout`: one class, a chunk is a block.
  static KvArenaLayout OneClassArena(const KvCacheLayout& layout);

  // The most chunks of `arena` whose block ids all fit in int32 (proto
  // SlotDelta, the kernels' block tables): INT32_MAX / the largest
  // BlocksPerChunk. REQUIRES: arena has a class.
  static int64_t MaxChunks(const KvArenaLayout& arena);

  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  // The arena's geometry: its dtypes, block classes and chunk size.
  const KvArenaLayout& arena() const { return arena_; }
  int num_chunks() const { return num_chunks_; }
  // Blocks of `dtype` the whole arena would hold (num_chunks *
  // BlocksPerChunk(dtype)): the bound of that dtype's block ids. 0 for a
  // dtype that is none of arena().classes.
  int num_blocks(KvCacheDtype dtype) const;

  // The layout of the arena's first block class: the full-attention slots'
  // dtype when the model has full slots (the only class when unmixed).
  const KvCacheLayout& layout() const { return layout_; }
  // num_blocks(layout().dtype).
  int num_blocks() const { return num_blocks(layout_.dtype); }
  // num_chunks * chunk_bytes.
  size_t num_bytes() const { return size_t(num_chunks_) * arena_.chunk_bytes; }

  // [num_chunks, chunk_bytes] bytes; block b of dtype d at data() + b *
  // arena().BlockLayout(d).BlockBytes(), laid out as common/kv_layout.h says
  // for d; valid for the pool's lifetime. Device memory when on_device():
  // only kernels and cuda copies may touch it.
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }

  // -1 for host memory, else the CUDA device ordinal holding data().
  int device() const { return device_; }
  bool on_device() const { return device_ >= 0; }

 private:
  KvPool(const KvArenaLayout& arena, int num_chunks, uint8_t* data, int device,
         std::shared_ptr<void> owner)
      : arena_(arena), layout_(arena.BlockLayout(arena.classes.front())),
        num_chunks_(num_chunks), data_(data), device_(device), owner_(std::move(owner)) {}

  const KvArenaLayout arena_;
  const KvCacheLayout layout_;
  const int num_chunks_;
  uint8_t* const data_;
  const int device_;
  const std::shared_ptr<void> owner_;  // frees data_ (std::free, or the device's allocator)
};

}  // namespace headway
