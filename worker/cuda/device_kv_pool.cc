#include "worker/cuda/device_kv_pool.h"

#include <climits>
#include <string>

#include "kernels/cuda/runtime.h"

namespace headway::cuda {

namespace {

// The device's facts, once `gpu_memory_utilization` is known to be a fraction.
Result<DeviceInfo> CheckedDevice(int device, double gpu_memory_utilization) {
  if (!(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0)) {
    return Status::InvalidArgument("gpu_memory_utilization " +
                                   std::to_string(gpu_memory_utilization) +
                                   " is not a fraction in (0, 1]");
  }
  return SetDevice(device);
}

int64_t BudgetOf(const DeviceInfo& info, double gpu_memory_utilization) {
  const double used = double(info.total_bytes - info.free_bytes);
  return int64_t(gpu_memory_utilization * double(info.total_bytes) - used);
}

}  // namespace

Result<int64_t> KvBudgetBytes(int device, double gpu_memory_utilization) {
  HW_ASSIGN_OR_RETURN(DeviceInfo info, CheckedDevice(device, gpu_memory_utilization));
  return BudgetOf(info, gpu_memory_utilization);
}

Result<std::unique_ptr<KvPool>> CreateDeviceKvPool(const KvArenaLayout& arena, int device,
                                                   double gpu_memory_utilization,
                                                   int64_t reserve_bytes) {
  if (std::string why = KvPool::CheckArena(arena); !why.empty()) {
    return Status::InvalidArgument(why);
  }
  HW_ASSIGN_OR_RETURN(DeviceInfo info, CheckedDevice(device, gpu_memory_utilization));
  const int64_t budget = BudgetOf(info, gpu_memory_utilization);
  const int64_t chunk_bytes = int64_t(arena.chunk_bytes);
  const int64_t num_chunks = std::min<int64_t>(
      KvPool::MaxChunks(arena), std::max<int64_t>(0, budget - reserve_bytes) / chunk_bytes);
  if (num_chunks < 1) {
    return Status::ResourceExhausted(
        "KV pool on cuda:" + std::to_string(device) + ": cache.gpu_memory_utilization " +
        std::to_string(gpu_memory_utilization) + " of " + std::to_string(info.total_bytes) +
        " bytes leaves no room for a " + (arena.mixed() ? "chunk" : "block") + " of " +
        std::to_string(chunk_bytes) + " bytes (" + std::to_string(info.free_bytes) +
        " bytes free, " + std::to_string(reserve_bytes) +
        " kept in reserve); raise it or free the GPU");
  }
  const size_t bytes = size_t(num_chunks) * size_t(chunk_bytes);
  HW_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(bytes));
  HW_RETURN_IF_ERROR(Memset(buffer.data(), 0, bytes, nullptr));
  HW_RETURN_IF_ERROR(Synchronize(nullptr, "zeroing the KV pool"));
  auto owner = std::make_shared<DeviceBuffer>(std::move(buffer));
  uint8_t* data = owner->as<uint8_t>();
  return KvPool::WrapDeviceMemory(arena, int(num_chunks), data, device, std::move(owner));
}

Result<std::unique_ptr<KvPool>> CreateDeviceKvPool(const KvCacheLayout& layout, int device,
                                                   double gpu_memory_utilization,
                                                   int64_t reserve_bytes) {
  if (std::string why = layout.Check(); !why.empty()) {
    return Status::InvalidArgument("KV pool: " + why);
  }
  return CreateDeviceKvPool(KvPool::OneClassArena(layout), device, gpu_memory_utilization,
                            reserve_bytes);
}

}  // namespace headway::cuda
