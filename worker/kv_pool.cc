#include "worker/kv_pool.h"

#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

namespace headway {

Result<std::unique_ptr<KvPool>> KvPool::Create(const KvCacheLayout& layout,
                                               int64_t kv_memory_bytes) {
  if (std::string why = layout.Check(); !why.empty()) {
    return Status::InvalidArgument("KV pool: " + why);
  }
  const int64_t block_bytes = static_cast<int64_t>(layout.BlockBytes());
  const int64_t num_blocks = kv_memory_bytes > 0 ? kv_memory_bytes / block_bytes : 0;
  if (num_blocks < 1) {
    return Status::InvalidArgument("KV pool: " + std::to_string(kv_memory_bytes) +
                                   " bytes of KV memory hold no block of " +
                                   std::to_string(block_bytes) +
                                   " bytes; raise cache.kv_memory_mb");
  }
  if (num_blocks > INT32_MAX) {
    return Status::InvalidArgument("KV pool: " + std::to_string(num_blocks) +
                                   " blocks exceed the 32-bit block id range");
  }
  // aligned_alloc needs a size that is a multiple of the alignment.
  size_t bytes = size_t(num_blocks) * size_t(block_bytes);
  bytes = (bytes + kAlignmentBytes - 1) / kAlignmentBytes * kAlignmentBytes;
  void* p = std::aligned_alloc(kAlignmentBytes, bytes);
  if (p == nullptr) {
    return Status::ResourceExhausted("KV pool: cannot allocate " + std::to_string(bytes) +
                                     " bytes");
  }
  std::memset(p, 0, bytes);
  return std::unique_ptr<KvPool>(new KvPool(layout, static_cast<int>(num_blocks),
                                            static_cast<uint8_t*>(p), -1,
                                            std::shared_ptr<void>(p, std::free)));
}

std::unique_ptr<KvPool> KvPool::WrapDeviceMemory(const KvCacheLayout& layout, int num_blocks,
                                                 uint8_t* data, int device,
                                                 std::shared_ptr<void> owner) {
  HW_CHECK(num_blocks >= 1 && data != nullptr && device >= 0);
  return std::unique_ptr<KvPool>(new KvPool(layout, num_blocks, data, device, std::move(owner)));
}

KvPool::~KvPool() = default;

}  // namespace headway
