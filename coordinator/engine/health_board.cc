#include "coordinator/engine/health_board.h"

#include <utility>


namespace headway {

HealthBoard::HealthBoard(std::vector<InstanceHealth> initial) : health_(std::move(initial)) {}

Status HealthBoard::RequestDrain(int instance_id, std::string why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (instance_id < 0 || size_t(instance_id) >= health_.size()) {
    return Status::NotFound("no instance " + std::to_string(instance_id) + " (the config has " +
                            std::to_string(health_.size()) + ")");
  }
  InstanceState& state = health_[size_t(instance_id)].state;
  if (state != InstanceState::kReady) {
    return Status::FailedPrecondition("instance " + std::to_string(instance_id) + " is " +
                                      InstanceStateName(state) + ", not ready: nothing to drain");
  }
  drains_.push_back(DrainRequest{instance_id, std::move(why)});
  state = InstanceState::kDraining;
  return Status::Ok();
}

std::vector<DrainRequest> HealthBoard::TakeDrains() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(drains_, {});
}

void HealthBoard::Publish(std::vector<InstanceHealth> snapshot) {
  std::lock_guard<std::mutex> lock(mu_);
  HW_CHECK(snapshot.size() == health_.size());
  health_ = std::move(snapshot);
  // A queued drain was accepted against a ready instance; if the instance
  // went down meanwhile, the engine drops the drain and down is the truth.
  for (const DrainRequest& d : drains_) {
    InstanceState& state = health_[size_t(d.instance_id)].state;
    if (state == InstanceState::kReady) state = InstanceState::kDraining;
  }
}

std::vector<InstanceHealth> HealthBoard::Health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return health_;
}

}  // namespace headway
