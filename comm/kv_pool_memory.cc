#include "comm/kv_pool_memory.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace headway {
namespace {

// Staging buffers start on a cache line, as the pools do.
constexpr uint64_t kStagingAlignmentBytes = 64;

class HostKvPoolMemory final : public KvPoolMemory {
 public:
  HostKvPoolMemory(void* base, uint64_t bytes) : base_(static_cast<uint8_t*>(base)), bytes_(bytes) {}

  void* base() const override { return base_; }
  uint64_t bytes() const override { return bytes_; }
  int cuda_device() const override { return -1; }
  bool host_accessible() const override { return true; }

  Status CopyToHost(uint64_t offset, void* dst, uint64_t bytes) const override {
    HW_RETURN_IF_ERROR(CheckKvPoolRange(offset, bytes, bytes_));
    std::memcpy(dst, base_ + offset, bytes);
    return Status::Ok();
  }

  Status CopyFromHost(uint64_t offset, const void* src, uint64_t bytes) override {
    HW_RETURN_IF_ERROR(CheckKvPoolRange(offset, bytes, bytes_));
    std::memcpy(base_ + offset, src, bytes);
    return Status::Ok();
  }

  Result<std::shared_ptr<uint8_t>> AllocateStaging(uint64_t bytes) const override {
    const uint64_t rounded =
        (bytes + kStagingAlignmentBytes - 1) / kStagingAlignmentBytes * kStagingAlignmentBytes;
    void* p = std::aligned_alloc(kStagingAlignmentBytes, rounded == 0 ? kStagingAlignmentBytes
                                                                      : rounded);
    if (p == nullptr) {
      return Status::ResourceExhausted("KV staging: cannot allocate " + std::to_string(bytes) +
                                       " host bytes");
    }
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
  }

  Status BindCallingThread() const override { return Status::Ok(); }

 private:
  uint8_t* const base_;
  const uint64_t bytes_;
};

}  // namespace

Status CheckKvPoolRange(uint64_t offset, uint64_t bytes, uint64_t pool_bytes) {
  if (offset > pool_bytes || bytes > pool_bytes - offset) {
    return Status::OutOfRange("KV pool range [" + std::to_string(offset) + ", +" +
                              std::to_string(bytes) + ") outside the pool's " +
                              std::to_string(pool_bytes) + " bytes");
  }
  return Status::Ok();
}

std::unique_ptr<KvPoolMemory> NewHostKvPoolMemory(void* base, uint64_t bytes) {
  HW_CHECK(base != nullptr);
  return std::make_unique<HostKvPoolMemory>(base, bytes);
}

#if !HEADWAY_HAVE_CUDA
// Built without the CUDA runtime (comm/cuda_kv_pool_memory.cc holds the
// real one): device pools cannot be transferred.
Result<std::unique_ptr<KvPoolMemory>> NewCudaKvPoolMemory(void* /*base*/, uint64_t /*bytes*/,
                                                          int device) {
  return Status::Unimplemented("KV transfer from CUDA device " + std::to_string(device) +
                               " memory: Headway's comm library was built without CUDA");
}
#endif

}  // namespace headway
