#include "comm/control_channel.h"

#include <spdlog/spdlog.h>

#include <zmq.hpp>

#include <algorithm>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <limits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "comm/curve_keys.h"
#include "comm/zap_handler.h"

namespace headway {
namespace {

using Clock = std::chrono::steady_clock;

// Waits until one of `sockets` has something to read or `deadline` passes.
// False on timeout. EINTR counts as "nothing yet" so a signal does not turn
// into an error.
bool WaitReadable(std::initializer_list<zmq::socket_t*> sockets, Clock::time_point deadline) {
  std::vector<zmq::pollitem_t> items;
  for (zmq::socket_t* s : sockets) items.push_back(zmq::pollitem_t{s->handle(), 0, ZMQ_POLLIN, 0});
  for (;;) {
    // Rounded up: truncating would turn the last partial millisecond into
    // poll(0) calls that spin until the deadline.
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() < 0) left = std::chrono::milliseconds(0);
    try {
      if (zmq::poll(items.data(), items.size(), left) > 0) return true;
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) {
        spdlog::warn("control channel: poll failed: {}", e.what());
        return false;
      }
    }
    if (Clock::now() >= deadline) return false;
  }
}

// Reads every frame of one multipart message without waiting; empty when
// none is ready.
std::vector<zmq::message_t> ReadMultipart(zmq::socket_t& socket) {
  std::vector<zmq::message_t> frames;
  do {
    zmq::message_t frame;
    if (!socket.recv(frame, zmq::recv_flags::dontwait)) break;
    frames.push_back(std::move(frame));
  } while (frames.back().more());
  return frames;
}

enum class ReadResult { kNone, kDropped, kMessage };

// InvalidArgument when `payload` is over the socket's limit.
Status CheckSize(const std::string& payload, int64_t max_bytes, const std::string& to) {
  if (int64_t(payload.size()) <= max_bytes) return Status::Ok();
  return Status::InvalidArgument("control message to " + to + " is " +
                                 std::to_string(payload.size()) + " bytes, over the limit of " +
                                 std::to_string(max_bytes) +
                                 " (coordinator.control_max_message_mb)");
}

// Reads one message if one is ready, without waiting. A ROUTER (`routed`)
// sees two frames, the sender's identity (Inbound::peer) and the payload; a
// DEALER sees the payload alone (peer left empty). kDropped: a malformed
// message was read and logged. `src_fd` (may be null) receives the file
// descriptor of the connection the payload came over (ZMQ_SRCFD), or -1.
ReadResult ReadEnvelope(zmq::socket_t& socket, bool routed, Inbound* out, int* src_fd) {
  const size_t expected_frames = routed ? 2 : 1;
  std::vector<zmq::message_t> frames;
  try {
    frames = ReadMultipart(socket);
  } catch (const zmq::error_t& e) {
    spdlog::warn("control channel: receive failed: {}", e.what());
    return ReadResult::kDropped;
  }
  if (frames.empty()) return ReadResult::kNone;
  if (frames.size() != expected_frames) {
    spdlog::warn("control channel: dropped a message of {} frames (expected {})", frames.size(),
                 expected_frames);
    return ReadResult::kDropped;
  }
  zmq::message_t& payload = frames.back();
  Result<Inbound> inbound =
      DecodeInbound(routed ? frames[0].to_string_view() : std::string_view(),
                    payload.to_string_view(), routed);
  if (!inbound.ok()) {
    spdlog::warn("control channel: {}", inbound.status().message());
    return ReadResult::kDropped;
  }
  if (src_fd != nullptr) *src_fd = zmq_msg_get(payload.handle(), ZMQ_SRCFD);
  *out = std::move(*inbound);
  return ReadResult::kMessage;
}

// The ZAP domain of the control server (ZMQ_ZAP_DOMAIN): any fixed name.
constexpr const char* kZapDomain = "headway-control";

// Makes `socket` a CURVE server (RFC 26) whose handshakes the ZAP handler of
// its context decides. Throws zmq::error_t.
void ApplyCurveServer(zmq::socket_t& socket, const ControlServerKeys& keys) {
  socket.set(zmq::sockopt::curve_server, 1);
  socket.set(zmq::sockopt::curve_secretkey, keys.secret_key);
  socket.set(zmq::sockopt::zap_domain, kZapDomain);
}

// Makes `socket` a CURVE client of the server whose public key `keys` name.
// Throws zmq::error_t.
void ApplyCurveClient(zmq::socket_t& socket, const ControlClientKeys& keys) {
  socket.set(zmq::sockopt::curve_serverkey, keys.server_public_key);
  socket.set(zmq::sockopt::curve_publickey, keys.public_key);
  socket.set(zmq::sockopt::curve_secretkey, keys.secret_key);
}

// The monitor of the server's ROUTER (zmq_socket_monitor): an inproc PAIR
// in the server's own context.
constexpr const char* kMonitorEndpoint = "inproc://headway-control-monitor";

class ZmqControlServer final : public ControlServer {
 public:
  explicit ZmqControlServer(const ControlChannelOptions& options)
      : options_(options),
        context_(1),
        socket_(context_, zmq::socket_type::router),
        monitor_(context_, zmq::socket_type::pair) {}

  ~ZmqControlServer() override {
    zmq_socket_monitor(socket_.handle(), nullptr, 0);
    // What control_max_message_mb must stay above, for this deployment.
    spdlog::info("control channel: largest message received {} bytes, sent {} bytes (limit {})",
                 largest_received_, largest_sent_, options_.max_message_bytes);
  }

  Status Bind(const std::string& address, const std::optional<ControlServerKeys>& keys) {
    if (keys) {
      if (!CurveAvailable()) return Status::Unimplemented("this libzmq is built without CURVE");
      HW_RETURN_IF_ERROR(CheckZ85Key(keys->secret_key, "the control server's secret key"));
      // Before the bind: a handshake that finds no handler is let through.
      HW_ASSIGN_OR_RETURN(zap_, ZapHandler::Start(context_.handle(), keys->authorized_client_keys));
    }
    try {
      if (keys) ApplyCurveServer(socket_, *keys);
      // Unknown peers must be an error, not a silent drop.
      socket_.set(zmq::sockopt::router_mandatory, 1);
      // No ROUTER_HANDOVER: a second live process using a worker's identity
      // (the same rank started twice) is refused instead of stealing the
      // rank's route. A restarted worker gets the identity once its dead
      // predecessor's connection has closed.
      socket_.set(zmq::sockopt::linger, 0);
      socket_.set(zmq::sockopt::maxmsgsize, options_.max_message_bytes);
      if (zmq_socket_monitor(socket_.handle(), kMonitorEndpoint,
                             ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0) {
        throw zmq::error_t();
      }
      monitor_.set(zmq::sockopt::linger, 0);
      monitor_.connect(kMonitorEndpoint);
      socket_.bind(address);
    } catch (const zmq::error_t& e) {
      return Status::Unavailable("cannot bind control address `" + address + "`: " + e.what());
    }
    return Status::Ok();
  }

  Status Send(const std::string& peer, const proto::Envelope& envelope) override {
    std::string payload;
    if (!envelope.SerializeToString(&payload)) {
      return Status::Internal("cannot serialize control message for peer " + peer);
    }
    HW_RETURN_IF_ERROR(CheckSize(payload, options_.max_message_bytes, "peer " + peer));
    largest_sent_ = std::max(largest_sent_, payload.size());
    try {
      if (!socket_.send(zmq::buffer(peer), zmq::send_flags::sndmore | zmq::send_flags::dontwait) ||
          !socket_.send(zmq::buffer(payload), zmq::send_flags::dontwait)) {
        return Status::Unavailable("control send to peer " + peer + " would block");
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EHOSTUNREACH) {
        return Status::Unavailable("control peer " + peer + " is not connected");
      }
      return Status::Unavailable("control send to peer " + peer + " failed: " + e.what());
    }
    return Status::Ok();
  }

  std::optional<Inbound> Receive(std::chrono::milliseconds timeout) override {
    const Clock::time_point deadline = Clock::now() + timeout;
    for (;;) {
      // The monitor first, before every message (the header says why).
      ReadMonitor();
      if (!disconnected_.empty()) {
        Inbound gone;
        gone.kind = Inbound::Kind::kDisconnected;
        gone.peer = std::move(disconnected_.front());
        disconnected_.pop_front();
        return gone;
      }
      Inbound inbound;
      int fd = -1;
      switch (ReadEnvelope(socket_, /*routed=*/true, &inbound, &fd)) {
        case ReadResult::kMessage:
          NoteConnection(inbound.peer, fd);
          largest_received_ = std::max(largest_received_, inbound.envelope.ByteSizeLong());
          return inbound;
        case ReadResult::kDropped:
          continue;
        case ReadResult::kNone:
          break;
      }
      if (!WaitReadable({&socket_, &monitor_}, deadline)) return std::nullopt;
    }
  }

 private:
  // Reads every monitor event that is ready. An event is two frames: 6 bytes
  // (uint16 event id, uint32 value: the file descriptor for ACCEPTED and
  // DISCONNECTED, host byte order) and the endpoint.
  void ReadMonitor() {
    for (;;) {
      std::vector<zmq::message_t> frames;
      try {
        frames = ReadMultipart(monitor_);
      } catch (const zmq::error_t& e) {
        spdlog::warn("control channel: monitor receive failed: {}", e.what());
        return;
      }
      if (frames.empty()) return;
      if (frames[0].size() < sizeof(uint16_t) + sizeof(uint32_t)) continue;
      uint16_t event = 0;
      uint32_t value = 0;
      std::memcpy(&event, frames[0].data(), sizeof(event));
      std::memcpy(&value, static_cast<const char*>(frames[0].data()) + sizeof(event), sizeof(value));
      const int fd = static_cast<int>(value);
      if (event == ZMQ_EVENT_DISCONNECTED) {
        closed_fds_.insert(fd);
        ConnectionEnded(fd);
      } else if (event == ZMQ_EVENT_ACCEPTED) {
        closed_fds_.erase(fd);
        // A descriptor still mapped means its old connection's DISCONNECTED
        // was lost (the monitor drops events when its queue is full): that
        // connection has ended all the same.
        ConnectionEnded(fd);
      }
    }
  }

  // `peer`'s message came over the connection with descriptor `fd`.
  void NoteConnection(const std::string& peer, int fd) {
    // A message read after its connection's end (it was queued before) says
    // nothing about a connection that is still open.
    if (fd < 0 || closed_fds_.count(fd) > 0) return;
    auto p = fd_of_peer_.find(peer);
    if (p != fd_of_peer_.end() && p->second == fd) return;
    if (p != fd_of_peer_.end()) peer_of_fd_.erase(p->second);  // it moved to a new connection
    auto f = peer_of_fd_.find(fd);
    if (f != peer_of_fd_.end()) fd_of_peer_.erase(f->second);
    fd_of_peer_[peer] = fd;
    peer_of_fd_[fd] = peer;
  }

  // The connection with descriptor `fd` closed: its peer is disconnected.
  void ConnectionEnded(int fd) {
    auto f = peer_of_fd_.find(fd);
    if (f == peer_of_fd_.end()) return;
    std::string peer = std::move(f->second);
    peer_of_fd_.erase(f);
    fd_of_peer_.erase(peer);
    spdlog::info("control peer `{}` disconnected", peer);
    disconnected_.push_back(std::move(peer));
  }

  const ControlChannelOptions options_;
  // Declared before the sockets so that it is destroyed after them.
  zmq::context_t context_;
  zmq::socket_t socket_;
  zmq::socket_t monitor_;
  std::unique_ptr<ZapHandler> zap_;  // with keys only
  // The connection each peer's last message came over, both ways.
  std::unordered_map<std::string, int> fd_of_peer_;
  std::unordered_map<int, std::string> peer_of_fd_;
  std::deque<std::string> disconnected_;  // reported by the next Receive calls
  // Descriptors whose connection closed and that no new connection uses yet.
  std::unordered_set<int> closed_fds_;
  size_t largest_received_ = 0;  // payload bytes
  size_t largest_sent_ = 0;
};

class ZmqControlClient final : public ControlClient {
 public:
  explicit ZmqControlClient(const ControlChannelOptions& options)
      : options_(options), context_(1), socket_(context_, zmq::socket_type::dealer) {}

  Status Connect(const std::string& address, const std::string& peer_name,
                 const std::optional<ControlClientKeys>& keys) {
    if (keys) {
      if (!CurveAvailable()) return Status::Unimplemented("this libzmq is built without CURVE");
      HW_RETURN_IF_ERROR(CheckZ85Key(keys->server_public_key, "the coordinator's public key"));
      HW_RETURN_IF_ERROR(CheckZ85Key(keys->public_key, "this worker's public key"));
      HW_RETURN_IF_ERROR(CheckZ85Key(keys->secret_key, "this worker's secret key"));
    }
    try {
      if (keys) ApplyCurveClient(socket_, *keys);
      socket_.set(zmq::sockopt::routing_id, peer_name);
      socket_.set(zmq::sockopt::linger, 0);
      socket_.set(zmq::sockopt::maxmsgsize, options_.max_message_bytes);
      socket_.connect(address);
    } catch (const zmq::error_t& e) {
      return Status::InvalidArgument("cannot connect to control address `" + address +
                                     "`: " + e.what());
    }
    return Status::Ok();
  }

  Status Send(const proto::Envelope& envelope) override {
    std::string payload;
    if (!envelope.SerializeToString(&payload)) {
      return Status::Internal("cannot serialize control message");
    }
    HW_RETURN_IF_ERROR(CheckSize(payload, options_.max_message_bytes, "the coordinator"));
    try {
      if (!socket_.send(zmq::buffer(payload), zmq::send_flags::dontwait)) {
        return Status::Unavailable("control send to the coordinator would block");
      }
    } catch (const zmq::error_t& e) {
      return Status::Unavailable(std::string("control send to the coordinator failed: ") +
                                 e.what());
    }
    return Status::Ok();
  }

  std::optional<proto::Envelope> Receive(std::chrono::milliseconds timeout) override {
    const Clock::time_point deadline = Clock::now() + timeout;
    for (;;) {
      Inbound inbound;
      switch (ReadEnvelope(socket_, /*routed=*/false, &inbound, nullptr)) {
        case ReadResult::kMessage:
          return std::move(inbound.envelope);
        case ReadResult::kDropped:
          continue;
        case ReadResult::kNone:
          break;
      }
      if (!WaitReadable({&socket_}, deadline)) return std::nullopt;
    }
  }

 private:
  const ControlChannelOptions options_;
  zmq::context_t context_;
  zmq::socket_t socket_;
};

}  // namespace

// Every PeerName is printable ASCII without spaces; anything else is a peer
// that is not a Headway worker (a DEALER without an identity gets ZeroMQ's
// binary one).
static bool IsPrintableIdentity(std::string_view identity) {
  if (identity.empty()) return false;
  for (unsigned char c : identity) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

Result<Inbound> DecodeInbound(std::string_view identity, std::string_view payload, bool routed) {
  Inbound inbound;
  if (routed) inbound.peer = std::string(identity);
  if (routed && !IsPrintableIdentity(identity)) {
    return Status::InvalidArgument("dropped a message of " + std::to_string(payload.size()) +
                                   " bytes from a peer whose identity is not a worker's: \"" +
                                   EscapeForLog(inbound.peer) + "\"");
  }
  // protobuf takes an int size; a larger payload cannot be an Envelope of
  // ours (ZMQ_MAXMSGSIZE stops it long before).
  if (payload.size() > size_t(std::numeric_limits<int>::max()) ||
      !inbound.envelope.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return Status::InvalidArgument(
        "dropped an unparsable message of " + std::to_string(payload.size()) + " bytes from " +
        (routed ? "`" + inbound.peer + "`" : std::string("the coordinator")));
  }
  return inbound;
}

std::string PeerName(int instance_id, int tp_rank) {
  return "i" + std::to_string(instance_id) + "r" + std::to_string(tp_rank);
}

std::string EscapeForLog(const std::string& bytes, size_t max_bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  const size_t n = std::min(bytes.size(), max_bytes);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c <= 0x7e && c != '\\') {
      out += char(c);
    } else {
      out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
    }
  }
  if (bytes.size() > n) out += "...";
  return out;
}

Result<std::unique_ptr<ControlServer>> ControlServer::Bind(
    const std::string& address, const std::optional<ControlServerKeys>& keys,
    const ControlChannelOptions& options) {
  std::unique_ptr<ZmqControlServer> server;
  try {
    server = std::make_unique<ZmqControlServer>(options);
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(std::string("cannot create a ZeroMQ socket: ") + e.what());
  }
  HW_RETURN_IF_ERROR(server->Bind(address, keys));
  return std::unique_ptr<ControlServer>(std::move(server));
}

Result<std::unique_ptr<ControlClient>> ControlClient::Connect(
    const std::string& address, const std::string& peer_name,
    const std::optional<ControlClientKeys>& keys, const ControlChannelOptions& options) {
  std::unique_ptr<ZmqControlClient> client;
  try {
    client = std::make_unique<ZmqControlClient>(options);
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(std::string("cannot create a ZeroMQ socket: ") + e.what());
  }
  HW_RETURN_IF_ERROR(client->Connect(address, peer_name, keys));
  return std::unique_ptr<ControlClient>(std::move(client));
}

}  // namespace headway
