#include "worker/kv_sender.h"

#include <chrono>
#include <string>

namespace headway {

namespace {
constexpr const char* kDtype = "f32";
constexpr std::chrono::milliseconds kDefaultTimeout(5000);
}  // namespace

Result<std::unique_ptr<KvSender>> KvSender::Create(KvPool* pool, const TpShard& shard,
                                                   const std::string& transports) {
  KvTransferOptions options;
  options.transports = transports;
  HW_ASSIGN_OR_RETURN(std::unique_ptr<KvTransferAgent> agent,
                      KvTransferAgent::Create(pool->data(), pool->layout().BlockBytes(),
                                              uint32_t(pool->num_blocks()), options));
  const KvPeerInfo& info = agent->local_info();
  proto::KvEndpoint endpoint;
  endpoint.set_worker_address(info.worker_address);
  endpoint.set_rkey(info.rkey);
  endpoint.set_base_address(info.base_address);
  endpoint.set_block_bytes(info.block_bytes);
  endpoint.set_num_blocks(info.num_blocks);
  endpoint.set_layout_version(kKvBlockLayoutVersion);
  endpoint.set_dtype(kDtype);
  for (int h = shard.kv_head_begin; h < shard.kv_head_end; ++h) endpoint.add_kv_heads(uint32_t(h));
  return std::unique_ptr<KvSender>(new KvSender(pool, std::move(agent), std::move(endpoint)));
}

KvSender::KvSender(KvPool* pool, std::unique_ptr<KvTransferAgent> agent,
                   proto::KvEndpoint endpoint)
    : pool_(pool), agent_(std::move(agent)), endpoint_(std::move(endpoint)) {}

Status KvSender::ExecuteTarget(const proto::TransferTarget& target,
                               std::chrono::milliseconds timeout) {
  const proto::KvEndpoint& peer = target.endpoint();
  if (peer.layout_version() != kKvBlockLayoutVersion || peer.dtype() != kDtype ||
      peer.block_bytes() != pool_->layout().BlockBytes()) {
    return Status::InvalidArgument(
        "receiver's KV layout (version " + std::to_string(peer.layout_version()) + ", dtype '" +
        peer.dtype() + "', " + std::to_string(peer.block_bytes()) +
        " bytes per block) differs from this pool's (version " +
        std::to_string(kKvBlockLayoutVersion) + ", '" + kDtype + "', " +
        std::to_string(pool_->layout().BlockBytes()) + ")");
  }
  if (target.src_blocks_size() != target.dst_blocks_size()) {
    return Status::InvalidArgument(std::to_string(target.src_blocks_size()) +
                                   " source blocks but " +
                                   std::to_string(target.dst_blocks_size()) + " destinations");
  }
  KvPeerInfo info;
  info.worker_address = peer.worker_address();
  info.rkey = peer.rkey();
  info.base_address = peer.base_address();
  info.block_bytes = peer.block_bytes();
  info.num_blocks = peer.num_blocks();
  HW_ASSIGN_OR_RETURN(int handle, agent_->Connect(info));
  std::vector<BlockCopy> copies(size_t(target.src_blocks_size()));
  for (int i = 0; i < target.src_blocks_size(); ++i) {
    copies[size_t(i)] = BlockCopy{target.src_blocks(i), target.dst_blocks(i)};
  }
  return agent_->WriteBlocks(handle, copies, timeout);
}

proto::TransferResult KvSender::Execute(const proto::TransferPlan& plan, int tp_rank) {
  const auto start = std::chrono::steady_clock::now();
  proto::TransferResult result;
  result.set_transfer_id(plan.transfer_id());
  result.set_tp_rank(uint32_t(tp_rank));
  const std::chrono::milliseconds timeout =
      plan.timeout_ms() > 0 ? std::chrono::milliseconds(plan.timeout_ms()) : kDefaultTimeout;
  uint64_t blocks = 0;
  for (int t = 0; t < plan.targets_size(); ++t) {
    Status s = ExecuteTarget(plan.targets(t), timeout);
    if (!s.ok()) {
      result.set_error("transfer " + std::to_string(plan.transfer_id()) + " target " +
                       std::to_string(t) + ": " + s.ToString());
      break;
    }
    blocks += uint64_t(plan.targets(t).src_blocks_size());
  }
  result.set_blocks(blocks);
  result.set_bytes(blocks * pool_->layout().BlockBytes());
  result.set_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return result;
}

}  // namespace headway
