// The transport layer of KV transfer (DESIGN.md "A request, end to end"):
// moves whole KV blocks from this worker's block pool into a peer worker's
// pool as UCX active messages. It knows bytes and block ids only; which
// blocks go where (per slot, across TP sizes) is the coordinator's transfer
// plan, as in TensorRT-LLM's split of block manager / formatter / transport.
//
// Each agent publishes a KvPeerInfo (its UCX worker address and block
// geometry) through the coordinator. A sender connects to a receiver's
// KvPeerInfo and writes block lists as batched UCX active messages, each
// naming its destination as a byte offset into the receiver's pool, that the
// receiver's progress thread copies into its pool and acknowledges (not
// ucp_put_nbx: UCX 1.13 emulates puts on TCP and shared memory in a way that
// kills a receiver whose sender dies; see ucx_transfer_agent.h). When
// WriteBlocks returns OK the bytes are in the receiver's memory. A progress
// thread in every agent drives UCX for both roles (the receiver's handler
// runs there). Transports come from
// KvTransferOptions::transports (UCX_TLS syntax), e.g. "sm,self" on one
// host, "tcp" across hosts.
//
// Pools in device memory (comm/kv_pool_memory.h): where UCX reports CUDA
// memory support (ucp_context_query, UCP_ATTR_FIELD_MEMORY_TYPES) the agent
// maps the device range and hands device addresses to UCX ("direct");
// otherwise (Debian's UCX 1.13 has no CUDA transports) the sender copies each
// message from the device into pinned host staging buffers and sends from
// there, and the receiver copies each message into its device pool before
// acknowledging it ("staged"). memory_path() says which.
//
// Authorization: every block message carries a grant (comm/kv_write_auth.h)
// MACed with the receiver's write key, which the receiver gives only to
// the coordinator; a message whose grant does not verify, whose bytes lie
// outside the blocks the grant covers, or whose transfer has expired is
// refused before anything is copied: its sender's WriteBlocks fails with
// FailedPrecondition and the receiver counts it (refused_messages) and
// logs it, at most once a second.
//
// Faults: a peer process that dies or stalls mid-transfer never takes this
// process down (tests/comm/kv_transfer_fault_test.cc). A sender's write to
// a dead receiver fails with Unavailable, at the latest at its timeout; a
// receiver outlives a dead sender and serves new ones. One UCX limit
// remains: over shared memory (sm: posix/sysv), a sender killed while
// writing into the receiver's message FIFO can leave that FIFO blocked, so
// later shared-memory senders to that receiver time out (Unavailable).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/kv_pool_memory.h"
#include "comm/kv_write_auth.h"
#include "common/status.h"

namespace headway {

// What a receiver publishes so that senders can write into its pool.
struct KvPeerInfo {
  std::string worker_address;  // ucp_worker_get_address bytes
  uint64_t block_bytes = 0;    // bytes of one block (K and V)
  uint32_t num_blocks = 0;     // blocks in the pool
};

struct KvTransferOptions {
  // UCX transports (the UCX_TLS variable's syntax); "" = UCX's default.
  std::string transports;
  // The network devices UCX may use (the UCX_NET_DEVICES variable's syntax,
  // e.g. "eth0" or "lo"); "" = UCX_NET_DEVICES from the environment, else
  // every device. This is the only bind control UCX's worker-address
  // wire-up has: each network transport listens on every device it uses
  // (port chosen by UCX) and the worker address a receiver publishes
  // (KvPeerInfo::worker_address) carries those devices' own addresses,
  // which is what senders dial. An address that is not on one of this
  // host's interfaces (NAT, a load balancer) cannot be advertised; a UCX
  // listener (ucp_listener_create) with sockaddr connection establishment
  // could, and is not used.
  std::string net_devices;
  // UCX's TCP segment size for sends and receives (UCX_TCP_TX_SEG_SIZE and
  // UCX_TCP_RX_SEG_SIZE; UCX's memory-units syntax, e.g. "512k"); "" = those
  // variables from the environment, else UCX's defaults (8 KiB send, 64 KiB
  // receive). A send segment is the most a TCP active message carries in one
  // piece: 8 KiB splits each 256 KiB block message into 32 fragments, 512k
  // sends it whole (bench/README.md, over a veth link: 1.6x the bandwidth
  // with MTU 9000, 1.15x with 1500). A value overrides the environment's;
  // one UCX cannot use fails Create with Unavailable, one it cannot parse
  // is ignored.
  std::string tcp_seg_size;
  // Block messages sent and not yet acknowledged per WriteBlocks call
  // before it waits for acks; for a staged pool also bounds the staging
  // buffers (at most 8).
  int max_outstanding_messages = 256;
  // Sends a run of copies whose src and dst ids both step by one as the
  // fewest messages that hold run_length * block_bytes (each at most the
  // agent's message size, 256 KiB; fewer, larger messages, measured by
  // bench/kv_transfer_bench.cc). false = one message per block.
  bool coalesce_runs = true;
  // Test only: the sender labels every message with the grant's first range
  // whether or not that range holds the message's blocks, as a sender that
  // lies about its grant would, so that tests can check that receivers
  // refuse it. Never set outside tests.
  bool TEST_label_all_with_first_range = false;
};

// One copy: local block `src` -> the peer's block `dst`.
struct BlockCopy {
  uint32_t src = 0;
  uint32_t dst = 0;
};

// Thread-safety: all methods may be called from several threads at once.
class KvTransferAgent {
 public:
  // Maps `pool` ([num_blocks, block_bytes] bytes, owned by the caller and
  // alive longer than the agent) for UCX, draws the agent's write key and
  // starts the progress thread. Errors: InvalidArgument for a null pool,
  // zero sizes or max_outstanding_messages < 1;
  // Unavailable when UCX cannot start with the requested transports (the
  // message names them and UCX's status) or libsodium cannot start.
  static Result<std::unique_ptr<KvTransferAgent>> Create(void* pool, uint64_t block_bytes,
                                                         uint32_t num_blocks,
                                                         const KvTransferOptions& options);
  // As above over any pool memory (host or device; comm/kv_pool_memory.h),
  // which the agent owns; memory->bytes() must hold num_blocks blocks.
  // The memory path is chosen here (memory_path()). Errors as above, and
  // InvalidArgument for a null memory or one smaller than the blocks;
  // ResourceExhausted when the staging buffers cannot be allocated.
  static Result<std::unique_ptr<KvTransferAgent>> Create(std::unique_ptr<KvPoolMemory> memory,
                                                         uint64_t block_bytes,
                                                         uint32_t num_blocks,
                                                         const KvTransferOptions& options);
  virtual ~KvTransferAgent() = default;

  // How this agent's pool bytes reach UCX, for logs: "host" (a host pool,
  // handed to UCX as is), "staged" (copied through host staging buffers)
  // or "direct" (device memory handed to a CUDA-aware UCX). Static string.
  virtual const char* memory_path() const = 0;

  // This agent's description for peers.
  virtual const KvPeerInfo& local_info() const = 0;

  // The secret (kKvWriteKeyBytes random bytes, drawn by Create) that
  // grants to write into this agent's pool are MACed with. Give it to the
  // coordinator only, over the authenticated control channel; never to a
  // sender, which could then grant itself any block.
  virtual const std::string& write_key() const = 0;

  // Block messages this agent has refused as a receiver since Create (no
  // valid grant, bytes outside it, or an expired transfer).
  virtual uint64_t refused_messages() const = 0;

  // Connects to a receiver (once per receiver; cheap to repeat with the same
  // info: the endpoint is reused). Returns a peer handle for WriteBlocks.
  // Errors: InvalidArgument when the peer's block_bytes differs from ours
  // (layouts must match: a mismatch is refused here, not mid-transfer) or
  // its worker_address is empty; Unavailable when UCX cannot create the
  // endpoint.
  virtual Result<int> Connect(const KvPeerInfo& peer) = 0;

  // Writes every copy's block_bytes bytes from the local pool into the
  // peer's pool and returns once the peer's memory holds them (the receiver
  // has acknowledged every block message). `grant` is the coordinator's for
  // this transfer to this peer (GrantKvWrites with the peer's write key);
  // each message names the range of it that holds its destination blocks.
  // For a device pool, the kernels
  // that wrote the blocks must have finished (the copies do not wait for
  // other streams). Errors: OutOfRange for a block id outside either pool
  // (nothing is sent); FailedPrecondition for a destination no range of
  // `grant` covers (nothing is sent) and when the receiver refused a message
  // (a grant that does not verify under its key or has expired: a new
  // grant, i.e. a new transfer, is needed); Unavailable when a message
  // send, the endpoint or a copy out of a device pool fails or `timeout`
  // passes before every ack; Aborted when the receiver could not copy the
  // bytes into its pool (a device error there; retrying will not help).
  // After an error the peer's blocks are undefined.
  virtual Status WriteBlocks(int peer, const std::vector<BlockCopy>& copies,
                             const KvWriteGrant& grant, std::chrono::milliseconds timeout) = 0;
};

}  // namespace headway
