#include "comm/ucx_transfer_agent.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

namespace headway {
namespace {

using Clock = std::chrono::steady_clock;

// The progress thread re-checks stop_ at least this often even when no event
// arrives (ucp_worker_signal normally wakes it at once).
constexpr int kIdleWaitMs = 50;
// Sleep between progress rounds when the transports give no event fd.
constexpr auto kIdleSleep = std::chrono::microseconds(500);
// How long the destructor drives a force-close before giving up on it.
constexpr auto kCloseTimeout = std::chrono::seconds(2);

std::string UcxError(const char* what, ucs_status_t status) {
  return std::string(what) + ": " + ucs_status_string(status);
}

// Reads the UCX config (UCX_* environment variables, as UCX always does)
// and applies `transports` as UCX_TLS.
Result<ucp_context_h> InitContext(const std::string& transports, uint64_t features) {
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
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = features;
  ucp_context_h context = nullptr;
  status = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (status != UCS_OK) {
    return Status::Unavailable(
        UcxError(("ucp_init with transports \"" + transports + "\"").c_str(), status));
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
  return UcxTransferAgent::Create(pool, block_bytes, num_blocks, options);
}

Result<std::unique_ptr<KvTransferAgent>> UcxTransferAgent::Create(
    void* pool, uint64_t block_bytes, uint32_t num_blocks, const KvTransferOptions& options) {
  if (pool == nullptr) return Status::InvalidArgument("KV transfer: pool is null");
  if (block_bytes == 0 || num_blocks == 0) {
    return Status::InvalidArgument("KV transfer: block_bytes and num_blocks must be > 0, got " +
                                   std::to_string(block_bytes) + " and " +
                                   std::to_string(num_blocks));
  }
  if (block_bytes > UINT64_MAX / num_blocks) {
    return Status::InvalidArgument("KV transfer: pool size overflows 64 bits");
  }
  if (options.max_outstanding_puts < 1) {
    return Status::InvalidArgument("KV transfer: max_outstanding_puts must be >= 1, got " +
                                   std::to_string(options.max_outstanding_puts));
  }
  std::unique_ptr<UcxTransferAgent> agent(
      new UcxTransferAgent(pool, block_bytes, num_blocks, options));
  HW_RETURN_IF_ERROR(agent->Init());
  return std::unique_ptr<KvTransferAgent>(std::move(agent));
}

UcxTransferAgent::UcxTransferAgent(void* pool, uint64_t block_bytes, uint32_t num_blocks,
                                   const KvTransferOptions& options)
    : pool_(static_cast<uint8_t*>(pool)),
      block_bytes_(block_bytes),
      num_blocks_(num_blocks),
      options_(options) {}

Status UcxTransferAgent::Init() {
  // WAKEUP gives the progress thread an fd to sleep on; should a transport
  // set refuse it, run without and let the thread poll with short sleeps.
  auto context = InitContext(options_.transports, UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP);
  bool wakeup = context.ok();
  if (!wakeup) context = InitContext(options_.transports, UCP_FEATURE_RMA);
  if (!context.ok()) return context.status();
  context_ = *context;

  auto worker = InitWorker(context_, options_.transports);
  if (!worker.ok()) return worker.status();
  worker_ = *worker;

  ucp_mem_map_params_t map_params{};
  map_params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  map_params.address = pool_;
  map_params.length = block_bytes_ * num_blocks_;
  ucs_status_t status = ucp_mem_map(context_, &map_params, &memh_);
  if (status != UCS_OK) return Status::Unavailable(UcxError("ucp_mem_map of the KV pool", status));

  void* rkey_buffer = nullptr;
  size_t rkey_size = 0;
  status = ucp_rkey_pack(context_, memh_, &rkey_buffer, &rkey_size);
  if (status != UCS_OK) return Status::Unavailable(UcxError("ucp_rkey_pack", status));
  local_info_.rkey.assign(static_cast<const char*>(rkey_buffer), rkey_size);
  ucp_rkey_buffer_release(rkey_buffer);

  ucp_address_t* address = nullptr;
  size_t address_size = 0;
  status = ucp_worker_get_address(worker_, &address, &address_size);
  if (status != UCS_OK) return Status::Unavailable(UcxError("ucp_worker_get_address", status));
  local_info_.worker_address.assign(reinterpret_cast<const char*>(address), address_size);
  ucp_worker_release_address(worker_, address);

  local_info_.base_address = reinterpret_cast<uint64_t>(pool_);
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
  status = ucp_ep_rkey_unpack(peer->ep, peer->info.rkey.data(), &peer->rkey);
  if (status != UCS_OK) {
    peer->rkey = nullptr;
    ClosePeer(peer);
    return Status::Unavailable(UcxError("ucp_ep_rkey_unpack of KV peer's rkey", status));
  }
  return Status::Ok();
}

void UcxTransferAgent::ClosePeer(Peer* peer) {
  if (peer->rkey != nullptr) ucp_rkey_destroy(peer->rkey);
  peer->rkey = nullptr;
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
  if (peer.worker_address.empty() || peer.rkey.empty()) {
    return Status::InvalidArgument("KV transfer: peer info lacks worker_address or rkey");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const std::string key = peer.worker_address + peer.rkey;
  auto it = peer_by_key_.find(key);
  if (it != peer_by_key_.end()) {
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
  peer_by_key_[key] = handle;
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

std::vector<UcxTransferAgent::PutRange> UcxTransferAgent::PlanPuts(
    const std::vector<BlockCopy>& copies) const {
  std::vector<PutRange> puts;
  puts.reserve(copies.size());
  for (size_t i = 0; i < copies.size();) {
    size_t run = 1;
    if (options_.coalesce_runs) {
      while (i + run < copies.size() && copies[i + run].src == copies[i].src + run &&
             copies[i + run].dst == copies[i].dst + run) {
        ++run;
      }
    }
    puts.push_back({copies[i].src * block_bytes_, copies[i].dst * block_bytes_,
                    run * block_bytes_});
    i += run;
  }
  return puts;
}

Status UcxTransferAgent::WriteBlocks(int peer_handle, const std::vector<BlockCopy>& copies,
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
  // Check every id before the first put: a bad list sends nothing.
  for (const BlockCopy& copy : copies) {
    if (copy.src >= num_blocks_ || copy.dst >= peer->info.num_blocks) {
      return Status::OutOfRange("KV transfer: copy " + std::to_string(copy.src) + " -> " +
                                std::to_string(copy.dst) + " outside pools of " +
                                std::to_string(num_blocks_) + " (local) and " +
                                std::to_string(peer->info.num_blocks) + " (peer) blocks");
    }
  }
  if (copies.empty()) return Status::Ok();

  std::lock_guard<std::mutex> peer_lock(peer->mu);
  if (peer->ep == nullptr || peer->failed.load()) {
    return Status::Unavailable("KV transfer: endpoint to peer failed; Connect again");
  }
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
  params.memh = memh_;

  std::vector<void*> in_flight;
  in_flight.reserve(options_.max_outstanding_puts);
  ucs_status_t failure = UCS_OK;
  // Frees completed requests; records the first failure.
  auto reap = [&] {
    for (size_t j = 0; j < in_flight.size();) {
      ucs_status_t status = ucp_request_check_status(in_flight[j]);
      if (status == UCS_INPROGRESS) {
        ++j;
        continue;
      }
      if (status != UCS_OK && failure == UCS_OK) failure = status;
      ucp_request_free(in_flight[j]);
      in_flight[j] = in_flight.back();
      in_flight.pop_back();
    }
  };

  for (const PutRange& put : PlanPuts(copies)) {
    while (static_cast<int>(in_flight.size()) >= options_.max_outstanding_puts &&
           failure == UCS_OK) {
      if (Clock::now() >= deadline) {
        failure = UCS_ERR_TIMED_OUT;
        break;
      }
      if (ucp_worker_progress(worker_) == 0) std::this_thread::yield();
      reap();
    }
    if (failure != UCS_OK || peer->failed.load()) break;
    ucs_status_ptr_t request = ucp_put_nbx(peer->ep, pool_ + put.src_offset, put.bytes,
                                           peer->info.base_address + put.dst_offset, peer->rkey,
                                           &params);
    if (UCS_PTR_IS_ERR(request)) {
      failure = UCS_PTR_STATUS(request);
      break;
    }
    if (request != nullptr) in_flight.push_back(request);
  }

  if (failure == UCS_OK && !peer->failed.load()) {
    // Remote completion: the flush returns once every put above has landed.
    ucp_request_param_t flush_params{};
    void* flush = ucp_ep_flush_nbx(peer->ep, &flush_params);
    if (UCS_PTR_IS_ERR(flush)) {
      failure = UCS_PTR_STATUS(flush);
    } else if (flush != nullptr) {
      failure = Wait(flush, deadline);
    }
  }
  reap();
  for (void* request : in_flight) {
    ucp_request_cancel(worker_, request);
    ucp_request_free(request);
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
    return Status::Unavailable(UcxError("KV transfer: put or flush to peer failed", failure));
  }
  return Status::Ok();
}

}  // namespace headway
