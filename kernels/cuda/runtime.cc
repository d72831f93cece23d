#include "kernels/cuda/runtime.h"

#include <cuda_runtime.h>

#include <utility>

namespace headway::cuda {
namespace {

Status Error(const char* what, cudaError_t err) {
  return Status::Unavailable(std::string(what) + ": CUDA error: " + cudaGetErrorString(err));
}

}  // namespace

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

std::string NoDeviceReason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorString(err);
  }
  return count > 0 ? "" : "no CUDA device: the driver reports 0 devices";
}

Result<DeviceInfo> SetDevice(int device) {
  const int count = DeviceCount();
  if (count == 0) {
    return Status::InvalidArgument("CUDA device " + std::to_string(device) +
                                   " requested, but this machine has none (" +
                                   NoDeviceReason() + ")");
  }
  if (device < 0 || device >= count) {
    return Status::InvalidArgument("CUDA device " + std::to_string(device) + " outside [0, " +
                                   std::to_string(count) + ")");
  }
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return Error("cudaSetDevice", err);
  }
  cudaDeviceProp prop{};
  if (cudaError_t err = cudaGetDeviceProperties(&prop, device); err != cudaSuccess) {
    return Error("cudaGetDeviceProperties", err);
  }
  DeviceInfo info;
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.num_sms = prop.multiProcessorCount;
  if (cudaError_t err = cudaMemGetInfo(&info.free_bytes, &info.total_bytes); err != cudaSuccess) {
    return Error("cudaMemGetInfo", err);
  }
  return info;
}

Status MakeCurrent(int device) {
  int current = -1;
  if (cudaError_t err = cudaGetDevice(&current); err != cudaSuccess) {
    return Error("cudaGetDevice", err);
  }
  if (current == device) return Status::Ok();
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return Error("cudaSetDevice", err);
  }
  return Status::Ok();
}

Result<Stream> CreateStream() {
  cudaStream_t stream = nullptr;
  if (cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      err != cudaSuccess) {
    return Error("cudaStreamCreate", err);
  }
  return stream;
}

void DestroyStream(Stream stream) {
  if (stream != nullptr) cudaStreamDestroy(stream);
}

Status Synchronize(Stream stream, const char* what) {
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return Error(what, err);
  if (cudaError_t err = cudaStreamSynchronize(stream); err != cudaSuccess) return Error(what, err);
  return Status::Ok();
}

Status CheckLastError(const char* what) {
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return Error(what, err);
  return Status::Ok();
}

template <>
Result<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  if (cudaError_t err = cudaMalloc(&buffer.data_, bytes); err != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    return Status::ResourceExhausted("cudaMalloc of " + std::to_string(bytes) + " bytes failed (" +
                                     cudaGetErrorString(err) + "; " + std::to_string(free_bytes) +
                                     " bytes free)");
  }
  buffer.bytes_ = bytes;
  return buffer;
}

template <>
void DeviceBuffer::Free() {
  if (data_ != nullptr) cudaFree(data_);
}

template <>
Result<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  PinnedBuffer buffer;
  if (bytes == 0) return buffer;
  if (cudaError_t err = cudaHostAlloc(&buffer.data_, bytes, cudaHostAllocDefault);
      err != cudaSuccess) {
    cudaGetLastError();
    return Status::ResourceExhausted("cudaHostAlloc of " + std::to_string(bytes) +
                                     " bytes failed: " + cudaGetErrorString(err));
  }
  buffer.bytes_ = bytes;
  return buffer;
}

template <>
void PinnedBuffer::Free() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

namespace {

Status Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, Stream stream,
            const char* what) {
  if (bytes == 0) return Status::Ok();
  if (cudaError_t err = cudaMemcpyAsync(dst, src, bytes, kind, stream); err != cudaSuccess) {
    return Error(what, err);
  }
  return Status::Ok();
}

}  // namespace

Status CopyToDevice(void* dst, const void* src, size_t bytes, Stream stream) {
  return Copy(dst, src, bytes, cudaMemcpyHostToDevice, stream, "copy to device");
}

Status CopyToHost(void* dst, const void* src, size_t bytes, Stream stream) {
  return Copy(dst, src, bytes, cudaMemcpyDeviceToHost, stream, "copy to host");
}

Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes, Stream stream) {
  return Copy(dst, src, bytes, cudaMemcpyDeviceToDevice, stream, "device copy");
}

Status Memset(void* dst, int value, size_t bytes, Stream stream) {
  if (bytes == 0) return Status::Ok();
  if (cudaError_t err = cudaMemsetAsync(dst, value, bytes, stream); err != cudaSuccess) {
    return Error("memset", err);
  }
  return Status::Ok();
}

EventTimer::EventTimer() {
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  start_ = start;
  stop_ = stop;
}

EventTimer::~EventTimer() {
  if (start_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  if (stop_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

void EventTimer::Start(Stream stream) { cudaEventRecord(static_cast<cudaEvent_t>(start_), stream); }

void EventTimer::Stop(Stream stream) { cudaEventRecord(static_cast<cudaEvent_t>(stop_), stream); }

float EventTimer::ElapsedMs() {
  cudaEventSynchronize(static_cast<cudaEvent_t>(stop_));
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_));
  return ms;
}

}  // namespace headway::cuda
