// Disaggregated prefill and decode: a request's prefill job on a prefill
// instance, the KV transfer of its blocks to a decode instance, and the
// handoff of the request to that instance (DESIGN.md "A request, end to
// end"). The transfer orchestrator beside the engine loop: the engine calls
// in when a job's prompt is computed, a TransferResult arrives, time passes
// or an instance goes down, and runs the handoffs it returns.
//
// A request whose prompt has at least one whole block besides its last
// position first runs as a prefill job: a prefill-only sequence (same id as
// the request) computes those whole blocks on a prefill instance. The
// job's blocks are then pinned there, the decode instance reserves only the
// blocks its prefix cache lacks, the prefill ranks send them over UCX
// (TransferPlan) and the received blocks enter the decode instance's prefix
// cache. Each attempt's plans carry, per target, a write grant MACed with
// the receiving rank's write key (comm/kv_write_auth.h): receivers refuse
// block messages without one. The request then joins the decode instance like any other: its
// prefix lookup hits the received blocks and it computes only the rest of
// its prompt.
//
// Failures: a transfer that fails or passes its deadline (the plan's
// timeout_ms plus kTransferDeadlineSlack) is sent once more, with the same
// blocks on both sides; after a second failure the decode instance computes
// the whole prompt (a fallback). The reserved blocks of a failed transfer
// are not reused until every sender has answered or is gone (draining): a
// late block must never land in a block that another sequence owns by then.
//
// Not thread-safe: the engine thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/config.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "coordinator/engine/engine_request.h"
#include "coordinator/engine/instance_registry.h"
#include "coordinator/engine/router.h"
#include "coordinator/metrics/serving_metrics.h"

namespace headway {

// A request leaving the disaggregation coordinator: it joins a decode
// instance (with its prompt's blocks received, or to prefill them itself),
// or fails.
struct Handoff {
  uint64_t request_id = 0;
  EngineRequest request;
  Clock::time_point arrival;  // the client's: TTFT counts prefill and transfer
  int decode = -1;            // the decode instance to join if ready; -1 = any
  bool transferred = false;   // its blocks are in the decode instance's cache
  Status status;              // not OK: the request fails with this instead
};

class DisaggregationCoordinator {
 public:
  // `registry`, `router` and `metrics` must outlive the coordinator. The
  // router chooses each job's decode instance once its prefill is done.
  DisaggregationCoordinator(const Config& config, const ModelSpec& spec,
                            InstanceRegistry* registry, Router* router, ServingMetrics* metrics);

  DisaggregationCoordinator(const DisaggregationCoordinator&) = delete;
  DisaggregationCoordinator& operator=(const DisaggregationCoordinator&) = delete;

  // Positions a prefill instance computes for a prompt of `prompt_length`
  // tokens: its whole blocks, all but the block of the last position. 0:
  // nothing to transfer, the request goes straight to a decode instance.
  int64_t PrefillPositions(size_t prompt_length) const;

  // Starts request `request_id`'s prefill job on `prefill` over its prompt's
  // first PrefillPositions(...) positions (> 0). Errors: the scheduler's
  // refusal (InvalidArgument); nothing changes then.
  Status Begin(uint64_t request_id, const EngineRequest& request, Instance& prefill,
               Clock::time_point arrival);

  // True while the request is prefilling or transferring (its job exists).
  bool HasJob(uint64_t request_id) const { return jobs_.count(request_id) > 0; }

  // The job's prefill-only sequence on `prefill` is computed: removes it,
  // pins its blocks, reserves the decode side's and sends the plans.
  std::vector<Handoff> OnPrefillDone(Instance& prefill, uint64_t request_id);

  // A prefill rank answered a TransferPlan. A successful answer's send time
  // (TransferResult.seconds) is reported (ServingMetrics::OnKvTransferSent)
  // whether or not its attempt is still current.
  std::vector<Handoff> OnTransferResult(const proto::TransferResult& result);

  // Ends transfers past their deadline or whose instance went down, and
  // frees the reserved blocks of failed transfers once drained.
  std::vector<Handoff> CheckDeadlines(Clock::time_point now);

  // Instance `instance_id` went down (the registry has Reset it): jobs it
  // was prefilling fall back to a decode instance, which prefills them.
  std::vector<Handoff> OnInstanceDown(int instance_id);

  // The request ended (finished, failed, cancelled): its job goes, its
  // prefill sequence with it; a transfer in progress ends first.
  void Drop(uint64_t request_id);

  size_t num_jobs() const { return jobs_.size(); }
  size_t num_draining() const { return draining_.size(); }

 private:
  struct Job {
    EngineRequest request;            // handed to the decode instance at the end
    int prefill = -1;                 // instance ids
    int decode = -1;
    uint64_t prefill_generation = 0;  // Instance::generation when chosen
    uint64_t decode_generation = 0;
    int64_t full_positions = 0;       // positions moved: whole blocks of the prompt
    bool transferring = false;
    bool cancelled = false;           // the client went away meanwhile
    int attempt = 0;                  // 1: the first transfer, 2: its retry
    uint64_t transfer_id = 0;         // of the current attempt
    int pending_results = 0;          // prefill ranks yet to answer it
    std::map<int, proto::TransferPlan> plans;  // by prefill rank, kept for the retry
    std::map<int, std::vector<int>> target_ranks;  // by prefill rank: each target's decode rank
    std::string error;                // of the current attempt
    PinId pin;                        // on the prefill instance
    ReservationId reservation;        // on the decode instance
    uint64_t bytes = 0, blocks = 0;
    Clock::time_point arrival;        // the client's request
    Clock::time_point started;        // the first attempt
    Clock::time_point deadline;       // of the current attempt
  };
  // The reserved blocks of a failed transfer, held until its senders have
  // answered (pending_results reaches 0), or release_at passes.
  struct Draining {
    int decode = -1;
    uint64_t decode_generation = 0;
    ReservationId reservation;
    int pending_results = 0;
    Clock::time_point release_at;
  };

  // Pins, reserves and plans the transfer of `job` (its prompt computed).
  void StartTransfer(uint64_t request_id, Job& job, Instance& prefill, Instance& decode,
                     std::vector<Handoff>* out);
  // Sends the job's plans under a new transfer id (attempt + 1), each target
  // with a write grant MACed with its decode rank's write key. A grant that
  // cannot be made (a bad key: a bug, registration checks keys) ends the
  // transfer as failed, without a retry.
  void SendTransfer(Job& job, uint64_t request_id, std::vector<Handoff>* out);
  // Ends the current attempt at `now`: retries once after a failure, then
  // hands the request to a decode instance (with the blocks, or for a
  // fallback).
  void EndTransfer(uint64_t request_id, bool ok, Clock::time_point now, std::vector<Handoff>* out);
  // The handoff of a job that leaves (the caller erases it).
  void HandOff(Job& job, uint64_t request_id, bool transferred, std::vector<Handoff>* out);

  const Config& config_;
  const ModelSpec& spec_;
  InstanceRegistry* const registry_;
  Router* const router_;
  ServingMetrics* const metrics_;
  std::unordered_map<uint64_t, Job> jobs_;            // by request id
  std::unordered_map<uint64_t, uint64_t> transfers_;  // transfer id -> request id
  std::unordered_map<uint64_t, Draining> draining_;   // by transfer id
  uint64_t next_transfer_id_ = 1;
};

}  // namespace headway
