// The worker's side of KV transfer: publishes where its block pool can be
// written (proto KvEndpoint) and executes the coordinator's TransferPlans
// with the UCX agent (comm/kv_transfer.h).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/kv_transfer.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "proto/control.pb.h"
#include "worker/kv_pool.h"

namespace headway {

struct KvSenderOptions {
  // UCX transports (UCX_TLS syntax); "" = UCX's default.
  std::string transports;
  // UCX network devices (KvTransferOptions::net_devices); "" = UCX's choice.
  std::string net_devices;
  // UCX's TCP segment size (KvTransferOptions::tcp_seg_size); "" = UCX's.
  std::string tcp_seg_size;
  // Test-only fault injection (headway-worker reads it from the environment
  // variable HEADWAY_FAULT_TRANSFER_STALL_MS); 0 = off. When > 0, every
  // target of every plan writes its first ceil(n/2) blocks, logs a warning
  // "injected fault: transfer <id> stalls <ms> ms after <k> of <n> blocks",
  // sleeps this long (cut short at the plan's deadline, as a real stalled
  // write is by the timeout), then writes the rest within the time left; with
  // none left the plan fails as timed out. Lets tests stall a transfer
  // mid-way without a broken network.
  std::chrono::milliseconds inject_stall{0};
};

// Thread-safety: Execute may run on any one thread at a time (the worker's
// transfer thread); endpoint() is immutable after Create.
class KvSender {
 public:
  // Maps `pool` (which must outlive the sender) for UCX with
  // options.transports; a pool on a CUDA device goes by the agent's staged
  // or direct path (comm/kv_transfer.h; logged, and memory_path()).
  // `shard` gives the KV heads this rank publishes. The agent and the
  // endpoint address the pool in granules (KvArenaLayout::granule_bytes: a
  // block with one dtype); a plan's target says how many make one of its
  // blocks (TransferTarget.granules_per_block).
  // Errors: InvalidArgument for a negative inject_stall or a pool of more
  // than 2^32 granules; for a device pool
  // those of NewCudaKvPoolMemory (Unimplemented in a build without CUDA);
  // those of KvTransferAgent::Create.
  static Result<std::unique_ptr<KvSender>> Create(KvPool* pool, const TpShard& shard,
                                                  const KvSenderOptions& options);

  // This rank's endpoint for its RegisterRequest.
  const proto::KvEndpoint& endpoint() const { return endpoint_; }

  // The pool's write key for its RegisterRequest (kv_write_key): for the
  // coordinator only (KvTransferAgent::write_key).
  const std::string& write_key() const { return agent_->write_key(); }

  // How the pool's bytes reach UCX: "host", "staged" or "direct".
  const char* memory_path() const { return agent_->memory_path(); }

  // Writes every target's blocks, in order, and returns the result to send
  // (tp_rank; bytes and blocks written, including those of a target that
  // failed part-way; seconds; on failure `error` naming the transfer and
  // target, and `code`, the failed write's StatusCode). The whole plan is
  // bounded by its timeout_ms (0 = 5000 ms):
  // each target gets the time left, and a plan whose time runs out fails
  // with an error saying the transfer timed out. Errors reported in the
  // result: a target whose layout differs from this pool's (block bytes,
  // layout version, dtype), src/dst lists of different lengths, block ids
  // out of range or a write range whose tag is not 16 bytes (nothing of
  // that target is sent), destinations the target's write_ranges do not
  // cover and a receiver that refuses them (FailedPrecondition), UCX
  // failures, the timeout. Targets after a failed one are not sent. The timeout counts
  // from `received`, when the plan reached this worker (time spent queued
  // behind other plans counts: the coordinator's deadline runs from sending).
  proto::TransferResult Execute(const proto::TransferPlan& plan, int tp_rank,
                                std::chrono::steady_clock::time_point received);

 private:
  using Deadline = std::chrono::steady_clock::time_point;

  KvSender(KvPool* pool, std::unique_ptr<KvTransferAgent> agent, proto::KvEndpoint endpoint,
           std::chrono::milliseconds inject_stall);
  // Writes `target`'s blocks before `deadline` (the plan's, whose timeout
  // was `plan_timeout`); adds the blocks that landed to `*written` and
  // their bytes to `*bytes`.
  Status ExecuteTarget(const proto::TransferPlan& plan, const proto::TransferTarget& target,
                       Deadline deadline, std::chrono::milliseconds plan_timeout,
                       uint64_t* written, uint64_t* bytes);

  KvPool* const pool_;
  const std::unique_ptr<KvTransferAgent> agent_;
  const proto::KvEndpoint endpoint_;
  const std::chrono::milliseconds inject_stall_;
};

}  // namespace headway
