#include "worker/kv_sender.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include <spdlog/spdlog.h>

#include "comm/status_proto.h"

namespace headway {

namespace {
using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kDefaultTimeout(5000);

// Whole milliseconds left before `deadline` (0 once passed): WriteBlocks
// takes milliseconds, and rounding down keeps every write inside the plan.
std::chrono::milliseconds Left(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(0),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

Status TimedOut(std::chrono::milliseconds timeout, uint64_t written, int total) {
  return Status::Unavailable("plan timed out: its " + std::to_string(timeout.count()) +
                             " ms timeout ran out with " + std::to_string(written) + " of " +
                             std::to_string(total) + " blocks of this target written");
}
}  // namespace

Result<std::unique_ptr<KvSender>> KvSender::Create(KvPool* pool, const TpShard& shard,
                                                   const KvSenderOptions& options) {
  if (options.inject_stall.count() < 0) {
    return Status::InvalidArgument("KV sender: inject_stall must be >= 0 ms, got " +
                                   std::to_string(options.inject_stall.count()));
  }
  KvTransferOptions transfer_options;
  transfer_options.transports = options.transports;
  transfer_options.net_devices = options.net_devices;
  transfer_options.tcp_seg_size = options.tcp_seg_size;
  std::unique_ptr<KvPoolMemory> memory;
  if (pool->on_device()) {
    HW_ASSIGN_OR_RETURN(memory,
                        NewCudaKvPoolMemory(pool->data(), pool->num_bytes(), pool->device()));
  } else {
    memory = NewHostKvPoolMemory(pool->data(), pool->num_bytes());
  }
  // The agent addresses the arena in granules: a block with one dtype, a
  // common divisor of both block sizes with two (common/kv_arena.h).
  const uint64_t granule = pool->arena().granule_bytes;
  const uint64_t num_granules = pool->num_bytes() / granule;
  if (num_granules > UINT32_MAX) {
    return Status::InvalidArgument("KV sender: " + std::to_string(num_granules) + " granules of " +
                                   std::to_string(granule) +
                                   " bytes do not fit 32-bit ids; lower cache.kv_memory_mb");
  }
  HW_ASSIGN_OR_RETURN(std::unique_ptr<KvTransferAgent> agent,
                      KvTransferAgent::Create(std::move(memory), granule, uint32_t(num_granules),
                                              transfer_options));
  spdlog::info("KV transfer: {} granules of {} bytes in {} memory, memory path \"{}\"",
               num_granules, granule,
               pool->on_device() ? "CUDA device " + std::to_string(pool->device()) : "host",
               agent->memory_path());
  const KvPeerInfo& info = agent->local_info();
  proto::KvEndpoint endpoint;
  endpoint.set_worker_address(info.worker_address);
  endpoint.set_block_bytes(info.block_bytes);
  endpoint.set_num_blocks(info.num_blocks);
  endpoint.set_layout_version(kKvBlockLayoutVersion);
  endpoint.set_dtype(KvCacheDtypeName(pool->layout().dtype));
  endpoint.set_dtype_sliding(KvCacheDtypeName(pool->arena().dtypes.sliding));
  for (int h = shard.kv_head_begin; h < shard.kv_head_end; ++h) endpoint.add_kv_heads(uint32_t(h));
  return std::unique_ptr<KvSender>(
      new KvSender(pool, std::move(agent), std::move(endpoint), options.inject_stall));
}

KvSender::KvSender(KvPool* pool, std::unique_ptr<KvTransferAgent> agent,
                   proto::KvEndpoint endpoint, std::chrono::milliseconds inject_stall)
    : pool_(pool),
      agent_(std::move(agent)),
      endpoint_(std::move(endpoint)),
      inject_stall_(inject_stall) {}

Status KvSender::ExecuteTarget(const proto::TransferPlan& plan,
                               const proto::TransferTarget& target, Deadline deadline,
                               std::chrono::milliseconds plan_timeout, uint64_t* written,
                               uint64_t* bytes) {
  const uint64_t transfer_id = plan.transfer_id();
  const proto::KvEndpoint& peer = target.endpoint();
  const KvArenaLayout& arena = pool_->arena();
  const char* dtype = KvCacheDtypeName(pool_->layout().dtype);
  const char* dtype_sliding = KvCacheDtypeName(arena.dtypes.sliding);
  // An older receiver names no sliding dtype: it can only hold one block size.
  const bool sliding_matches = peer.dtype_sliding().empty()
                                   ? !arena.mixed()
                                   : peer.dtype_sliding() == dtype_sliding;
  if (peer.layout_version() != kKvBlockLayoutVersion || peer.dtype() != dtype ||
      !sliding_matches || peer.block_bytes() != arena.granule_bytes) {
    return Status::InvalidArgument(
        "receiver's KV layout (version " + std::to_string(peer.layout_version()) + ", dtype '" +
        peer.dtype() + "', sliding dtype '" + peer.dtype_sliding() + "', " +
        std::to_string(peer.block_bytes()) +
        "-byte granules) differs from this pool's (version " +
        std::to_string(kKvBlockLayoutVersion) + ", '" + dtype + "', '" + dtype_sliding + "', " +
        std::to_string(arena.granule_bytes) + ")");
  }
  if (target.src_blocks_size() != target.dst_blocks_size()) {
    return Status::InvalidArgument(std::to_string(target.src_blocks_size()) +
                                   " source blocks but " +
                                   std::to_string(target.dst_blocks_size()) + " destinations");
  }
  // Each block is `per_block` granules of the arena (common/kv_arena.h);
  // the agent moves granules and merges consecutive ones into messages.
  const uint64_t per_block = std::max<uint32_t>(1, target.granules_per_block());
  const uint64_t local_granules = pool_->num_bytes() / arena.granule_bytes;
  const int n = target.src_blocks_size();
  std::vector<BlockCopy> copies;
  copies.reserve(size_t(n) * per_block);
  for (int i = 0; i < n; ++i) {
    const uint64_t src = uint64_t(target.src_blocks(i)) * per_block;
    const uint64_t dst = uint64_t(target.dst_blocks(i)) * per_block;
    // Checked here for the whole list, as the target may go out in two
    // writes (inject_stall): a bad id must send nothing at all.
    if (src + per_block > local_granules || dst + per_block > peer.num_blocks()) {
      return Status::OutOfRange("copy " + std::to_string(target.src_blocks(i)) + " -> " +
                                std::to_string(target.dst_blocks(i)) + " of " +
                                std::to_string(per_block) + " granules outside pools of " +
                                std::to_string(local_granules) + " (local) and " +
                                std::to_string(peer.num_blocks()) + " (receiver) granules");
    }
    for (uint64_t j = 0; j < per_block; ++j) {
      copies.push_back(BlockCopy{uint32_t(src + j), uint32_t(dst + j)});
    }
  }
  KvWriteGrant grant;
  grant.transfer_id = transfer_id;
  grant.lifetime_ms = plan.write_lifetime_ms();
  for (const proto::KvWriteRange& r : target.write_ranges()) {
    if (r.tag().size() != kKvWriteTagBytes) {
      return Status::InvalidArgument("write range at block " + std::to_string(r.first_block()) +
                                     " has a " + std::to_string(r.tag().size()) +
                                     "-byte tag, must have " + std::to_string(kKvWriteTagBytes));
    }
    KvWriteRange range;
    range.first_block = r.first_block();
    range.num_blocks = r.num_blocks();
    std::memcpy(range.tag.data(), r.tag().data(), kKvWriteTagBytes);
    grant.ranges.push_back(range);
  }
  KvPeerInfo info;
  info.worker_address = peer.worker_address();
  info.block_bytes = peer.block_bytes();
  info.num_blocks = peer.num_blocks();
  HW_ASSIGN_OR_RETURN(int handle, agent_->Connect(info));

  // Writes copies [begin, end) (whole blocks) within the time left.
  const uint64_t written_before = *written;
  auto write = [&](size_t begin, size_t end) -> Status {
    if (begin == end) return Status::Ok();
    const std::chrono::milliseconds left = Left(deadline);
    if (left.count() == 0) return TimedOut(plan_timeout, *written - written_before, n);
    std::vector<BlockCopy> part(copies.begin() + long(begin), copies.begin() + long(end));
    Status s = agent_->WriteBlocks(handle, part, grant, left);
    if (!s.ok()) {
      // A write cut off by the plan's deadline is the plan timing out.
      if (Left(deadline).count() == 0) {
        return Status::Unavailable("plan timed out (" + std::to_string(plan_timeout.count()) +
                                   " ms timeout): " + s.message());
      }
      return s;
    }
    *written += (end - begin) / per_block;
    *bytes += (end - begin) * arena.granule_bytes;
    return Status::Ok();
  };

  if (inject_stall_.count() == 0) return write(0, copies.size());
  const size_t first = (size_t(n) + 1) / 2 * per_block;
  HW_RETURN_IF_ERROR(write(0, first));
  spdlog::warn("injected fault: transfer {} stalls {} ms after {} of {} blocks", transfer_id,
               inject_stall_.count(), first / per_block, n);
  std::this_thread::sleep_until(std::min(deadline, Clock::now() + inject_stall_));
  return write(first, copies.size());
}

proto::TransferResult KvSender::Execute(const proto::TransferPlan& plan, int tp_rank,
                                        Clock::time_point received) {
  const Clock::time_point start = Clock::now();
  proto::TransferResult result;
  result.set_transfer_id(plan.transfer_id());
  result.set_tp_rank(uint32_t(tp_rank));
  const std::chrono::milliseconds timeout =
      plan.timeout_ms() > 0 ? std::chrono::milliseconds(plan.timeout_ms()) : kDefaultTimeout;
  // One deadline for the whole plan, counted from its arrival: the
  // coordinator's own deadline runs from when it sent the plan, so time
  // spent queued behind other plans must count too.
  const Clock::time_point deadline = received + timeout;
  uint64_t blocks = 0, bytes = 0;
  for (int t = 0; t < plan.targets_size(); ++t) {
    Status s = Left(deadline).count() == 0
                   ? Status::Unavailable("plan timed out: its " + std::to_string(timeout.count()) +
                                         " ms timeout ran out before this target")
                   : ExecuteTarget(plan, plan.targets(t), deadline, timeout, &blocks, &bytes);
    if (!s.ok()) {
      result.set_error("transfer " + std::to_string(plan.transfer_id()) + " target " +
                       std::to_string(t) + ": " + s.ToString());
      result.set_code(StatusCodeToProto(s.code()));
      break;
    }
  }
  result.set_blocks(blocks);
  result.set_bytes(bytes);
  result.set_seconds(std::chrono::duration<double>(Clock::now() - start).count());
  return result;
}

}  // namespace headway
