// KvPoolMemory over CUDA device memory. Compiled to nothing unless the comm
// library is built with the CUDA runtime (HEADWAY_HAVE_CUDA); then
// kv_pool_memory.cc leaves NewCudaKvPoolMemory to this file.
#include "comm/kv_pool_memory.h"

#if HEADWAY_HAVE_CUDA

#include <cuda_runtime.h>

#include <mutex>
#include <string>

namespace headway {
namespace {

std::string CudaError(const std::string& what, cudaError_t error) {
  return what + ": " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")";
}

// Makes `device` current on the calling thread and leaves it so. Restoring
// the thread's previous device would, on a fresh thread (UCX's progress
// thread, the transfer thread), mean "restoring" the default device 0 and
// creating a context there, a few hundred MiB, in every worker that moves KV
// blocks whatever its own GPU. In a worker every thread that copies blocks
// works on the pool's device anyway.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    int current = -1;
    error_ = cudaGetDevice(&current);
    if (error_ == cudaSuccess && current != device) error_ = cudaSetDevice(device);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  cudaError_t error() const { return error_; }

 private:
  cudaError_t error_ = cudaSuccess;
};

class CudaKvPoolMemory final : public KvPoolMemory {
 public:
  CudaKvPoolMemory(void* base, uint64_t bytes, int device, cudaStream_t stream)
      : base_(static_cast<uint8_t*>(base)), bytes_(bytes), device_(device), stream_(stream) {}

  ~CudaKvPoolMemory() override {
    ScopedDevice scoped(device_);
    cudaStreamDestroy(stream_);
  }

  CudaKvPoolMemory(const CudaKvPoolMemory&) = delete;
  CudaKvPoolMemory& operator=(const CudaKvPoolMemory&) = delete;

  void* base() const override { return base_; }
  uint64_t bytes() const override { return bytes_; }
  int cuda_device() const override { return device_; }
  bool host_accessible() const override { return false; }

  Status CopyToHost(uint64_t offset, void* dst, uint64_t bytes) const override {
    HW_RETURN_IF_ERROR(CheckKvPoolRange(offset, bytes, bytes_));
    return Copy(dst, base_ + offset, bytes, cudaMemcpyDeviceToHost, "device -> host");
  }

  Status CopyFromHost(uint64_t offset, const void* src, uint64_t bytes) override {
    HW_RETURN_IF_ERROR(CheckKvPoolRange(offset, bytes, bytes_));
    return Copy(base_ + offset, src, bytes, cudaMemcpyHostToDevice, "host -> device");
  }

  Result<std::shared_ptr<uint8_t>> AllocateStaging(uint64_t bytes) const override {
    ScopedDevice scoped(device_);
    if (scoped.error() != cudaSuccess) {
      return Status::Unavailable(CudaError("KV staging: cudaSetDevice", scoped.error()));
    }
    void* p = nullptr;
    // Portable: the buffer is pinned for every device, whichever is current.
    const cudaError_t error = cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
    if (error != cudaSuccess || p == nullptr) {
      return Status::ResourceExhausted(
          CudaError("KV staging: cudaHostAlloc of " + std::to_string(bytes) + " bytes", error));
    }
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { cudaFreeHost(q); });
  }

  Status BindCallingThread() const override {
    const cudaError_t error = cudaSetDevice(device_);
    if (error != cudaSuccess) {
      return Status::Unavailable(CudaError("KV transfer: cudaSetDevice(" +
                                           std::to_string(device_) + ")", error));
    }
    return Status::Ok();
  }

 private:
  // One copy on stream_, finished before returning. mu_ keeps copies apart
  // so that an error reported by the synchronize belongs to this copy.
  Status Copy(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind,
              const char* what) const {
    if (bytes == 0) return Status::Ok();
    std::lock_guard<std::mutex> lock(mu_);
    ScopedDevice scoped(device_);
    cudaError_t error = scoped.error();
    if (error == cudaSuccess) error = cudaMemcpyAsync(dst, src, bytes, kind, stream_);
    if (error == cudaSuccess) error = cudaStreamSynchronize(stream_);
    if (error != cudaSuccess) {
      return Status::Unavailable(CudaError(std::string("KV pool copy ") + what + " of " +
                                               std::to_string(bytes) + " bytes on device " +
                                               std::to_string(device_),
                                           error));
    }
    return Status::Ok();
  }

  uint8_t* const base_;
  const uint64_t bytes_;
  const int device_;
  const cudaStream_t stream_;  // non-blocking: never waits for the compute streams
  mutable std::mutex mu_;
};

}  // namespace

Result<std::unique_ptr<KvPoolMemory>> NewCudaKvPoolMemory(void* base, uint64_t bytes,
                                                          int device) {
  if (base == nullptr || bytes == 0 || device < 0) {
    return Status::InvalidArgument("KV pool memory: device pool needs a base, bytes > 0 and a "
                                   "device >= 0, got device " + std::to_string(device) + ", " +
                                   std::to_string(bytes) + " bytes");
  }
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) return Status::Unavailable(CudaError("cudaGetDeviceCount", error));
  if (device >= count) {
    return Status::InvalidArgument("KV pool memory: CUDA device " + std::to_string(device) +
                                   " of " + std::to_string(count));
  }
  ScopedDevice scoped(device);
  if (scoped.error() != cudaSuccess) {
    return Status::Unavailable(CudaError("KV pool memory: cudaSetDevice", scoped.error()));
  }
  // A host pointer here would make every copy fail later, far from the cause.
  cudaPointerAttributes attributes{};
  error = cudaPointerGetAttributes(&attributes, base);
  if (error != cudaSuccess) {
    return Status::InvalidArgument(CudaError("KV pool memory: cudaPointerGetAttributes", error));
  }
  if ((attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) ||
      attributes.device != device) {
    return Status::InvalidArgument("KV pool memory: pool is not memory of CUDA device " +
                                   std::to_string(device) + " (memory type " +
                                   std::to_string(int(attributes.type)) + ", device " +
                                   std::to_string(attributes.device) + ")");
  }
  cudaStream_t stream = nullptr;
  error = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (error != cudaSuccess) {
    return Status::Unavailable(CudaError("KV pool memory: cudaStreamCreateWithFlags", error));
  }
  return std::unique_ptr<KvPoolMemory>(new CudaKvPoolMemory(base, bytes, device, stream));
}

}  // namespace headway

#endif  // HEADWAY_HAVE_CUDA
