// The CUDA runtime as the rest of Headway sees it: devices, streams, device
// memory and copies, with errors as Status. Declares no CUDA types, so
// callers compile without the toolkit's headers (cuda_runtime.h stays inside
// kernels/cuda/*.cu and *.cc).
//
// Every kernel launcher in kernels/cuda takes a Stream and only enqueues
// work: a launch error (bad configuration) is reported by the next
// CheckLastError or Synchronize on that thread, an execution error (a bad
// address) by the next Synchronize.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "common/status.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace headway::cuda {

using Stream = CUstream_st*;  // nullptr = the legacy default stream

// Devices visible to this process; 0 when there is no driver or no GPU
// (never an error: callers skip GPU work).
int DeviceCount();

// A line for test skips and logs: why there is no usable GPU ("no CUDA
// device: <runtime's error>"), or "" when DeviceCount() > 0.
std::string NoDeviceReason();

struct DeviceInfo {
  std::string name;            // e.g. "NVIDIA H200"
  int compute_major = 0;       // 9 for Hopper
  int compute_minor = 0;
  int num_sms = 0;             // streaming multiprocessors
  size_t total_bytes = 0;      // device memory
  size_t free_bytes = 0;       // free now (cudaMemGetInfo)
};

// Makes `device` current on this thread and describes it. Errors:
// InvalidArgument when `device` is outside [0, DeviceCount()); Unavailable
// for a runtime error (message has the runtime's text).
Result<DeviceInfo> SetDevice(int device);

// Makes `device` current on the calling thread (a new thread starts on
// device 0), cheaply: no property queries, nothing when it already is.
// Errors: Unavailable with the runtime's text.
Status MakeCurrent(int device);

// A non-blocking stream on the current device. Errors: Unavailable.
Result<Stream> CreateStream();
void DestroyStream(Stream stream);  // nullptr is a no-op

// Waits for everything enqueued on `stream`; returns the first launch or
// execution error (Unavailable naming `what` and the runtime's text).
Status Synchronize(Stream stream, const char* what);
// The error of the last launch on this thread, cleared (Unavailable naming
// `what`), or OK.
Status CheckLastError(const char* what);

enum class MemoryKind {
  kDevice,  // cudaMalloc / cudaFree
  kPinned,  // page-locked host memory, cudaHostAlloc / cudaFreeHost: the
            // staging area of asynchronous copies and of KV transfer from
            // device pools
};

// Memory of `kKind` owned by one object. Movable.
template <MemoryKind kKind>
class OwnedMemory {
 public:
  OwnedMemory() = default;
  // bytes == 0 gives an empty buffer. Errors: ResourceExhausted naming the
  // bytes asked for (and, for device memory, the bytes free).
  static Result<OwnedMemory> Allocate(size_t bytes);
  ~OwnedMemory() { Free(); }
  OwnedMemory(OwnedMemory&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  OwnedMemory& operator=(OwnedMemory&& other) noexcept {
    if (this != &other) {
      Free();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  OwnedMemory(const OwnedMemory&) = delete;
  OwnedMemory& operator=(const OwnedMemory&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void Free();  // releases data_ (defined for each kind in runtime.cc)

  void* data_ = nullptr;
  size_t bytes_ = 0;
};

using DeviceBuffer = OwnedMemory<MemoryKind::kDevice>;
using PinnedBuffer = OwnedMemory<MemoryKind::kPinned>;
// Defined in runtime.cc.
template <>
Result<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes);
template <>
void DeviceBuffer::Free();
template <>
Result<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes);
template <>
void PinnedBuffer::Free();

// Asynchronous copies on `stream` (host memory should be pinned for real
// overlap; pageable memory works but the copy is staged by the driver).
// Errors: Unavailable with the runtime's text.
Status CopyToDevice(void* dst, const void* src, size_t bytes, Stream stream);
Status CopyToHost(void* dst, const void* src, size_t bytes, Stream stream);
Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes, Stream stream);
Status Memset(void* dst, int value, size_t bytes, Stream stream);

// Times work on a stream with CUDA events (for benchmarks).
class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void Start(Stream stream);
  void Stop(Stream stream);
  // Milliseconds between Start and Stop; waits for Stop's event.
  float ElapsedMs();

 private:
  void* start_ = nullptr;  // cudaEvent_t
  void* stop_ = nullptr;
};

}  // namespace headway::cuda
