// The instances of a deployment as the coordinator knows them: which ranks
// have registered, their KV endpoints and rendezvous store, when each was
// last heard from, and the scheduler of every ready instance.
//
// An instance is ready (has a scheduler) once all its ranks have
// registered; each time it becomes ready its generation grows, so a caller
// holding state about an older generation (a KV transfer, a pin) can tell
// that the instance restarted meanwhile. Reset forgets an instance that went
// down; it is ready again once all its ranks register anew.
//
// Not thread-safe: the engine thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/control_channel.h"
#include "common/config.h"
#include "common/model_spec.h"
#include "coordinator/scheduling/scheduler.h"
#include "coordinator/metrics/serving_metrics.h"
#include "coordinator/engine/step_plan.h"

namespace headway {

struct RankState {
  bool registered = false;
  int num_chunks = 0;  // the rank's KV arena (common/kv_arena.h)
  Clock::time_point last_heard;
  proto::KvEndpoint kv_endpoint;  // where senders write this rank's blocks
  std::string kv_write_key;       // grants to write there are MACed with it; never sent on
};

struct Instance {
  int id = 0;
  int tp_size = 1;
  PoolRole role = PoolRole::kMixed;
  bool standby = false;                  // a slot that joins when run (PoolConfig::IsStandby)
  // Its ranks' collective_timeout_ms: no healthy rank answers a step later
  // than this after its peers (FindStragglers).
  std::chrono::milliseconds collective_timeout{30000};
  std::vector<RankState> ranks;          // [tp_size]
  std::unique_ptr<Scheduler> scheduler;  // non-null while ready
  uint64_t generation = 0;               // +1 each time the instance becomes ready
  uint64_t next_step_id = 1;
  std::optional<InFlightStep> in_flight;
  // When the last step's results were all in, if the instance still had
  // sequences to run then; the next Dispatch reports the gap
  // (headway:step_gap_seconds) and clears it.
  std::optional<Clock::time_point> last_step_done;
  // Rendezvous store of this instance's ranks (proto StoreSet/StoreGet).
  std::map<std::string, std::string> store;

  // Set while draining (Engine: the admin endpoint or a worker's
  // DrainRequest): the instance takes no new request and leaves once its
  // requests have ended, or at this time at the latest. Cleared by Reset.
  std::optional<Clock::time_point> drain_deadline;

  bool ready() const { return scheduler != nullptr; }
  bool draining() const { return drain_deadline.has_value(); }
  // Ready and not draining: new requests may go here.
  bool accepting() const { return ready() && !draining(); }
  // Sequences waiting and running. REQUIRES: ready().
  size_t load() const { return scheduler->num_waiting() + scheduler->num_running(); }
};

struct RankHealth {
  int tp_rank = 0;
  bool registered = false;
  int free_blocks = 0;   // 0/0 until the instance is ready
  int total_blocks = 0;
  int retained_blocks = 0;  // RankBlockUsage::num_retained
  // KV memory held, in shares of the arena (KvCacheManager): usage = used / total.
  int64_t used_shares = 0;
  int64_t total_shares = 0;
  // The arena's chunks by owner: a KV cache dtype's name, then "free".
  std::vector<std::pair<std::string, int>> arena_chunks;
};

struct InstanceHealth {
  int instance_id = 0;
  int tp_size = 1;
  PoolRole role = PoolRole::kMixed;
  InstanceState state = InstanceState::kDown;
  size_t num_waiting = 0;
  size_t num_running = 0;
  std::vector<RankHealth> ranks;

  // All ranks registered, draining or not.
  bool ready() const { return state == InstanceState::kReady || state == InstanceState::kDraining; }
};

// True when a new request can be served by the instances of `health` (one
// entry per instance of the deployment): a ready mixed instance that is not
// draining in a colocated deployment; such a decode instance in a
// disaggregated one (with no prefill instance ready, the decode instance
// prefills prompts itself). This is GET /ready.
bool CanServe(const std::vector<InstanceHealth>& health);

class InstanceRegistry {
 public:
  // One instance per entry of config.Instances(), none registered. `server`
  // and `metrics` must outlive the registry.
  InstanceRegistry(const Config& config, const ModelSpec& spec, ControlServer* server,
                   ServingMetrics* metrics);

  InstanceRegistry(const InstanceRegistry&) = delete;
  InstanceRegistry& operator=(const InstanceRegistry&) = delete;

  std::vector<Instance>& instances() { return instances_; }
  const std::vector<Instance>& instances() const { return instances_; }
  // REQUIRES: 0 <= id < instances().size().
  Instance& at(int id) { return instances_.at(size_t(id)); }
  const Instance& at(int id) const { return instances_.at(size_t(id)); }

  // True while instance `id` is ready and has not restarted since
  // `generation`.
  bool Alive(int id, uint64_t generation) const;

  // The instance and rank a routing identity (PeerName) belongs to.
  struct Peer {
    Instance* instance = nullptr;
    int rank = 0;
  };
  std::optional<Peer> FindPeer(const std::string& peer);

  // ---- registration ---------------------------------------------------
  // Checks a RegisterRequest (ValidateRegisterRequest). On an error, answers
  // the worker with the rejection and returns nullptr; otherwise returns the
  // instance it joins (not yet registered: see Register).
  Instance* CheckRegistration(const std::string& peer, const proto::RegisterRequest& request);
  // Registers the rank and answers the worker. Returns true when the
  // instance just became ready (all its ranks registered): it has a new
  // scheduler and generation. REQUIRES: CheckRegistration accepted it, and
  // the rank is not registered (Reset the instance first).
  bool Register(Instance& instance, const std::string& peer, const proto::RegisterRequest& request);
  // Answers a rank's StoreSet / StoreGet (the ranks' rendezvous).
  void HandleStore(Instance& instance, const std::string& peer, const proto::Envelope& envelope);

  // ---- liveness -------------------------------------------------------
  // The rank sent something: it is alive.
  void Heard(Instance& instance, int rank) { instance.ranks[size_t(rank)].last_heard = Clock::now(); }
  // Heartbeats to every registered rank, at most every heartbeat_interval_ms.
  void SendHeartbeats(Clock::time_point now);
  // Ready or registering instances with a registered rank silent for more
  // than heartbeat_timeout_ms, each with a sentence naming the first such rank.
  std::vector<std::pair<Instance*, std::string>> FindSilent(Clock::time_point now);
  // Instances whose step in flight has some ranks' results and has waited
  // more than the instance's collective_timeout for the rest since the
  // first, each with a sentence naming the first rank missing. The ranks of
  // a TP group finish a step within one collective of each other (each
  // step ends with collectives every rank joins), so such a rank is stuck
  // outside a collective, where its peers' collective timeout cannot see it
  // (stopped, or hung between its last collective and its result), and its
  // heartbeats may still come.
  std::vector<std::pair<Instance*, std::string>> FindStragglers(Clock::time_point now);
  // Forgets the instance's scheduler, step in flight, store and ranks: it is
  // down until all its ranks register again.
  void Reset(Instance& instance);
  // Tells the instance's registered ranks to exit with a failure status
  // (Shutdown.fault): their TP group is broken ("instance N is down:
  // <reason>").
  void StopRanks(Instance& instance, const std::string& reason);
  // Tells worker `peer` to exit with a failure status (Shutdown.fault)
  // whether or not it is registered.
  void StopPeer(const std::string& peer, const std::string& reason);
  // Tells the instance's registered ranks to exit cleanly (a drain ended).
  void ReleaseRanks(Instance& instance, const std::string& reason);
  // Tells every registered rank to exit cleanly with `reason` (the
  // coordinator stops).
  void ShutdownAll(const std::string& reason);

  // Sends to one rank; a failure is logged (the liveness check notices a
  // rank that is gone).
  void Send(const Instance& instance, int rank, const proto::Envelope& envelope);

  // Every instance's health, in Config::Instances order.
  std::vector<InstanceHealth> Snapshot() const;

 private:
  void Reply(const std::string& peer, const proto::Envelope& envelope);
  void SendShutdown(Instance& instance, const std::string& reason, bool fault);
  // Logs the instance's KV pool floor (Scheduler::FloorShares at
  // max_model_len) and, when the pool is below it, how many max_model_len
  // requests run at once.
  void LogPoolFloor(const Instance& inst) const;

  const Config& config_;
  const ModelSpec& spec_;
  ControlServer* const server_;
  ServingMetrics* const metrics_;
  std::vector<Instance> instances_;
  std::map<std::string, std::pair<int, int>> peers_;  // routing identity -> (instance, rank)
  Clock::time_point last_heartbeat_sent_;
};

}  // namespace headway
