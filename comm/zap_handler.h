// The ZAP handler (ZeroMQ RFC 27, ZAP 1.0) of the control server: it admits
// a CURVE client only if its public key is on the allow-list.
//
// libzmq asks the handler bound at inproc://zeromq.zap.01 in the socket's
// context about every CURVE handshake; the handler answers on its own
// thread, so a slow or hostile peer's handshake never waits for the engine
// loop. A refused peer's connection is closed by libzmq before any of its
// messages reaches the ROUTER.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace headway {

class ZapHandler {
 public:
  // Binds inproc://zeromq.zap.01 in `zmq_context` (a zmq_ctx_new() handle;
  // it must outlive the handler) and starts answering. Call it before the
  // server socket binds, so that no handshake goes unchecked.
  // `authorized_keys` are Z85 client public keys (40 characters each).
  // Errors: Unavailable when the endpoint cannot be bound (another handler
  // in the same context); InvalidArgument for a key that is not Z85.
  static Result<std::unique_ptr<ZapHandler>> Start(void* zmq_context,
                                                   const std::vector<std::string>& authorized_keys);
  // Stops the thread (within about 100 ms) and closes its socket.
  virtual ~ZapHandler() = default;

  // Handshakes refused so far (any thread).
  virtual int num_refused() const = 0;
};

}  // namespace headway
