// Disaggregated prefill and decode: where a request's prompt is computed,
// the prefill job on a prefill instance, the KV transfer of its blocks to a
// decode instance, and the handoff of the request to that instance
// (DESIGN.md "A request, end to end"). The transfer orchestrator beside the
// engine loop: the engine calls in when a request arrives, a job's prompt
// is computed, a TransferResult arrives, time passes or an instance goes
// down, and runs the handoffs it returns.
//
// On arrival the router picks the decode instance first, by what its
// prefix cache holds of the prompt, and Place decides where the prompt is
// computed (conditional disaggregation, as Dynamo's): on that decode
// instance, with no transfer, when the part it lacks is short
// (routing.max_local_prefill_tokens), when the prefill instance's queue is
// past routing.max_prefill_queue_tokens, or when the decode instance cannot
// reserve the blocks it would receive; otherwise on a prefill instance the
// router picks by its own hit. Each such decision is counted with its
// reason (LocalPrefillReason).
//
// A remote prefill starts only with its blocks reserved: Begin reserves, on
// the decode instance, the blocks its prefix cache lacks of the prompt's
// whole blocks (all but the block of the last position), then a
// prefill-only sequence (same id as the request) computes those blocks on
// the prefill instance. The job's blocks are then pinned there, the prefill
// ranks send the missing ones over UCX (TransferPlan) into the reservation,
// and the received blocks enter the decode instance's prefix cache. Each
// attempt's plans carry, per target, a write grant MACed with the receiving
// rank's write key (comm/kv_write_auth.h): receivers refuse block messages
// without one. The request then joins the decode instance like any other:
// its prefix lookup hits the received blocks (reported as transferred, not
// cached, tokens) and it computes only the rest of its prompt.
//
// Failures: a transfer that fails or passes its deadline (the plan's
// timeout_ms plus kTransferDeadlineSlack) is sent once more, with the same
// blocks on both sides; after a second failure the decode instance computes
// the whole prompt (a fallback, logged and counted with its
// TransferFallbackReason, as are the other fallbacks: the prefill instance
// going down, the decode instance going down during the prefill with no
// other able to reserve). The reserved blocks of a failed transfer are not
// reused until every sender has answered or is gone (draining): a late
// block must never land in a block that another sequence owns by then.
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
  // Prompt positions [received_from, received_to) that the transfer wrote
  // (Sequence::set_received_positions); both 0 unless transferred.
  int received_from = 0;
  int received_to = 0;
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

  // Where a prompt goes whose decode instance is `decode`: the prefill
  // instance that computes its whole blocks (the router's pick, with its
  // hit), or none and why the decode instance computes it itself.
  struct Placement {
    Instance* prefill = nullptr;        // nullptr: prefill on `decode`
    int64_t prefill_hit = 0;            // positions the prefill instance holds
    LocalPrefillReason reason = LocalPrefillReason::kShortUncached;  // when local
  };
  // `decode_hit`: the prompt positions `decode`'s prefix cache holds.
  // Changes nothing but the router's round-robin cursor.
  Placement Place(const TokenIds& prompt, Instance& decode, int64_t decode_hit);

  // Starts request `request_id`'s prefill job: reserves on `decode` the
  // blocks it lacks of the prompt's first PrefillPositions(...) positions,
  // then adds the prefill-only sequence to `prefill`.
  // REQUIRES: Place(...) chose `prefill` for `decode`, in this turn of the
  // engine loop (the reservation fits).
  // Errors: the prefill scheduler's refusal (InvalidArgument); nothing
  // changes then.
  Status Begin(uint64_t request_id, const EngineRequest& request, Instance& prefill,
               Instance& decode, Clock::time_point arrival);

  // True while the request is prefilling or transferring (its job exists).
  bool HasJob(uint64_t request_id) const { return jobs_.count(request_id) > 0; }

  // The job's prefill-only sequence on `prefill` is computed: removes it,
  // pins its blocks and sends the plans into the decode side's reservation
  // (made on another decode instance, if the one chosen went down).
  std::vector<Handoff> OnPrefillDone(Instance& prefill, uint64_t request_id);

  // A prefill rank answered a TransferPlan. A successful answer's send time
  // (TransferResult.seconds) is reported (ServingMetrics::OnKvTransferSent)
  // whether or not its attempt is still current.
  std::vector<Handoff> OnTransferResult(const proto::TransferResult& result);

  // Ends transfers past their deadline or whose instance went down, and
  // frees the reserved blocks of failed transfers once drained.
  std::vector<Handoff> CheckDeadlines(Clock::time_point now);

  // Instance `instance_id` went down (the registry has Reset it): jobs it
  // was prefilling fall back to their decode instance, which prefills them.
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
    int64_t full_positions = 0;       // whole blocks of the prompt: the prefill job's
    size_t have_blocks = 0;           // of those, the decode instance held at reserve
    bool transferring = false;
    bool cancelled = false;           // the client went away meanwhile
    int attempt = 0;                  // 1: the first transfer, 2: its retry
    uint64_t transfer_id = 0;         // of the current attempt
    int pending_results = 0;          // prefill ranks yet to answer it
    std::map<int, proto::TransferPlan> plans;  // by prefill rank, kept for the retry
    std::map<int, std::vector<int>> target_ranks;  // by prefill rank: each target's decode rank
    std::string error;                // of the current attempt
    TransferFallbackReason fallback = TransferFallbackReason::kTransferFailed;  // if it fails
    PinId pin;                        // on the prefill instance
    ReservationId reservation;        // on the decode instance, from Begin on
    bool reserved = false;            // `reservation` is the job's to end
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

  // Reserves on `decode` what it lacks of the job's whole blocks, if they
  // fit; false (and nothing changes) if they do not.
  bool TryReserveOn(Job& job, Instance& decode);
  // Positions of the job's whole blocks the decode instance held at reserve:
  // those are not moved.
  int64_t HavePositions(const Job& job) const {
    return int64_t(job.have_blocks) * config_.block_size;
  }
  // Gives back the job's reservation, if its decode instance still has it.
  void CancelReservation(Job& job);
  // Pins and plans the transfer of `job` (its prompt computed).
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
  // The handoff of a job that leaves (the caller erases it); a job that
  // was not transferred gives back its reservation and counts as a
  // fallback for job.fallback.
  void HandOff(Job& job, uint64_t request_id, bool transferred, std::vector<Handoff>* out);

  const Config& config_;
  const ModelSpec& spec_;
  // [block class] granules per block in KV transfer (common/kv_arena.h):
  // 1 with one KV cache dtype.
  std::vector<int> granules_per_block_;
  InstanceRegistry* const registry_;
  Router* const router_;
  ServingMetrics* const metrics_;
  std::unordered_map<uint64_t, Job> jobs_;            // by request id
  std::unordered_map<uint64_t, uint64_t> transfers_;  // transfer id -> request id
  std::unordered_map<uint64_t, Draining> draining_;   // by transfer id
  uint64_t next_transfer_id_ = 1;
};

}  // namespace headway
