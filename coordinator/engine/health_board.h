// What HTTP threads see of the instances (GET /health, /ready, the admin
// drain) and the transitions they ask for, kept between them and the engine
// thread, which owns the instances.
//
// The engine thread publishes a snapshot of every instance once per loop
// iteration; an HTTP thread's drain is queued here until the engine thread
// takes it. A snapshot is built before the engine thread has taken what was
// queued meanwhile, so on its own it would carry a state older than a
// queued drain: the instance would read `ready` again for one iteration and
// a second drain would be accepted. Publish therefore lays every drain
// still queued over the snapshot (ready -> draining). A drain is either
// still queued, and overlaid, or taken, and then applied by the engine
// thread before it builds its next snapshot; so, however the threads
// interleave, a second drain is refused and what readers see never goes
// back from draining to ready.
//
// Thread-safe.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/engine/instance_registry.h"

namespace headway {

// A drain asked for by an HTTP thread, for the engine thread to carry out.
struct DrainRequest {
  int instance_id = 0;
  std::string why;  // logged by the engine
};

class HealthBoard {
 public:
  // `initial`: one entry per instance of the config, in Config::Instances
  // order (InstanceRegistry::Snapshot before the engine thread starts).
  explicit HealthBoard(std::vector<InstanceHealth> initial);

  HealthBoard(const HealthBoard&) = delete;
  HealthBoard& operator=(const HealthBoard&) = delete;

  // Queues a drain of `instance_id` and shows it draining from now on.
  // Errors: NotFound for an id outside the config; FailedPrecondition when
  // the instance is not ready or already draining (queued or applied).
  Status RequestDrain(int instance_id, std::string why);

  // Engine thread: hands over the drains queued since the last call, in
  // the order they were asked for. The caller applies them before it builds
  // its next snapshot.
  std::vector<DrainRequest> TakeDrains();

  // Engine thread: replaces what readers see with `snapshot` (same size
  // and order as `initial`), with the drains still queued laid over it.
  void Publish(std::vector<InstanceHealth> snapshot);

  // The last published snapshot with queued drains laid over it.
  std::vector<InstanceHealth> Health() const;

 private:
  mutable std::mutex mu_;
  std::vector<InstanceHealth> health_;  // guarded by mu_
  std::vector<DrainRequest> drains_;    // guarded by mu_; queued, not yet taken
};

}  // namespace headway
