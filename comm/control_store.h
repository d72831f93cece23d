// The worker's view of the coordinator's rendezvous store (proto StoreSet /
// StoreGet / StoreValue): how the ranks of an instance exchange Gloo
// addresses, the shm segment name or the NCCL unique id before they
// register. The coordinator scopes keys to the sender's instance.
#pragma once

#include <chrono>
#include <mutex>
#include <string>

#include "comm/communicator.h"
#include "comm/control_channel.h"

namespace headway {

// Uses `client` (which must outlive the store) only while no other code
// reads from it: the worker sets up its communicator before it registers
// and serves steps. Thread-safe (one call at a time).
class ControlStore final : public RendezvousStore {
 public:
  // poll_interval: how long to wait before asking again for a key that is
  // not set yet.
  explicit ControlStore(ControlClient* client,
                        std::chrono::milliseconds poll_interval = std::chrono::milliseconds(20));

  // Errors: Unavailable if the message cannot be sent.
  Status Set(const std::string& key, const std::string& value) override;
  // Asks the coordinator until `key` is set. Errors: Unavailable after
  // `timeout` (the message names the key), or when a send fails; Aborted if
  // the coordinator sends Shutdown meanwhile. Other messages are dropped.
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override;

 private:
  ControlClient* const client_;
  const std::chrono::milliseconds poll_interval_;
  std::mutex mu_;  // serializes use of client_
};

}  // namespace headway
