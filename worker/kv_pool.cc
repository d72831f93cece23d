#include "worker/kv_pool.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

namespace headway {
namespace {

// "chunk of 557056 bytes (17 float32 blocks of 32768 or 64 q8_0 blocks of
// 8704)", or "block of 8192 bytes" when a chunk is a block.
std::string DescribeChunk(const KvArenaLayout& arena) {
  if (!arena.mixed()) {
    return "block of " + std::to_string(arena.chunk_bytes) + " bytes";
  }
  std::string what = "chunk of " + std::to_string(arena.chunk_bytes) + " bytes (";
  for (size_t i = 0; i < arena.classes.size(); ++i) {
    const KvCacheDtype d = arena.classes[i];
    what += (i > 0 ? " or " : "") + std::to_string(arena.BlocksPerChunk(d)) + " " +
            KvCacheDtypeName(d) + " blocks of " +
            std::to_string(arena.BlockLayout(d).BlockBytes());
  }
  return what + ")";
}

}  // namespace

Result<std::unique_ptr<KvPool>> KvPool::Create(const KvCacheLayout& layout,
                                               int64_t kv_memory_bytes) {
  if (std::string why = layout.Check(); !why.empty()) {
    return Status::InvalidArgument("KV pool: " + why);
  }
  return CreateArena(OneClassArena(layout), kv_memory_bytes);
}

std::string KvPool::CheckArena(const KvArenaLayout& arena) {
  if (arena.classes.empty() || arena.chunk_bytes == 0) {
    return "KV pool: the arena has no block class";
  }
  for (KvCacheDtype d : arena.classes) {
    if (std::string why = arena.BlockLayout(d).Check(); !why.empty()) return "KV pool: " + why;
    HW_CHECK(arena.chunk_bytes % arena.BlockLayout(d).BlockBytes() == 0);
  }
  return "";
}

KvArenaLayout KvPool::OneClassArena(const KvCacheLayout& layout) {
  return MakeKvArenaLayout(layout.block_size, layout.head_dim,
                           KvCacheDtypes{layout.dtype, layout.dtype}, {});
}

Result<std::unique_ptr<KvPool>> KvPool::CreateArena(const KvArenaLayout& arena,
                                                    int64_t kv_memory_bytes) {
  if (std::string why = CheckArena(arena); !why.empty()) return Status::InvalidArgument(why);
  const int64_t chunk_bytes = static_cast<int64_t>(arena.chunk_bytes);
  const int64_t num_chunks = kv_memory_bytes > 0 ? kv_memory_bytes / chunk_bytes : 0;
  if (num_chunks < 1) {
    return Status::InvalidArgument("KV pool: " + std::to_string(kv_memory_bytes) +
                                   " bytes of KV memory hold no " + DescribeChunk(arena) +
                                   "; raise cache.kv_memory_mb");
  }
  if (num_chunks > MaxChunks(arena)) {
    return Status::InvalidArgument("KV pool: " + std::to_string(num_chunks) + " x " +
                                   DescribeChunk(arena) +
                                   " would give block ids past the 32-bit range");
  }
  // aligned_alloc needs a size that is a multiple of the alignment.
  size_t bytes = size_t(num_chunks) * size_t(chunk_bytes);
  bytes = (bytes + kAlignmentBytes - 1) / kAlignmentBytes * kAlignmentBytes;
  void* p = std::aligned_alloc(kAlignmentBytes, bytes);
  if (p == nullptr) {
    return Status::ResourceExhausted("KV pool: cannot allocate " + std::to_string(bytes) +
                                     " bytes");
  }
  std::memset(p, 0, bytes);
  return std::unique_ptr<KvPool>(new KvPool(arena, static_cast<int>(num_chunks),
                                            static_cast<uint8_t*>(p), -1,
                                            std::shared_ptr<void>(p, std::free)));
}

std::unique_ptr<KvPool> KvPool::WrapDeviceMemory(const KvArenaLayout& arena, int num_chunks,
                                                 uint8_t* data, int device,
                                                 std::shared_ptr<void> owner) {
  HW_CHECK(CheckArena(arena).empty() && num_chunks >= 1 && num_chunks <= MaxChunks(arena));
  HW_CHECK(data != nullptr && device >= 0);
  return std::unique_ptr<KvPool>(new KvPool(arena, num_chunks, data, device, std::move(owner)));
}

std::unique_ptr<KvPool> KvPool::WrapDeviceMemory(const KvCacheLayout& layout, int num_blocks,
                                                 uint8_t* data, int device,
                                                 std::shared_ptr<void> owner) {
  HW_CHECK(layout.Check().empty());
  return WrapDeviceMemory(OneClassArena(layout), num_blocks, data, device, std::move(owner));
}

int64_t KvPool::MaxChunks(const KvArenaLayout& arena) {
  int max_blocks_per_chunk = 1;
  for (KvCacheDtype d : arena.classes) {
    max_blocks_per_chunk = std::max(max_blocks_per_chunk, arena.BlocksPerChunk(d));
  }
  return INT32_MAX / max_blocks_per_chunk;
}

int KvPool::num_blocks(KvCacheDtype dtype) const {
  if (arena_.ClassOf(dtype) < 0) return 0;
  return num_chunks_ * arena_.BlocksPerChunk(dtype);
}

KvPool::~KvPool() = default;

}  // namespace headway
