// The coordinator's engine: one thread that owns the ControlServer (ZeroMQ
// sockets are single-threaded) and runs, per instance, the step loop
// schedule -> dispatch -> collect, plus registration, heartbeats and
// liveness.
//
// HTTP threads call Submit (thread-safe) and wait on the returned future;
// the engine thread admits requests, runs them and fulfils every future
// exactly once: with the completion, or with an ApiError (instance down:
// 503, worker step error: 500, deadline passed: 503, shutdown: 503,
// cancelled: 499). A streaming request also gets its text through its
// OutputStream as tokens are sampled, and the same outcome when it ends; the
// engine thread never waits for the HTTP thread that reads it.
//
// Aborts: Cancel (e.g. a streaming client that went away) removes the
// sequence at the engine's next loop iteration; its blocks go back to the
// pool and the workers drop it with the next step's released_seq_ids.
//
// Liveness: any message from a worker counts as a sign of life. A
// registered worker is down when its control connection closes (ZeroMQ
// reports it within milliseconds of the process dying: ControlServer's
// kDisconnected) or when it stays silent for heartbeat_timeout_ms (a hung
// process, a lost host). Its instance is then marked down (not ready), its
// other ranks are told to exit (Shutdown.fault) and its blocks go with its
// scheduler. Its requests:
//   * still prefilling or transferring on a prefill instance: a decode
//     instance prefills them itself;
//   * whose client has been sent nothing yet (no output token, or not
//     streaming): they start again from their prompt on the least loaded
//     ready instance of the same role, same request id, seed and arrival
//     time (TTFT counts from the client's arrival);
//   * that have streamed tokens, or with no other ready instance of the
//     role: they end with Unavailable (503) naming the instance.
// The instance is ready again once all its ranks have registered anew.
//
// The engine composes one class per concern: the InstanceRegistry
// (registration, rendezvous, liveness), the Scheduler of each instance
// (scheduler.h), BuildStepPlans and InFlightStep (step_plan.h), the
// RequestTable of admitted requests and their answers (request_table.h),
// the OutputProcessor of each request (output_processor.h), the router
// (router.h) and, with prefill and decode pools, the
// DisaggregationCoordinator (disaggregation.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/control_channel.h"
#include "common/config.h"
#include "common/model_spec.h"
#include "coordinator/engine/engine_request.h"
#include "coordinator/engine/health_board.h"
#include "coordinator/engine/instance_registry.h"
#include "coordinator/engine/request_output.h"
#include "coordinator/metrics/serving_metrics.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace headway {

class Engine {
 public:
  // `config` must have passed ParseConfig and every instance's tp_size
  // ValidateTpSize(spec). `tokenizer` must outlive the engine.
  Engine(Config config, ModelSpec spec, const Tokenizer* tokenizer,
         std::unique_ptr<ControlServer> server);
  ~Engine();  // Stop()

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Starts the engine thread. REQUIRES: called once.
  void Start();

  // Sends Shutdown{reason} to every registered worker, fails outstanding
  // requests with 503, joins the thread. Idempotent; thread-safe.
  void Stop(const std::string& reason = "coordinator shutting down");

  // Queues a request; the future is fulfilled once it ends. `request_id`
  // (optional) receives an id for Cancel. Thread-safe.
  std::future<CompletionOutcome> Submit(EngineRequest request, uint64_t* request_id = nullptr);

  // Ends a request early (its future gets a 499-style abort error). Unknown
  // or finished ids are ignored. Thread-safe.
  void Cancel(uint64_t request_id);

  // Starts draining instance `instance_id`: it takes no new request, its
  // requests run to their end (at most drain_timeout_ms; those left then
  // move or fail as if it went down), then its workers get an orderly
  // Shutdown and the instance is down until they register again (a node
  // agent starts them again: a rolling restart). Thread-safe; the engine
  // thread acts within one loop iteration. Errors: NotFound for an id the
  // config does not have; FailedPrecondition when the last health snapshot
  // shows the instance not ready or already draining. `why` is logged.
  Status Drain(int instance_id, const std::string& why);

  // Snapshot of every instance of the config, in Config::Instances order.
  // Thread-safe; refreshed by the engine thread every loop iteration.
  std::vector<InstanceHealth> Health() const;

  // The serving metrics (thread-safe; GET /metrics renders them).
  const ServingMetrics& metrics() const;

 private:
  struct Impl;
  struct Pending {
    uint64_t id;
    EngineRequest request;
    std::promise<CompletionOutcome> promise;
  };
  void Run();
  // Hands the engine thread what HTTP threads submitted and cancelled.
  void TakeSubmitted(std::vector<Pending>* submitted, std::vector<uint64_t>* cancelled);

  std::unique_ptr<Impl> impl_;
  HealthBoard health_;  // after impl_: built from its registry's first snapshot
  std::thread thread_;
  std::atomic<bool> stop_requested_{false};
  std::once_flag stop_once_;

  std::atomic<uint64_t> next_request_id_{1};
  mutable std::mutex mu_;  // guards the fields below
  std::vector<Pending> submitted_;          // guarded by mu_
  std::vector<uint64_t> cancelled_;         // guarded by mu_
  bool accepting_ = true;                   // guarded by mu_
  std::string stop_reason_;                 // guarded by mu_
};

}  // namespace headway
