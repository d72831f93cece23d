#include "comm/control_channel.h"

#include <spdlog/spdlog.h>

#include <zmq.hpp>

#include <vector>

namespace headway {
namespace {

using Clock = std::chrono::steady_clock;

// Waits until `socket` has a message or `deadline` passes. False on timeout.
// EINTR counts as "nothing yet" so a signal does not turn into an error.
bool WaitReadable(zmq::socket_t& socket, Clock::time_point deadline) {
  for (;;) {
    // Rounded up: truncating would turn the last partial millisecond into
    // poll(0) calls that spin until the deadline.
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() < 0) left = std::chrono::milliseconds(0);
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    try {
      if (zmq::poll(&item, 1, left) > 0) return true;
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) {
        spdlog::warn("control channel: poll failed: {}", e.what());
        return false;
      }
    }
    if (Clock::now() >= deadline) return false;
  }
}

// Reads every frame of one multipart message that is known to be ready.
std::vector<zmq::message_t> ReadMultipart(zmq::socket_t& socket) {
  std::vector<zmq::message_t> frames;
  do {
    zmq::message_t frame;
    if (!socket.recv(frame, zmq::recv_flags::dontwait)) break;
    frames.push_back(std::move(frame));
  } while (frames.back().more());
  return frames;
}

// The receive loop of both ends: waits up to `timeout` for one message that
// parses, dropping (and logging) malformed ones. A ROUTER (`routed`) sees
// two frames, the sender's identity (returned in Inbound::peer) and the
// payload; a DEALER sees the payload alone (peer left empty).
std::optional<Inbound> ReceiveEnvelope(zmq::socket_t& socket, bool routed,
                                       std::chrono::milliseconds timeout) {
  const size_t expected_frames = routed ? 2 : 1;
  const Clock::time_point deadline = Clock::now() + timeout;
  while (WaitReadable(socket, deadline)) {
    std::vector<zmq::message_t> frames;
    try {
      frames = ReadMultipart(socket);
    } catch (const zmq::error_t& e) {
      spdlog::warn("control channel: receive failed: {}", e.what());
      continue;
    }
    if (frames.size() != expected_frames) {
      spdlog::warn("control channel: dropped a message of {} frames (expected {})",
                   frames.size(), expected_frames);
      continue;
    }
    Inbound inbound;
    if (routed) inbound.peer = frames[0].to_string();
    const zmq::message_t& payload = frames.back();
    if (!inbound.envelope.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
      spdlog::warn("control channel: dropped an unparsable message from {}",
                   routed ? inbound.peer : std::string("the coordinator"));
      continue;
    }
    return inbound;
  }
  return std::nullopt;
}

class ZmqControlServer final : public ControlServer {
 public:
  ZmqControlServer() : context_(1), socket_(context_, zmq::socket_type::router) {}

  Status Bind(const std::string& address) {
    try {
      // Unknown peers must be an error, not a silent drop.
      socket_.set(zmq::sockopt::router_mandatory, 1);
      // No ROUTER_HANDOVER: a second live process using a worker's identity
      // (the same rank started twice) is refused instead of stealing the
      // rank's route. A restarted worker gets the identity once its dead
      // predecessor's connection has closed.
      socket_.set(zmq::sockopt::linger, 0);
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
    return ReceiveEnvelope(socket_, /*routed=*/true, timeout);
  }

 private:
  // Declared before the socket so that it is destroyed after it.
  zmq::context_t context_;
  zmq::socket_t socket_;
};

class ZmqControlClient final : public ControlClient {
 public:
  ZmqControlClient() : context_(1), socket_(context_, zmq::socket_type::dealer) {}

  Status Connect(const std::string& address, const std::string& peer_name) {
    try {
      socket_.set(zmq::sockopt::routing_id, peer_name);
      socket_.set(zmq::sockopt::linger, 0);
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
    std::optional<Inbound> inbound = ReceiveEnvelope(socket_, /*routed=*/false, timeout);
    if (!inbound) return std::nullopt;
    return std::move(inbound->envelope);
  }

 private:
  zmq::context_t context_;
  zmq::socket_t socket_;
};

}  // namespace

std::string PeerName(int instance_id, int tp_rank) {
  return "i" + std::to_string(instance_id) + "r" + std::to_string(tp_rank);
}

Result<std::unique_ptr<ControlServer>> ControlServer::Bind(const std::string& address) {
  std::unique_ptr<ZmqControlServer> server;
  try {
    server = std::make_unique<ZmqControlServer>();
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(std::string("cannot create a ZeroMQ socket: ") + e.what());
  }
  HW_RETURN_IF_ERROR(server->Bind(address));
  return std::unique_ptr<ControlServer>(std::move(server));
}

Result<std::unique_ptr<ControlClient>> ControlClient::Connect(const std::string& address,
                                                              const std::string& peer_name) {
  std::unique_ptr<ZmqControlClient> client;
  try {
    client = std::make_unique<ZmqControlClient>();
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(std::string("cannot create a ZeroMQ socket: ") + e.what());
  }
  HW_RETURN_IF_ERROR(client->Connect(address, peer_name));
  return std::unique_ptr<ControlClient>(std::move(client));
}

}  // namespace headway
