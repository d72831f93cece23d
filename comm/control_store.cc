#include "comm/control_store.h"

#include <thread>

namespace headway {

ControlStore::ControlStore(ControlClient* client, std::chrono::milliseconds poll_interval)
    : client_(client), poll_interval_(poll_interval) {}

Status ControlStore::Set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  proto::Envelope env;
  env.mutable_store_set()->set_key(key);
  env.mutable_store_set()->set_value(value);
  return client_->Send(env).WithContext("store set `" + key + "`");
}

Result<std::string> ControlStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + timeout;
  proto::Envelope ask;
  ask.mutable_store_get()->set_key(key);
  while (Clock::now() < deadline) {
    HW_RETURN_IF_ERROR(client_->Send(ask).WithContext("store get `" + key + "`"));
    // One answer per question; a late answer to an earlier question for the
    // same key is as good as this one's.
    const Clock::time_point asked = Clock::now();
    while (Clock::now() - asked < poll_interval_ * 10) {
      std::optional<proto::Envelope> in = client_->Receive(poll_interval_);
      if (!in) continue;
      if (in->has_shutdown()) {
        return Status::Aborted("coordinator sent Shutdown while waiting for `" + key +
                               "`: " + in->shutdown().reason());
      }
      if (!in->has_store_value() || in->store_value().key() != key) continue;
      if (in->store_value().found()) return in->store_value().value();
      break;
    }
    std::this_thread::sleep_for(poll_interval_);
  }
  return Status::Unavailable("timed out after " + std::to_string(timeout.count()) +
                             " ms waiting for rendezvous key `" + key +
                             "` (are all TP ranks of the instance running?)");
}

}  // namespace headway
