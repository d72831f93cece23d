// The UCX (ucp) implementation of KvTransferAgent; internal to comm/ so that
// ucp.h stays out of kv_transfer.h. Callers use KvTransferAgent::Create.
//
// One ucp_context (UCP_FEATURE_AM | UCP_FEATURE_WAKEUP) and one worker in
// UCS_THREAD_MODE_MULTI: the progress thread and WriteBlocks callers both
// call ucp_worker_progress. The progress thread sleeps on the worker's event
// fd (ucp_worker_arm + epoll) so an idle agent uses no CPU; where the
// transports give no event fd it falls back to a short sleep.
//
// Blocks move as UCX active messages: ucp_am_send_nbx of each run (at most
// kMaxMessageBytes each, forced eager) to the receiver, whose handler copies
// the bytes into its pool and answers with an ack message; WriteBlocks
// returns once every message is acked, i.e. the bytes are in the
// receiver's memory. Not ucp_put_nbx: UCX 1.13 emulates puts on TCP and
// shared memory with active messages whose receiver-side completion,
// sent by UCX itself, aborts the receiver (TCP) or crashes its shutdown
// (shared memory) when the sender has died (details in
// ucx_transfer_agent.cc, at kAmIdBlocks). The ack here is an ordinary send
// request, which just fails. A block message names its destination as an
// offset into the receiver's pool, so peers exchange no memory keys or
// addresses (KvPeerInfo), and the grant range that authorizes it
// (comm/kv_write_auth.h): the handler verifies the range's tag, that the
// bytes lie inside the range and that the transfer is fresh before it
// copies, and otherwise answers with a refusal.
//
// Endpoints use UCP_ERR_HANDLING_MODE_PEER so that a dead peer fails the
// writes (then WriteBlocks returns Unavailable) instead of aborting the
// process; a failed endpoint is rebuilt by the next Connect. Transports that
// cannot detect peer failure (UCX 1.13 shared memory) refuse that mode; their
// endpoints use UCP_ERR_HANDLING_MODE_NONE and a write to a dead peer ends by
// WriteBlocks' timeout.
//
// Memory paths (KvTransferAgent::memory_path): a host pool is mapped
// (ucp_mem_map) and sent from as is. A pool UCX cannot address is "staged":
// not mapped, each message is copied out of the pool into one of a few
// staging buffers and sent from there,
// the buffer returning to the free list when its send completes; the
// receiver's handler copies every message in through KvPoolMemory in all
// paths. "direct" maps device memory with UCS_MEMORY_TYPE_CUDA and sends
// from it, when UCX reports CUDA support.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/kv_transfer.h"

namespace headway {

// Host buffers that staged block messages are sent from (defined in the .cc;
// shared with the send callbacks, which may outlive a WriteBlocks call).
class KvStagingBuffers;

class UcxTransferAgent final : public KvTransferAgent {
 public:
  // As KvTransferAgent::Create.
  static Result<std::unique_ptr<KvTransferAgent>> Create(std::unique_ptr<KvPoolMemory> memory,
                                                         uint64_t block_bytes,
                                                         uint32_t num_blocks,
                                                         const KvTransferOptions& options);
  ~UcxTransferAgent() override;

  UcxTransferAgent(const UcxTransferAgent&) = delete;
  UcxTransferAgent& operator=(const UcxTransferAgent&) = delete;

  const KvPeerInfo& local_info() const override { return local_info_; }
  const std::string& write_key() const override { return write_key_; }
  uint64_t refused_messages() const override { return refused_.load(); }
  const char* memory_path() const override;
  Result<int> Connect(const KvPeerInfo& peer) override;
  Status WriteBlocks(int peer, const std::vector<BlockCopy>& copies, const KvWriteGrant& grant,
                     std::chrono::milliseconds timeout) override;

 private:
  // One receiver: the endpoint to its worker.
  struct Peer {
    KvPeerInfo info;
    ucp_ep_h ep = nullptr;
    // Set by UCX's endpoint error callback (from whichever thread progresses).
    std::atomic<bool> failed{false};
    // Held by WriteBlocks and by Connect while it rebuilds ep, so a rebuild
    // never pulls it from under a transfer.
    std::mutex mu;
  };

  // One block message: `bytes` from local offset `src_offset` to peer
  // offset `dst_offset`, inside the grant's range `range`.
  struct MessageRange {
    uint64_t src_offset;
    uint64_t dst_offset;
    uint64_t bytes;
    const KvWriteRange* range;
  };

  // One WriteBlocks call over active messages. Shared with the send
  // callbacks, which may outlive the call (a send cancelled by a timeout
  // completes later).
  struct AmWrite {
    std::atomic<uint64_t> acked{0};
    std::atomic<int> send_status{0};  // first failed send's ucs_status_t
    std::atomic<bool> rejected{false};  // an ack said the receiver's copy failed
    std::atomic<bool> refused{false};   // an ack said the receiver refused the grant
  };

  enum class MemoryPath { kHost, kStaged, kDirect };

  UcxTransferAgent(std::unique_ptr<KvPoolMemory> memory, uint64_t block_bytes,
                   uint32_t num_blocks, const KvTransferOptions& options);

  Status Init();
  // Picks memory_path_ and maps a pool UCX sends from (host, direct) into
  // memh_; a staged pool gets its staging buffers instead.
  Status MapMemory();
  void ProgressLoop();
  // Creates the endpoint of `peer` (field ep). REQUIRES: mu_ held.
  Status OpenPeer(Peer* peer);
  // Force-closes the endpoint. REQUIRES: mu_ held or
  // no other thread uses `peer`.
  void ClosePeer(Peer* peer);
  // Drives the worker until `request` completes or `deadline` passes; frees
  // the request either way. Returns UCX's status, or UCS_ERR_TIMED_OUT.
  ucs_status_t Wait(void* request, std::chrono::steady_clock::time_point deadline);
  // Splits `copies` into block messages, merging runs (inside one range of
  // `grant`) when options_.coalesce_runs and cutting each into pieces of at
  // most `max_bytes`. Errors: FailedPrecondition for a destination block
  // that no range of `grant` covers. The messages point into `grant`.
  Result<std::vector<MessageRange>> PlanMessages(const std::vector<BlockCopy>& copies,
                                                 const KvWriteGrant& grant,
                                                 uint64_t max_bytes) const;
  // Sends `messages` of `grant` (staged: through staging buffers) and waits
  // for their acks until `deadline`. Returns UCS_ERR_REJECTED when the
  // receiver could not store a message or refused one (then *refused is
  // set), UCS_ERR_IO_ERROR when copying out of the local pool failed (then
  // *copy_error says why).
  // REQUIRES: peer->mu held, peer usable, ids checked.
  ucs_status_t WriteByActiveMessages(Peer* peer, const KvWriteGrant& grant,
                                     const std::vector<MessageRange>& messages,
                                     std::chrono::steady_clock::time_point deadline,
                                     Status* copy_error, bool* refused);
  // Receiver side: whether a block message of `length` bytes at
  // `dst_offset` under the header's grant fields may be stored; else
  // counts and logs (rate-limited) the refusal. Sets *why to the reason.
  bool AdmitBlocks(const void* header, size_t length, const char** why);
  // Counts a refused block message and logs it at most once a second.
  void RefuseBlocks(const char* why);

  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  // Receiver side: copies a block message into the pool and acks it.
  static ucs_status_t OnBlocksMessage(void* arg, const void* header, size_t header_length,
                                      void* data, size_t length, const ucp_am_recv_param_t* param);
  // Sender side: counts an ack towards its AmWrite.
  static ucs_status_t OnAckMessage(void* arg, const void* header, size_t header_length,
                                   void* data, size_t length, const ucp_am_recv_param_t* param);

  // Constant after Init().
  const std::unique_ptr<KvPoolMemory> memory_;
  uint8_t* const pool_;  // memory_->base(); dereferenced only by memory_
  MemoryPath memory_path_ = MemoryPath::kHost;
  std::shared_ptr<KvStagingBuffers> staging_;  // kStaged only
  const uint64_t block_bytes_;
  const uint32_t num_blocks_;
  const KvTransferOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_mem_h memh_ = nullptr;  // null for a staged pool
  int epoll_fd_ = -1;  // watches the worker's event fd; -1 = sleep instead
  KvPeerInfo local_info_;
  std::string write_key_;  // kKvWriteKeyBytes random bytes
  std::thread progress_thread_;
  std::atomic<bool> stop_{false};

  // Guarded by mu_. Peers live until the agent dies (handles index peers_).
  std::mutex mu_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::map<std::string, int> peer_by_address_;  // worker_address -> handle
  // Set once an endpoint in UCP_ERR_HANDLING_MODE_PEER was refused (the
  // transports cannot detect peer failure): later endpoints skip the try.
  bool peer_error_mode_refused_ = false;

  // Active-message writes in progress, by write id (the acks name it).
  std::mutex am_writes_mu_;
  std::map<uint64_t, std::shared_ptr<AmWrite>> am_writes_;  // guarded by am_writes_mu_
  std::atomic<uint64_t> next_write_id_{1};

  // Receiver side: admitted transfers and refusals.
  std::atomic<uint64_t> refused_{0};
  std::mutex window_mu_;
  KvTransferWindow window_;  // guarded by window_mu_
  std::chrono::steady_clock::time_point last_refusal_log_{};  // guarded by window_mu_
  uint64_t refusals_not_logged_ = 0;                            // guarded by window_mu_
};

}  // namespace headway
