// Control channel over ZeroMQ: the coordinator binds a ROUTER, each worker
// connects a DEALER. A message is one frame holding a serialized
// proto::Envelope (proto/control.proto). Peers are named by their DEALER
// routing identity, "i<instance_id>r<tp_rank>" (see PeerName).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "proto/control.pb.h"

namespace headway {

// Routing identity of a worker.
std::string PeerName(int instance_id, int tp_rank);

// A received message and who sent it.
struct Inbound {
  std::string peer;              // routing identity of the sender
  proto::Envelope envelope;
};

// Coordinator side. Not thread-safe: one thread sends and receives (the
// ZeroMQ socket rule); other threads hand work to it.
class ControlServer {
 public:
  // Binds `address` (e.g. "tcp://127.0.0.1:5557"). Unavailable if the
  // address is in use or malformed (message names the address).
  static Result<std::unique_ptr<ControlServer>> Bind(const std::string& address);
  virtual ~ControlServer() = default;

  // Sends to one peer. Unavailable if the peer is unknown to ZeroMQ
  // (ROUTER_MANDATORY) or the send would block.
  virtual Status Send(const std::string& peer, const proto::Envelope& envelope) = 0;

  // Waits up to `timeout` for one message. nullopt on timeout. Messages that
  // do not parse are dropped and logged.
  virtual std::optional<Inbound> Receive(std::chrono::milliseconds timeout) = 0;
};

// Worker side. Not thread-safe (one thread).
class ControlClient {
 public:
  // Connects to `address` with routing identity `peer_name`. Connecting is
  // asynchronous in ZeroMQ, so this fails only for a malformed address.
  static Result<std::unique_ptr<ControlClient>> Connect(const std::string& address,
                                                        const std::string& peer_name);
  virtual ~ControlClient() = default;

  virtual Status Send(const proto::Envelope& envelope) = 0;
  // Waits up to `timeout` for one message; nullopt on timeout.
  virtual std::optional<proto::Envelope> Receive(std::chrono::milliseconds timeout) = 0;
};

}  // namespace headway
