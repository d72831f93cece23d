#include "comm/ucx_transfer_agent.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include <spdlog/spdlog.h>

namespace headway {

// A fixed set of equal host buffers (KvPoolMemory::AllocateStaging: pinned
// for a device pool), handed out by slot. A slot is taken before a staged
// message is copied out of the pool and returned when UCX has finished
// sending it (the send's completion, not its ack).
class KvStagingBuffers {
 public:
  static Result<std::shared_ptr<KvStagingBuffers>> Create(const KvPoolMemory& memory, int count,
                                                          uint64_t buffer_bytes) {
    auto staging = std::make_shared<KvStagingBuffers>();
    staging->buffer_bytes_ = buffer_bytes;
    for (int i = 0; i < count; ++i) {
      HW_ASSIGN_OR_RETURN(std::shared_ptr<uint8_t> buffer, memory.AllocateStaging(buffer_bytes));
      staging->buffers_.push_back(std::move(buffer));
      staging->free_slots_.push_back(i);
    }
    return staging;
  }

  uint64_t buffer_bytes() const { return buffer_bytes_; }
  uint8_t* data(int slot) const { return buffers_[size_t(slot)].get(); }

  // A free slot, or -1 when all are in flight.
  int TryAcquire() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_slots_.empty()) return -1;
    const int slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }

  void Release(int slot) {
    std::lock_guard<std::mutex> lock(mu_);
    HW_CHECK(slot >= 0 && size_t(slot) < buffers_.size());
    free_slots_.push_back(slot);
  }

 private:
  // Constant after Create.
  uint64_t buffer_bytes_ = 0;
  std::vector<std::shared_ptr<uint8_t>> buffers_;

  std::mutex mu_;
  std::vector<int> free_slots_;  // guarded by mu_
};

namespace {

using Clock = std::chrono::steady_clock;

// The progress thread re-checks stop_ at least this often even when no event
// arrives (ucp_worker_signal normally wakes it at once).
constexpr int kIdleWaitMs = 50;
// Sleep between progress rounds when the transports give no event fd.
constexpr auto kIdleSleep = std::chrono::microseconds(500);
// How long the destructor drives a force-close before giving up on it.
constexpr auto kCloseTimeout = std::chrono::seconds(2);

// Active-message ids of the block messages and their acks (per worker; no
// other user of this agent's worker).
//
// Why not ucp_put_nbx: with UCX 1.13 and the transports Headway runs on
// (tcp, sm = posix/sysv, cma) UCP has no RMA lane for a user-allocated pool
// (TCP's memory domain gives put_zcopy only, never selected for ucp_put,
// with or without peer error handling or UCX_PROTO_ENABLE; posix/sysv
// cannot register user memory; `ucp_ep_print_info` shows no RMA lane), so
// it emulates every put with an active message: the TARGET runs
// ucp_put_handler, copies the data and sends a completion back with
// ucp_rma_sw_send_cmpl -> ucp_request_send. Two UCX bugs then take the
// receiver down when its sender dies mid-transfer:
//  - TCP: ucp_request_try_send treats every error but "no resource" as
//    fatal (ucp_request.inl:346: "Fatal: unexpected error: Endpoint
//    timeout", from ucp_put_handler <- uct_tcp_iface_progress). The first
//    completion send to the dead sender fails the endpoint and the next put
//    still in the socket buffer aborts the process (openucx/ucx#7274 reports
//    the same abort; no UCX setting avoids it).
//  - Shared memory: completions to the dead sender queue up (its FIFO is
//    never drained); ucp_worker_destroy purges them and crashes
//    (SIGSEGV in ucp_mem_rereg_mds <- ucp_request_memory_dereg <-
//    ucp_request_send_state_ff <- uct_mm_ep_pending_purge), the family of
//    openucx/ucx#8094.
// Block messages are copied by OnBlocksMessage, and its ack is an ordinary
// send request: it completes with an error status when the sender is gone
// and is purged like any user request.
constexpr unsigned kAmIdBlocks = 0x4b56;
constexpr unsigned kAmIdAck = 0x4b57;
// Largest block message: bounds the receiver's reassembly buffer (UCX
// collects a multi-fragment eager message whole before the handler runs).
constexpr uint64_t kMaxMessageBytes = 256 * 1024;
// Staging buffers of a staged pool, kMaxMessageBytes each (so 2 MiB of
// pinned memory): enough messages in flight to keep a link busy while the
// next one is copied out of the device.
constexpr int kMaxStagingBuffers = 8;

// Header of a block message (both ends on the same architecture: the
// header travels as raw bytes). 56 bytes:
//   0  dst_offset   u64  bytes from the receiver's pool start
//   8  write_id     u64  the sender's WriteBlocks call, echoed in the ack
//  16  transfer_id  u64  -+
//  24  lifetime_ms  u32   | the grant range holding the message's bytes
//  28  first_block  u32   | (comm/kv_write_auth.h); the tag covers these
//  32  num_blocks   u32   | four fields
//  36  reserved     u32   | (0)
//  40  tag          u8[16]-+
struct BlocksHeader {
  uint64_t dst_offset;
  uint64_t write_id;
  uint64_t transfer_id;
  uint32_t lifetime_ms;
  uint32_t first_block;
  uint32_t num_blocks;
  uint32_t reserved;
  KvWriteTag tag;
};
static_assert(sizeof(BlocksHeader) == 56);

// What an ack says about its message.
enum AckResult : uint64_t {
  kAckCopyFailed = 0,  // the receiver's copy into its pool failed
  kAckStored = 1,      // the bytes are in the receiver's pool
  kAckRefused = 2,     // the grant did not admit the message: nothing stored
};

// Header of an ack: the write's id and an AckResult.
struct AckHeader {
  uint64_t write_id;
  uint64_t result;
};

// Refusals are logged at most this often (the rest are counted).
constexpr auto kRefusalLogInterval = std::chrono::seconds(1);

// What a block message's send callback needs; freed by it. `status` points
// into the AmWrite that `keep_alive` holds. A staged message also holds its
// staging slot, returned here.
struct BlocksSend {
  BlocksHeader header;
  std::shared_ptr<void> keep_alive;
  std::atomic<int>* status;
  std::shared_ptr<KvStagingBuffers> staging;  // null unless staged
  int staging_slot = -1;
};

// Returns a finished send's staging slot and frees its state.
void FinishBlocksSend(BlocksSend* send) {
  if (send->staging != nullptr) send->staging->Release(send->staging_slot);
  delete send;
}

void OnBlocksSent(void* request, ucs_status_t status, void* user_data) {
  auto* send = static_cast<BlocksSend*>(user_data);
  int expected = UCS_OK;
  if (status != UCS_OK) send->status->compare_exchange_strong(expected, status);
  FinishBlocksSend(send);
  ucp_request_free(request);
}

void OnAckSent(void* request, ucs_status_t /*status*/, void* user_data) {
  delete static_cast<AckHeader*>(user_data);
  ucp_request_free(request);
}

// Whether this UCX can address CUDA memory (a CUDA transport is loaded).
bool UcxSupportsCuda(ucp_context_h context) {
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context, &attr) != UCS_OK) return false;
  return (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

Status CheckGeometry(uint64_t block_bytes, uint32_t num_blocks) {
  if (block_bytes == 0 || num_blocks == 0) {
    return Status::InvalidArgument("KV transfer: block_bytes and num_blocks must be > 0, got " +
                                   std::to_string(block_bytes) + " and " +
                                   std::to_string(num_blocks));
  }
  if (block_bytes > UINT64_MAX / num_blocks) {
    return Status::InvalidArgument("KV transfer: pool size overflows 64 bits");
  }
  return Status::Ok();
}

std::string UcxError(const char* what, ucs_status_t status) {
  return std::string(what) + ": " + ucs_status_string(status);
}

// Reads the UCX config (UCX_* environment variables, as UCX always does)
// and applies `transports` as UCX_TLS, `net_devices` as UCX_NET_DEVICES and
// `tcp_seg_size` as UCX_TCP_TX_SEG_SIZE and UCX_TCP_RX_SEG_SIZE.
Result<ucp_context_h> InitContext(const std::string& transports, const std::string& net_devices,
                                  const std::string& tcp_seg_size, uint64_t features) {
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) return Status::Unavailable(UcxError("ucp_config_read", status));
  if (!transports.empty()) {
    status = ucp_config_modify(config, "TLS", transports.c_str());
    if (status != UCS_OK) {
      ucp_config_release(config);
      return Status::Unavailable(
          UcxError(("UCX transports \"" + transports + "\" rejected").c_str(), status));
    }
  }
  if (!net_devices.empty()) {
    status = ucp_config_modify(config, "NET_DEVICES", net_devices.c_str());
    if (status != UCS_OK) {
      ucp_config_release(config);
      return Status::Unavailable(
          UcxError(("UCX network devices \"" + net_devices + "\" rejected").c_str(), status));
    }
  }
  // Keys that ucp's own table lacks are kept by ucp_config_modify and set,
  // by their name in the transport's table (TX_SEG_SIZE, not
  // TCP_TX_SEG_SIZE), on every interface config that has them (only tcp's)
  // when the worker opens its interfaces; an unusable value fails there, an
  // unparsable one is skipped.
  for (const char* key : {"TX_SEG_SIZE", "RX_SEG_SIZE"}) {
    if (tcp_seg_size.empty()) break;
    status = ucp_config_modify(config, key, tcp_seg_size.c_str());
    if (status != UCS_OK) {
      ucp_config_release(config);
      return Status::Unavailable(
          UcxError(("UCX TCP segment size \"" + tcp_seg_size + "\" rejected").c_str(), status));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = features;
  ucp_context_h context = nullptr;
  status = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (status != UCS_OK) {
    const std::string devices =
        net_devices.empty() ? std::string() : " on network devices \"" + net_devices + "\"";
    return Status::Unavailable(
        UcxError(("ucp_init with transports \"" + transports + "\"" + devices).c_str(), status));
  }
  return context;
}

Result<ucp_worker_h> InitWorker(ucp_context_h context, const std::string& transports) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_MULTI;
  ucp_worker_h worker = nullptr;
  ucs_status_t status = ucp_worker_create(context, &params, &worker);
  if (status != UCS_OK) {
    return Status::Unavailable(
        UcxError(("ucp_worker_create with transports \"" + transports + "\"").c_str(), status));
  }
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
  if (ucp_worker_query(worker, &attr) == UCS_OK && attr.thread_mode != UCS_THREAD_MODE_MULTI) {
    ucp_worker_destroy(worker);
    return Status::Unavailable("UCX worker is not thread-safe (UCX built without MT support)");
  }
  return worker;
}

}  // namespace

Result<std::unique_ptr<KvTransferAgent>> KvTransferAgent::Create(
    void* pool, uint64_t block_bytes, uint32_t num_blocks, const KvTransferOptions& options) {
  if (pool == nullptr) return Status::InvalidArgument("KV transfer: pool is null");
  HW_RETURN_IF_ERROR(CheckGeometry(block_bytes, num_blocks));
  return UcxTransferAgent::Create(NewHostKvPoolMemory(pool, block_bytes * num_blocks),
                                  block_bytes, num_blocks, options);
}

Result<std::unique_ptr<KvTransferAgent>> KvTransferAgent::Create(
    std::unique_ptr<KvPoolMemory> memory, uint64_t block_bytes, uint32_t num_blocks,
    const KvTransferOptions& options) {
  return UcxTransferAgent::Create(std::move(memory), block_bytes, num_blocks, options);
}

Result<std::unique_ptr<KvTransferAgent>> UcxTransferAgent::Create(
    std::unique_ptr<KvPoolMemory> memory, uint64_t block_bytes, uint32_t num_blocks,
    const KvTransferOptions& options) {
  if (memory == nullptr || memory->base() == nullptr) {
    return Status::InvalidArgument("KV transfer: pool is null");
  }
  HW_RETURN_IF_ERROR(CheckGeometry(block_bytes, num_blocks));
  if (memory->bytes() < block_bytes * num_blocks) {
    return Status::InvalidArgument("KV transfer: pool memory of " +
                                   std::to_string(memory->bytes()) + " bytes cannot hold " +
                                   std::to_string(num_blocks) + " blocks of " +
                                   std::to_string(block_bytes) + " bytes");
  }
  if (options.max_outstanding_messages < 1) {
    return Status::InvalidArgument("KV transfer: max_outstanding_messages must be >= 1, got " +
                                   std::to_string(options.max_outstanding_messages));
  }
  HW_ASSIGN_OR_RETURN(std::string write_key, NewKvWriteKey());
  std::unique_ptr<UcxTransferAgent> agent(
      new UcxTransferAgent(std::move(memory), block_bytes, num_blocks, options));
  agent->write_key_ = std::move(write_key);
  HW_RETURN_IF_ERROR(agent->Init());
  return std::unique_ptr<KvTransferAgent>(std::move(agent));
}

UcxTransferAgent::UcxTransferAgent(std::unique_ptr<KvPoolMemory> memory, uint64_t block_bytes,
                                   uint32_t num_blocks, const KvTransferOptions& options)
    : memory_(std::move(memory)),
      pool_(static_cast<uint8_t*>(memory_->base())),
      block_bytes_(block_bytes),
      num_blocks_(num_blocks),
      options_(options) {}

const char* UcxTransferAgent::memory_path() const {
  switch (memory_path_) {
    case MemoryPath::kHost:
      return "host";
    case MemoryPath::kStaged:
      return "staged";
    case MemoryPath::kDirect:
      return "direct";
  }
  return "unknown";
}

Status UcxTransferAgent::MapMemory() {
  const uint64_t pool_bytes = block_bytes_ * num_blocks_;
  ucp_mem_map_params_t map_params{};
  map_params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  if (memory_->host_accessible()) {
    memory_path_ = MemoryPath::kHost;
    map_params.address = pool_;
    map_params.length = pool_bytes;
    const ucs_status_t status = ucp_mem_map(context_, &map_params, &memh_);
    if (status != UCS_OK) {
      return Status::Unavailable(UcxError("ucp_mem_map of the KV pool", status));
    }
    return Status::Ok();
  }
  if (memory_->cuda_device() >= 0 && UcxSupportsCuda(context_)) {
    ucp_mem_map_params_t cuda_params = map_params;
    cuda_params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    cuda_params.address = pool_;
    cuda_params.length = pool_bytes;
    cuda_params.memory_type = UCS_MEMORY_TYPE_CUDA;
    HW_RETURN_IF_ERROR(memory_->BindCallingThread());
    const ucs_status_t status = ucp_mem_map(context_, &cuda_params, &memh_);
    if (status == UCS_OK) {
      memory_path_ = MemoryPath::kDirect;
      return Status::Ok();
    }
    memh_ = nullptr;
    spdlog::warn("KV transfer: UCX reports CUDA support but cannot map the device {} pool ({}); "
                 "staging through host memory instead",
                 memory_->cuda_device(), ucs_status_string(status));
  }
  // Staged: UCX never sees the pool, only the staging buffers.
  memory_path_ = MemoryPath::kStaged;
  const int count = std::min(kMaxStagingBuffers, options_.max_outstanding_messages);
  HW_ASSIGN_OR_RETURN(staging_, KvStagingBuffers::Create(*memory_, count, kMaxMessageBytes));
  return Status::Ok();
}

Status UcxTransferAgent::Init() {
  // WAKEUP gives the progress thread an fd to sleep on; should a transport
  // set refuse it, run without and let the thread poll with short sleeps.
  constexpr uint64_t kFeatures = UCP_FEATURE_AM;
  const KvTransferOptions& o = options_;
  auto context =
      InitContext(o.transports, o.net_devices, o.tcp_seg_size, kFeatures | UCP_FEATURE_WAKEUP);
  bool wakeup = context.ok();
  if (!wakeup) context = InitContext(o.transports, o.net_devices, o.tcp_seg_size, kFeatures);
  if (!context.ok()) return context.status();
  context_ = *context;

  auto worker = InitWorker(context_, options_.transports);
  if (!worker.ok()) return worker.status();
  worker_ = *worker;

  for (const auto& [id, callback] : {std::pair{kAmIdBlocks, &UcxTransferAgent::OnBlocksMessage},
                                     std::pair{kAmIdAck, &UcxTransferAgent::OnAckMessage}}) {
    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                         UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    handler.id = id;
    handler.flags = UCP_AM_FLAG_WHOLE_MSG;
    handler.cb = callback;
    handler.arg = this;
    ucs_status_t status = ucp_worker_set_am_recv_handler(worker_, &handler);
    if (status != UCS_OK) {
      return Status::Unavailable(UcxError("ucp_worker_set_am_recv_handler", status));
    }
  }

  HW_RETURN_IF_ERROR(MapMemory());

  ucp_address_t* address = nullptr;
  size_t address_size = 0;
  const ucs_status_t status = ucp_worker_get_address(worker_, &address, &address_size);
  if (status != UCS_OK) return Status::Unavailable(UcxError("ucp_worker_get_address", status));
  local_info_.worker_address.assign(reinterpret_cast<const char*>(address), address_size);
  ucp_worker_release_address(worker_, address);

  local_info_.block_bytes = block_bytes_;
  local_info_.num_blocks = num_blocks_;

  int event_fd = -1;
  if (wakeup && ucp_worker_get_efd(worker_, &event_fd) == UCS_OK) {
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    epoll_event event{};
    event.events = EPOLLIN;
    if (epoll_fd_ >= 0 && epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd, &event) != 0) {
      close(epoll_fd_);
      epoll_fd_ = -1;
    }
  }
  progress_thread_ = std::thread([this] { ProgressLoop(); });
  return Status::Ok();
}

UcxTransferAgent::~UcxTransferAgent() {
  if (progress_thread_.joinable()) {
    stop_.store(true);
    ucp_worker_signal(worker_);
    progress_thread_.join();
  }
  for (auto& peer : peers_) ClosePeer(peer.get());
  if (memh_ != nullptr) ucp_mem_unmap(context_, memh_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

void UcxTransferAgent::ProgressLoop() {
  // Block messages are copied into a device pool on this thread.
  Status bound = memory_->BindCallingThread();
  if (!bound.ok()) spdlog::warn("KV transfer progress thread: {}", bound.ToString());
  while (!stop_.load(std::memory_order_relaxed)) {
    while (ucp_worker_progress(worker_) != 0) {
    }
    if (epoll_fd_ >= 0) {
      ucs_status_t status = ucp_worker_arm(worker_);
      if (status == UCS_ERR_BUSY) continue;  // events arrived meanwhile
      if (status == UCS_OK) {
        epoll_event event;
        epoll_wait(epoll_fd_, &event, 1, kIdleWaitMs);
        continue;
      }
    }
    std::this_thread::sleep_for(kIdleSleep);
  }
}

void UcxTransferAgent::OnEndpointError(void* arg, ucp_ep_h /*ep*/, ucs_status_t /*status*/) {
  static_cast<Peer*>(arg)->failed.store(true);
}

ucs_status_t UcxTransferAgent::OnBlocksMessage(void* arg, const void* header,
                                               size_t header_length, void* data, size_t length,
                                               const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransferAgent*>(arg);
  // Senders force eager messages, so `data` holds the bytes; anything else
  // (malformed, rendezvous) is refused unacked and its sender times out.
  if (header_length != sizeof(BlocksHeader)) {
    self->RefuseBlocks("a header of the wrong size");
    return UCS_OK;
  }
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    self->RefuseBlocks("rendezvous (not eager) data");
    return UCS_OK;
  }
  BlocksHeader blocks;
  std::memcpy(&blocks, header, sizeof(blocks));
  const char* why = nullptr;
  AckResult result = kAckRefused;
  if (self->AdmitBlocks(header, length, &why)) {
    // A host pool: memcpy; a device pool (any path): a synchronized copy to
    // the device, so the ack below means the bytes are in the pool.
    const Status stored = self->memory_->CopyFromHost(blocks.dst_offset, data, length);
    if (!stored.ok()) {
      spdlog::error("KV transfer: storing a received message: {}", stored.ToString());
    }
    result = stored.ok() ? kAckStored : kAckCopyFailed;
  } else {
    self->RefuseBlocks(why);
  }
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep == nullptr) {
    return UCS_OK;
  }
  // The ack's header must live until its send completes.
  auto* ack = new AckHeader{blocks.write_id, result};
  ucp_request_param_t params{};
  params.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_AM_SEND_FLAG_EAGER;
  params.cb.send = &OnAckSent;
  params.user_data = ack;
  // A dead sender fails this send with a status (or completes it with one);
  // either way nothing else happens here.
  ucs_status_ptr_t request =
      ucp_am_send_nbx(param->reply_ep, kAmIdAck, ack, sizeof(*ack), nullptr, 0, &params);
  if (!UCS_PTR_IS_PTR(request)) delete ack;
  return UCS_OK;
}

bool UcxTransferAgent::AdmitBlocks(const void* header, size_t length, const char** why) {
  BlocksHeader blocks;
  std::memcpy(&blocks, header, sizeof(blocks));
  // The tag first: nothing an unauthenticated message says reaches the
  // transfer window.
  if (!VerifyKvWriteRange(write_key_, blocks.transfer_id, blocks.lifetime_ms, blocks.first_block,
                          blocks.num_blocks, blocks.tag)) {
    *why = "no valid grant";
    return false;
  }
  // Blocks [first_block, first_block + num_blocks) of this pool, in bytes;
  // 64-bit sums of 32-bit ids cannot overflow.
  const uint64_t range_end_block = uint64_t(blocks.first_block) + blocks.num_blocks;
  if (range_end_block > num_blocks_) {
    *why = "a grant beyond the pool";
    return false;
  }
  const uint64_t begin = uint64_t(blocks.first_block) * block_bytes_;
  const uint64_t end = range_end_block * block_bytes_;
  if (blocks.dst_offset < begin || blocks.dst_offset > end || length > end - blocks.dst_offset) {
    *why = "bytes outside the blocks its grant covers";
    return false;
  }
  std::lock_guard<std::mutex> lock(window_mu_);
  if (!window_.Admit(blocks.transfer_id, blocks.lifetime_ms, Clock::now())) {
    *why = "an expired transfer (a replay)";
    return false;
  }
  return true;
}

void UcxTransferAgent::RefuseBlocks(const char* why) {
  const uint64_t total = refused_.fetch_add(1) + 1;
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(window_mu_);
  if (now - last_refusal_log_ < kRefusalLogInterval) {
    ++refusals_not_logged_;
    return;
  }
  // UCX's worker-address endpoints do not report the peer's address
  // (ucp_ep_query gives socket addresses only for listener endpoints).
  spdlog::warn("KV transfer: refused a block message with {} (sender's address unknown to UCX); "
               "{} refused in all, {} more since the last such line",
               why, total, refusals_not_logged_);
  last_refusal_log_ = now;
  refusals_not_logged_ = 0;
}

ucs_status_t UcxTransferAgent::OnAckMessage(void* arg, const void* header, size_t header_length,
                                            void* /*data*/, size_t /*length*/,
                                            const ucp_am_recv_param_t* /*param*/) {
  auto* self = static_cast<UcxTransferAgent*>(arg);
  if (header_length != sizeof(AckHeader)) return UCS_OK;
  AckHeader ack;
  std::memcpy(&ack, header, sizeof(ack));
  std::lock_guard<std::mutex> lock(self->am_writes_mu_);
  auto it = self->am_writes_.find(ack.write_id);
  if (it != self->am_writes_.end()) {
    // Set before counting, so a writer that sees the count sees the refusal.
    if (ack.result == kAckRefused) {
      it->second->refused.store(true);
    } else if (ack.result != kAckStored) {
      it->second->rejected.store(true);
    }
    it->second->acked.fetch_add(1);
  }
  return UCS_OK;  // an ack of a finished (timed out) write is dropped
}

Status UcxTransferAgent::OpenPeer(Peer* peer) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(peer->info.worker_address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxTransferAgent::OnEndpointError;
  params.err_handler.arg = peer;
  peer->failed.store(false);
  ucs_status_t status = UCS_ERR_UNREACHABLE;
  if (!peer_error_mode_refused_) status = ucp_ep_create(worker_, &params, &peer->ep);
  if (status != UCS_OK) {
    // UCX 1.13's shared-memory transports have no peer-failure handling and
    // refuse PEER mode; there only the timeout bounds a write to a dead peer.
    peer_error_mode_refused_ = true;
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    status = ucp_ep_create(worker_, &params, &peer->ep);
  }
  if (status != UCS_OK) {
    peer->ep = nullptr;
    return Status::Unavailable(UcxError("ucp_ep_create to KV peer", status));
  }
  return Status::Ok();
}

void UcxTransferAgent::ClosePeer(Peer* peer) {
  if (peer->ep == nullptr) return;
  // FORCE: do not wait for a peer that may be gone.
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* request = ucp_ep_close_nbx(peer->ep, &params);
  if (UCS_PTR_IS_PTR(request)) Wait(request, Clock::now() + kCloseTimeout);
  peer->ep = nullptr;
}

Result<int> UcxTransferAgent::Connect(const KvPeerInfo& peer) {
  if (peer.block_bytes != block_bytes_) {
    return Status::InvalidArgument("KV transfer: peer block_bytes " +
                                   std::to_string(peer.block_bytes) + " != local " +
                                   std::to_string(block_bytes_));
  }
  if (peer.worker_address.empty()) {
    return Status::InvalidArgument("KV transfer: peer info lacks worker_address");
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peer_by_address_.find(peer.worker_address);
  if (it != peer_by_address_.end()) {
    Peer* existing = peers_[it->second].get();
    std::lock_guard<std::mutex> peer_lock(existing->mu);
    if (existing->ep != nullptr && !existing->failed.load()) return it->second;
    // The endpoint failed (peer restarted or gone): rebuild it.
    ClosePeer(existing);
    existing->info = peer;
    HW_RETURN_IF_ERROR(OpenPeer(existing));
    return it->second;
  }
  auto fresh = std::make_unique<Peer>();
  fresh->info = peer;
  HW_RETURN_IF_ERROR(OpenPeer(fresh.get()));
  const int handle = static_cast<int>(peers_.size());
  peers_.push_back(std::move(fresh));
  peer_by_address_[peer.worker_address] = handle;
  return handle;
}

ucs_status_t UcxTransferAgent::Wait(void* request, Clock::time_point deadline) {
  ucs_status_t status;
  while ((status = ucp_request_check_status(request)) == UCS_INPROGRESS) {
    if (Clock::now() >= deadline) {
      ucp_request_cancel(worker_, request);
      status = UCS_ERR_TIMED_OUT;
      break;
    }
    if (ucp_worker_progress(worker_) == 0) std::this_thread::yield();
  }
  ucp_request_free(request);  // released by UCX once done, if still in flight
  return status;
}

Result<std::vector<UcxTransferAgent::MessageRange>> UcxTransferAgent::PlanMessages(
    const std::vector<BlockCopy>& copies, const KvWriteGrant& grant, uint64_t max_bytes) const {
  // The grant's ranges by first block, to find the one holding a block.
  std::vector<const KvWriteRange*> by_first;
  by_first.reserve(grant.ranges.size());
  for (const KvWriteRange& range : grant.ranges) by_first.push_back(&range);
  std::sort(by_first.begin(), by_first.end(),
            [](const KvWriteRange* a, const KvWriteRange* b) {
              return a->first_block < b->first_block;
            });
  auto covers = [](const KvWriteRange* range, uint32_t block) {
    return block >= range->first_block && block - range->first_block < range->num_blocks;
  };
  auto range_of = [&](uint32_t block) -> const KvWriteRange* {
    auto it = std::upper_bound(
        by_first.begin(), by_first.end(), block,
        [](uint32_t b, const KvWriteRange* range) { return b < range->first_block; });
    if (it == by_first.begin() || !covers(*(it - 1), block)) return nullptr;
    return *(it - 1);
  };
  std::vector<MessageRange> messages;
  messages.reserve(copies.size());
  for (size_t i = 0; i < copies.size();) {
    const KvWriteRange* range = range_of(copies[i].dst);
    if (options_.TEST_label_all_with_first_range && !grant.ranges.empty()) {
      range = &grant.ranges.front();
    }
    if (range == nullptr) {
      return Status::FailedPrecondition("KV transfer: destination block " +
                                        std::to_string(copies[i].dst) + " lies in no range of "
                                        "transfer " + std::to_string(grant.transfer_id) +
                                        "'s grant");
    }
    size_t run = 1;
    if (options_.coalesce_runs) {
      while (i + run < copies.size() && copies[i + run].src == copies[i].src + run &&
             copies[i + run].dst == copies[i].dst + run &&
             (options_.TEST_label_all_with_first_range || covers(range, copies[i + run].dst))) {
        ++run;
      }
    }
    const uint64_t src = copies[i].src * block_bytes_;
    const uint64_t dst = copies[i].dst * block_bytes_;
    const uint64_t bytes = run * block_bytes_;
    for (uint64_t done = 0; done < bytes;) {
      const uint64_t piece = std::min(max_bytes, bytes - done);
      messages.push_back({src + done, dst + done, piece, range});
      done += piece;
    }
    i += run;
  }
  return messages;
}

ucs_status_t UcxTransferAgent::WriteByActiveMessages(Peer* peer, const KvWriteGrant& grant,
                                                     const std::vector<MessageRange>& messages,
                                                     Clock::time_point deadline,
                                                     Status* copy_error, bool* refused) {
  auto write = std::make_shared<AmWrite>();
  const uint64_t write_id = next_write_id_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(am_writes_mu_);
    am_writes_[write_id] = write;
  }
  uint64_t sent = 0;
  // Drives the worker until `done()`; stops early on a failed endpoint or
  // send, a refused message or the deadline.
  auto drive_until = [&](auto&& done) -> ucs_status_t {
    while (true) {
      if (write->refused.load()) {
        *refused = true;
        return UCS_ERR_REJECTED;
      }
      if (write->rejected.load()) return UCS_ERR_REJECTED;
      if (done()) return UCS_OK;
      if (peer->failed.load()) return UCS_ERR_CONNECTION_RESET;
      const int send_status = write->send_status.load();
      if (send_status != UCS_OK) return static_cast<ucs_status_t>(send_status);
      if (Clock::now() >= deadline) return UCS_ERR_TIMED_OUT;
      if (ucp_worker_progress(worker_) == 0) std::this_thread::yield();
    }
  };
  // Drives the worker until at most `max_unacked` messages await their ack.
  auto wait_for_acks = [&](uint64_t max_unacked) {
    return drive_until([&] { return sent - write->acked.load() <= max_unacked; });
  };
  const bool staged = memory_path_ == MemoryPath::kStaged;
  ucs_status_t failure = UCS_OK;
  for (const MessageRange& message : messages) {
    failure = wait_for_acks(static_cast<uint64_t>(options_.max_outstanding_messages) - 1);
    if (failure != UCS_OK) break;
    // Header and callback state live on the heap: a send still in flight
    // when this call gives up completes (and frees them) later.
    BlocksHeader header{message.dst_offset,        write_id,
                        grant.transfer_id,         grant.lifetime_ms,
                        message.range->first_block, message.range->num_blocks,
                        0,                         message.range->tag};
    auto* send = new BlocksSend{header, write, &write->send_status, nullptr, -1};
    const void* data = nullptr;
    if (staged) {
      // A slot frees when one of this agent's sends completes.
      int slot = -1;
      failure = drive_until([&] { return (slot = staging_->TryAcquire()) >= 0; });
      if (failure != UCS_OK) {
        delete send;
        break;
      }
      send->staging = staging_;
      send->staging_slot = slot;
      HW_CHECK(message.bytes <= staging_->buffer_bytes());
      Status copied =
          memory_->CopyToHost(message.src_offset, staging_->data(slot), message.bytes);
      if (!copied.ok()) {
        FinishBlocksSend(send);
        *copy_error = std::move(copied);
        failure = UCS_ERR_IO_ERROR;
        break;
      }
      data = staging_->data(slot);
    } else {
      data = pool_ + message.src_offset;
    }
    ucp_request_param_t params{};
    params.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    // EAGER: the receiver never starts a rendezvous, so it never sends on
    // UCX's behalf; REPLY: its handler gets an endpoint for the ack.
    params.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
    params.cb.send = &OnBlocksSent;
    params.user_data = send;
    if (memory_path_ == MemoryPath::kDirect) {
      params.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
      params.memory_type = UCS_MEMORY_TYPE_CUDA;
    }
    ucs_status_ptr_t request = ucp_am_send_nbx(peer->ep, kAmIdBlocks, &send->header,
                                               sizeof(send->header), data, message.bytes, &params);
    // Not a request: done (or failed) at once and the callback never runs.
    if (!UCS_PTR_IS_PTR(request)) FinishBlocksSend(send);
    if (UCS_PTR_IS_ERR(request)) {
      failure = UCS_PTR_STATUS(request);
      break;
    }
    ++sent;
  }
  if (failure == UCS_OK) failure = wait_for_acks(0);
  std::lock_guard<std::mutex> lock(am_writes_mu_);
  am_writes_.erase(write_id);
  return failure;
}

Status UcxTransferAgent::WriteBlocks(int peer_handle, const std::vector<BlockCopy>& copies,
                                     const KvWriteGrant& grant,
                                     std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  Peer* peer = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (peer_handle < 0 || static_cast<size_t>(peer_handle) >= peers_.size()) {
      return Status::InvalidArgument("KV transfer: unknown peer handle " +
                                     std::to_string(peer_handle));
    }
    peer = peers_[peer_handle].get();
  }
  // Check every id before the first message: a bad list sends nothing.
  for (const BlockCopy& copy : copies) {
    if (copy.src >= num_blocks_ || copy.dst >= peer->info.num_blocks) {
      return Status::OutOfRange("KV transfer: copy " + std::to_string(copy.src) + " -> " +
                                std::to_string(copy.dst) + " outside pools of " +
                                std::to_string(num_blocks_) + " (local) and " +
                                std::to_string(peer->info.num_blocks) + " (peer) blocks");
    }
  }
  if (copies.empty()) return Status::Ok();
  HW_ASSIGN_OR_RETURN(std::vector<MessageRange> messages,
                      PlanMessages(copies, grant, kMaxMessageBytes));

  std::lock_guard<std::mutex> peer_lock(peer->mu);
  if (peer->ep == nullptr || peer->failed.load()) {
    return Status::Unavailable("KV transfer: endpoint to peer failed; Connect again");
  }
  if (memory_path_ == MemoryPath::kDirect) {
    // UCX reads the device pool on this thread.
    HW_RETURN_IF_ERROR(memory_->BindCallingThread());
  }
  Status copy_error;
  bool refused = false;
  const ucs_status_t failure =
      WriteByActiveMessages(peer, grant, messages, deadline, &copy_error, &refused);
  if (failure == UCS_ERR_IO_ERROR && !copy_error.ok()) {
    return Status::Unavailable("KV transfer: copying blocks out of the pool: " +
                               copy_error.message());
  }
  if (refused) {
    return Status::FailedPrecondition(
        "KV transfer: the receiver refused transfer " + std::to_string(grant.transfer_id) +
        "'s grant (not made with its write key, expired, or not covering the blocks)");
  }
  if (failure == UCS_ERR_REJECTED) {
    return Status::Aborted(
        "KV transfer: the receiver could not store the blocks in its pool (see its log)");
  }
  if (peer->failed.load()) {
    return Status::Unavailable(
        "KV transfer: endpoint to peer failed (peer gone or unreachable); Connect again");
  }
  if (failure == UCS_ERR_TIMED_OUT) {
    return Status::Unavailable("KV transfer: " + std::to_string(copies.size()) +
                               " blocks not written within " + std::to_string(timeout.count()) +
                               " ms");
  }
  if (failure != UCS_OK) {
    return Status::Unavailable(UcxError("KV transfer: write to peer failed", failure));
  }
  return Status::Ok();
}

}  // namespace headway
