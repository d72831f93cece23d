// Control channel over ZeroMQ: the coordinator binds a ROUTER, each worker
// connects a DEALER. A message is one frame holding a serialized
// proto::Envelope (proto/control.proto). Peers are named by their DEALER
// routing identity, "i<instance_id>r<tp_rank>" (see PeerName).
//
// The server also reports a peer's connection closing (its process died or
// closed its socket) as soon as ZeroMQ sees it, through a socket monitor:
// Debian's libzmq 4.3 has no ZMQ_ROUTER_NOTIFY (draft API), so the server
// remembers the connection (file descriptor, ZMQ_SRCFD) each peer's
// messages arrive on and maps the monitor's ZMQ_EVENT_DISCONNECTED on that
// descriptor back to the peer. A descriptor the kernel reuses for a later
// connection is told apart because the monitor's events are read before
// every message: a connection's end is seen before any message of a later
// connection on the same descriptor.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "proto/control.pb.h"

namespace headway {

// Routing identity of a worker.
std::string PeerName(int instance_id, int tp_rank);

// `bytes` as printable ASCII for a log line: bytes 0x20..0x7e except `\` as
// they are, every other byte as \xNN, at most `max_bytes` input bytes
// (then "..."). Identities and payloads from the network go through this, so
// garbage on the control port cannot write control characters into a log.
std::string EscapeForLog(const std::string& bytes, size_t max_bytes = 64);

// The default of ControlChannelOptions::max_message_bytes, 64 MiB: well above
// the largest real message (README "Control plane" gives the measured sizes).
inline constexpr int64_t kDefaultControlMaxMessageBytes = int64_t(64) << 20;

// Limits of one control socket.
struct ControlChannelOptions {
  // ZMQ_MAXMSGSIZE: ZeroMQ closes the connection of a peer that sends a
  // larger message, before buffering it; sending a larger one is refused
  // (InvalidArgument). Bytes, >= 1.
  int64_t max_message_bytes = kDefaultControlMaxMessageBytes;
};

// What the server receives: a message and who sent it, or the news that a
// peer's connection closed.
struct Inbound {
  enum class Kind {
    kMessage,       // `envelope` came from `peer`
    kDisconnected,  // the connection `peer`'s last message came over closed
  };
  Kind kind = Kind::kMessage;
  std::string peer;              // routing identity of the sender
  proto::Envelope envelope;      // kMessage only
};

// The checks every received message passes before Receive returns it, as a
// pure function of its frames: `identity` is the ROUTER's routing-identity
// frame (`routed`; ignored for a DEALER, whose Inbound::peer stays empty)
// and `payload` the serialized proto::Envelope. Errors: InvalidArgument
// when a routed identity is not printable ASCII (0x21..0x7e; every PeerName
// is) or the payload does not parse; the message, safe for a log (the
// identity passes through EscapeForLog), says which and how many bytes.
Result<Inbound> DecodeInbound(std::string_view identity, std::string_view payload, bool routed);

// CurveZMQ (RFC 26) on the control plane: the coordinator's ROUTER is a
// CURVE server and admits, through its ZAP handler (comm/zap_handler.h),
// only the client keys on its allow-list; workers' DEALERs are CURVE
// clients that know the server's public key. Every key is Z85 (40
// characters; comm/curve_keys.h reads them from files).
struct ControlServerKeys {
  std::string secret_key;                           // the coordinator's
  std::vector<std::string> authorized_client_keys;  // public keys; none = nobody registers
};
struct ControlClientKeys {
  std::string server_public_key;  // the coordinator's
  std::string public_key;         // this client's pair
  std::string secret_key;
};

// Coordinator side. Not thread-safe: one thread sends and receives (the
// ZeroMQ socket rule); other threads hand work to it.
class ControlServer {
 public:
  // Binds `address` (e.g. "tcp://127.0.0.1:5557"). With `keys`, the
  // socket is a CURVE server: a peer without a client key on the
  // allow-list never completes its handshake, so none of its messages
  // reaches Receive. Without, any peer that connects is heard.
  // `options` sets limits such as the largest message.
  // Errors: Unavailable if the address is in use or malformed (message
  // names the address); InvalidArgument for a key that is not Z85;
  // Unimplemented for keys when libzmq lacks CURVE.
  static Result<std::unique_ptr<ControlServer>> Bind(
      const std::string& address, const std::optional<ControlServerKeys>& keys = std::nullopt,
      const ControlChannelOptions& options = {});
  virtual ~ControlServer() = default;

  // Sends to one peer. Unavailable if the peer is unknown to ZeroMQ
  // (ROUTER_MANDATORY) or the send would block; InvalidArgument if the
  // message is larger than max_message_bytes (the peer would drop it).
  virtual Status Send(const std::string& peer, const proto::Envelope& envelope) = 0;

  // Waits up to `timeout` for one message or disconnect. nullopt on
  // timeout. Messages that do not parse, and messages from a routing
  // identity that is not printable ASCII (0x21..0x7e; every PeerName is),
  // are dropped and logged through EscapeForLog.
  // kDisconnected names the routing identity of the last message that came
  // over the closed connection, once per connection; a connection that
  // never delivered a message (a peer refused for a duplicate identity, a
  // port scanner) is not reported. ZeroMQ sees a peer process that dies
  // within milliseconds (the kernel closes its sockets), a peer host that
  // vanishes only when TCP gives up: heartbeats cover that case.
  virtual std::optional<Inbound> Receive(std::chrono::milliseconds timeout) = 0;
};

// Worker side. Not thread-safe (one thread).
class ControlClient {
 public:
  // Connects to `address` with routing identity `peer_name`, as a CURVE
  // client when `keys` are given; `options` sets limits such as the
  // largest message. Connecting is asynchronous in ZeroMQ, so
  // this fails only for a malformed address (InvalidArgument) or key
  // (InvalidArgument; Unimplemented when libzmq lacks CURVE); a server that
  // refuses the key, or wants one that is not given, is seen only as
  // silence: messages are queued and never answered.
  static Result<std::unique_ptr<ControlClient>> Connect(
      const std::string& address, const std::string& peer_name,
      const std::optional<ControlClientKeys>& keys = std::nullopt,
      const ControlChannelOptions& options = {});
  virtual ~ControlClient() = default;

  // Unavailable if the send would block or fails; InvalidArgument if the
  // message is larger than max_message_bytes.
  virtual Status Send(const proto::Envelope& envelope) = 0;
  // Waits up to `timeout` for one message; nullopt on timeout.
  virtual std::optional<proto::Envelope> Receive(std::chrono::milliseconds timeout) = 0;
};

}  // namespace headway
