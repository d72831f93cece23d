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
  HW_ASSIGN_OR_RETURN(std::unique_ptr<KvTransferAgent> agent,
                      KvTransferAgent::Create(std::move(memory), pool->layout().BlockBytes(),
                                              uint32_t(pool->num_blocks()), transfer_options));
  spdlog::info("KV transfer: {} blocks of {} bytes in {} memory, memory path \"{}\"",
               pool->num_blocks(), pool->layout().BlockBytes(),
               pool->on_device() ? "CUDA device " + std::to_string(pool->device()) : "host",
               agent->memory_path());
  const KvPeerInfo& info = agent->local_info();
  proto::KvEndpoint endpoint;
  endpoint.set_worker_address(info.worker_address);
  endpoint.set_block_bytes(info.block_bytes);
  endpoint.set_num_blocks(info.num_blocks);
  endpoint.set_layout_version(kKvBlockLayoutVersion);
  endpoint.set_dtype(KvCacheDtypeName(pool->layout().dtype));
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
                               std::chrono::milliseconds plan_timeout, uint64_t* written) {
  const uint64_t transfer_id = plan.transfer_id();
  const proto::KvEndpoint& peer = target.endpoint();
  const char* dtype = KvCacheDtypeName(pool_->layout().dtype);
  if (peer.layout_version() != kKvBlockLayoutVersion || peer.dtype() != dtype ||
      peer.block_bytes() != pool_->layout().BlockBytes()) {
    return Status::InvalidArgument(
        "receiver's KV layout (version " + std::to_string(peer.layout_version()) + ", dtype '" +
        peer.dtype() + "', " + std::to_string(peer.block_bytes()) +
        " bytes per block) differs from this pool's (version " +
        std::to_string(kKvBlockLayoutVersion) + ", '" + dtype + "', " +
        std::to_string(pool_->layout().BlockBytes()) + ")");
  }
  if (target.src_blocks_size() != target.dst_blocks_size()) {
    return Status::InvalidArgument(std::to_string(target.src_blocks_size()) +
                                   " source blocks but " +
                                   std::to_string(target.dst_blocks_size()) + " destinations");
  }
  const int n = target.src_blocks_size();
  std::vector<BlockCopy> copies(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    copies[size_t(i)] = BlockCopy{target.src_blocks(i), target.dst_blocks(i)};
    // Checked here for the whole list, as the target may go out in two
    // writes (inject_stall): a bad id must send nothing at all.
    if (copies[size_t(i)].src >= uint32_t(pool_->num_blocks()) ||
        copies[size_t(i)].dst >= peer.num_blocks()) {
      return Status::OutOfRange("copy " + std::to_string(copies[size_t(i)].src) + " -> " +
                                std::to_string(copies[size_t(i)].dst) + " outside pools of " +
                                std::to_string(pool_->num_blocks()) + " (local) and " +
                                std::to_string(peer.num_blocks()) + " (receiver) blocks");
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

  // Writes copies [begin, end) within the time left.
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
    *written += end - begin;
    return Status::Ok();
  };

  if (inject_stall_.count() == 0) return write(0, copies.size());
  const size_t first = (copies.size() + 1) / 2;
  HW_RETURN_IF_ERROR(write(0, first));
  spdlog::warn("injected fault: transfer {} stalls {} ms after {} of {} blocks", transfer_id,
               inject_stall_.count(), first, n);
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
  uint64_t blocks = 0;
  for (int t = 0; t < plan.targets_size(); ++t) {
    Status s = Left(deadline).count() == 0
                   ? Status::Unavailable("plan timed out: its " + std::to_string(timeout.count()) +
                                         " ms timeout ran out before this target")
                   : ExecuteTarget(plan, plan.targets(t), deadline, timeout, &blocks);
    if (!s.ok()) {
      result.set_error("transfer " + std::to_string(plan.transfer_id()) + " target " +
                       std::to_string(t) + ": " + s.ToString());
      result.set_code(StatusCodeToProto(s.code()));
      break;
    }
  }
  result.set_blocks(blocks);
  result.set_bytes(blocks * pool_->layout().BlockBytes());
  result.set_seconds(std::chrono::duration<double>(Clock::now() - start).count());
  return result;
}

}  // namespace headway
