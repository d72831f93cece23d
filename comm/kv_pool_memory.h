// Where a KV pool's bytes live, as KV transfer sees them: the pool's address
// range and how to copy ranges of it to and from host memory. The transfer
// agent (comm/kv_transfer.h) hands a host pool's memory straight to UCX; a
// pool UCX cannot address (device memory with a UCX built without CUDA
// transports) goes through host staging buffers filled and drained by
// CopyToHost / CopyFromHost. Offsets and byte counts are relative to the
// pool's first byte; ranges are [offset, offset + bytes).
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"

namespace headway {

// Thread-safety: every method may be called from several threads at once
// (the agent's progress thread copies in while WriteBlocks callers copy out).
class KvPoolMemory {
 public:
  virtual ~KvPoolMemory() = default;

  // The pool's first byte in this process's address space (a host or a
  // device address). Never sent to peers: block messages name offsets.
  virtual void* base() const = 0;
  // Bytes of the pool, from base().
  virtual uint64_t bytes() const = 0;
  // The CUDA device ordinal holding the bytes, or -1 when they are not
  // device memory.
  virtual int cuda_device() const = 0;
  // True when the CPU (and so UCX's host transports) may read and write
  // [base(), base() + bytes()) directly; false when only the copies below
  // may touch the bytes.
  virtual bool host_accessible() const = 0;

  // Copies pool bytes [offset, offset + bytes) into `dst` (host memory) and
  // returns once `dst` holds them. Errors: OutOfRange when the range leaves
  // the pool; Unavailable when the device copy fails (message has the
  // runtime's text).
  virtual Status CopyToHost(uint64_t offset, void* dst, uint64_t bytes) const = 0;
  // Copies `bytes` bytes from `src` (host memory) into pool bytes
  // [offset, offset + bytes) and returns once the pool holds them (later
  // device work on any stream sees them). Errors as CopyToHost.
  virtual Status CopyFromHost(uint64_t offset, const void* src, uint64_t bytes) = 0;

  // Host memory for staging copies of this pool: page-locked for a CUDA
  // pool (the DMA engine reads and writes it directly), plain otherwise. The
  // buffer frees itself when the last owner lets go. Errors:
  // ResourceExhausted.
  virtual Result<std::shared_ptr<uint8_t>> AllocateStaging(uint64_t bytes) const = 0;

  // Makes the pool's device current on the calling thread (before UCX
  // reads device memory on it); OK and nothing else for host memory.
  // Errors: Unavailable when the device cannot be made current.
  virtual Status BindCallingThread() const = 0;
};

// OK when [offset, offset + bytes) lies inside a pool of `pool_bytes`
// bytes (overflow-safe); else OutOfRange naming the range. For
// implementations of KvPoolMemory.
Status CheckKvPoolRange(uint64_t offset, uint64_t bytes, uint64_t pool_bytes);

// A host pool [base, base + bytes), owned by the caller and alive longer
// than the returned object. Copies are memcpy. REQUIRES: base != nullptr.
std::unique_ptr<KvPoolMemory> NewHostKvPoolMemory(void* base, uint64_t bytes);

// A pool in CUDA device `device`'s memory [base, base + bytes) (cudaMalloc,
// owned by the caller and alive longer than the returned object). Copies
// run on a private non-blocking stream of that device, each synchronized
// before it returns; they do not wait for other streams, so the caller must
// have synchronized the kernels that wrote the blocks being sent.
// Errors: InvalidArgument for a null base, zero bytes or a negative device;
// Unimplemented when Headway was built without CUDA; Unavailable when the
// device or its stream cannot be set up.
Result<std::unique_ptr<KvPoolMemory>> NewCudaKvPoolMemory(void* base, uint64_t bytes,
                                                          int device);

}  // namespace headway
