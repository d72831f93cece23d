// The KV block pool of a CUDA rank, in device memory, sized the way vLLM's
// gpu_memory_utilization is: the worker may use that fraction of the GPU's
// total memory in all, and the pool gets what is left of it once the
// weights and step buffers are allocated (so create it after the model).
#pragma once

#include <memory>

#include "common/kv_arena.h"
#include "common/kv_layout.h"
#include "common/status.h"
#include "worker/kv_pool.h"

namespace headway::cuda {

// Bytes the pool may take on `device`: utilization * total - (total - free),
// i.e. the share of the GPU left after everything already allocated on it
// (by this process and others). Errors: InvalidArgument for a bad device
// or utilization outside (0, 1]; Unavailable from the runtime.
Result<int64_t> KvBudgetBytes(int device, double gpu_memory_utilization);

// A zeroed pool of the whole chunks of `arena` (common/kv_arena.h) that fit
// in KvBudgetBytes (less `reserve_bytes` kept free for cuBLAS and the
// runtime), at most KvPool::MaxChunks(arena). Errors: InvalidArgument when a
// class's layout fails Check(); those of KvBudgetBytes; ResourceExhausted
// when not one chunk fits (the message names cache.gpu_memory_utilization,
// the GPU's total and free memory) or the allocation fails.
Result<std::unique_ptr<KvPool>> CreateDeviceKvPool(const KvArenaLayout& arena, int device,
                                                   double gpu_memory_utilization,
                                                   int64_t reserve_bytes = int64_t(256) << 20);
// The same for blocks of one `layout` (a chunk is a block).
Result<std::unique_ptr<KvPool>> CreateDeviceKvPool(const KvCacheLayout& layout, int device,
                                                   double gpu_memory_utilization,
                                                   int64_t reserve_bytes = int64_t(256) << 20);

}  // namespace headway::cuda
