// The worker's side of KV transfer: publishes where its block pool can be
// written (proto KvEndpoint) and executes the coordinator's TransferPlans
// with the UCX agent (comm/kv_transfer.h).
#pragma once

#include <memory>
#include <vector>

#include "comm/kv_transfer.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "proto/control.pb.h"
#include "worker/kv_pool.h"

namespace headway {

class KvSender {
 public:
  // Maps `pool` (which must outlive the sender) for UCX with `transports`
  // (UCX_TLS syntax; "" = UCX's default). `shard` gives the KV heads this
  // rank publishes. Errors: those of KvTransferAgent::Create.
  static Result<std::unique_ptr<KvSender>> Create(KvPool* pool, const TpShard& shard,
                                                  const std::string& transports);

  // This rank's endpoint for its RegisterRequest.
  const proto::KvEndpoint& endpoint() const { return endpoint_; }

  // Writes every target's blocks and returns the result to send (tp_rank,
  // bytes, blocks, seconds; `error` set on failure). Errors reported in the
  // result: a target whose layout differs from this pool's (block bytes,
  // layout version, dtype), src/dst lists of different lengths, block ids
  // out of range (nothing of that target is sent), UCX failures or the plan's
  // timeout (0 = 5000 ms).
  proto::TransferResult Execute(const proto::TransferPlan& plan, int tp_rank);

 private:
  KvSender(KvPool* pool, std::unique_ptr<KvTransferAgent> agent, proto::KvEndpoint endpoint);
  Status ExecuteTarget(const proto::TransferTarget& target, std::chrono::milliseconds timeout);

  KvPool* const pool_;
  const std::unique_ptr<KvTransferAgent> agent_;
  const proto::KvEndpoint endpoint_;
};

}  // namespace headway
