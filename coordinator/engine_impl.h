// The engine's internal state (Engine::Impl), shared by the files that
// implement it: engine.cc (messages, steps, requests, liveness) and
// disaggregation.cc (prefill jobs, KV transfers, the handoff to decode).
// Everything here runs on the engine thread only.
#pragma once

#include <spdlog/spdlog.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/engine.h"
#include "coordinator/kv_cache_manager.h"
#include "coordinator/scheduler.h"

namespace headway {

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Engine::Impl {
  struct RankState {
    bool registered = false;
    int num_blocks = 0;
    Clock::time_point last_heard;
    proto::KvEndpoint kv_endpoint;  // where senders write this rank's blocks
  };
  struct InFlight {
    uint64_t step_id = 0;
    ScheduledBatch batch;
    std::vector<bool> answered;         // [tp_size]
    std::vector<proto::SampledToken> tokens;  // rank 0's
    std::string error;                  // first rank error
  };
  struct InstanceState {
    int id = 0;
    int tp_size = 1;
    PoolRole role = PoolRole::kMixed;
    std::vector<RankState> ranks;
    std::unique_ptr<Scheduler> scheduler;  // non-null while ready
    uint64_t generation = 0;               // +1 each time the instance becomes ready
    uint64_t next_step_id = 1;
    std::optional<InFlight> in_flight;
    // Rendezvous store of this instance's ranks (proto StoreSet/StoreGet).
    std::map<std::string, std::string> store;
    bool ready() const { return scheduler != nullptr; }
    // Scheduler counters already reported to the metrics.
    size_t reported_preemptions = 0;
    uint64_t reported_recycled = 0;
    PrefixCacheStats reported_prefix;
  };
  struct RequestState {
    int instance = 0;
    Clock::time_point deadline;
    std::promise<CompletionOutcome> promise;
    std::unique_ptr<StreamDecoder> decoder;
    std::string text;
    bool logprobs = false;
    std::vector<GeneratedToken> tokens;     // when logprobs
    std::shared_ptr<OutputStream> stream;   // streaming requests only
    size_t num_streamed = 0;                // bytes of `text` pushed to stream
    bool scheduled = false;                 // queue time recorded
    Clock::time_point last_token_time;      // for inter-token latency
    std::optional<Clock::time_point> joined_decode;  // disaggregated: when it reached its decode instance
  };
  // An ended request, answered after the health snapshot is published.
  struct Completed {
    std::promise<CompletionOutcome> promise;
    CompletionOutcome outcome;
    std::shared_ptr<OutputStream> stream;
    std::string unstreamed_text;  // the end of the answer not yet pushed
  };

  Impl(Config c, ModelSpec s, const Tokenizer* t, std::unique_ptr<ControlServer> srv)
      : config(std::move(c)), spec(std::move(s)), tokenizer(t), server(std::move(srv)) {
    std::vector<const InstanceConfig*> configs = config.Instances();
    for (size_t i = 0; i < configs.size(); ++i) {
      InstanceState inst;
      inst.id = int(i);
      inst.tp_size = configs[i]->tp_size;
      inst.role = config.RoleOf(int(i));
      inst.ranks.resize(inst.tp_size);
      instances.push_back(std::move(inst));
      for (int r = 0; r < configs[i]->tp_size; ++r) peers[PeerName(int(i), r)] = {int(i), r};
      tp_sizes.push_back(configs[i]->tp_size);
    }
    Result<std::unique_ptr<ServingMetrics>> m =
        ServingMetrics::Create(config.served_model_name, tp_sizes);
    HW_CHECK(m.ok());  // the config has passed validation: at least one instance
    metrics = std::move(*m);
  }

  // Reports what the scheduler counted since the last call.
  void ReportSchedulerCounters(InstanceState& inst);
  // Publishes queue and KV-usage gauges from a health snapshot.
  void ReportGauges(const std::vector<InstanceHealth>& health);

  // ---- messages -------------------------------------------------------
  void Handle(const Inbound& in);
  void HandleRegister(const std::string& peer, const proto::RegisterRequest& req);
  void HandleStore(InstanceState& inst, const std::string& peer, const proto::Envelope& env);
  void HandleStepResult(InstanceState& inst, int rank, const proto::StepResult& result);
  void Send(InstanceState& inst, int rank, const proto::Envelope& env);

  // ---- steps ----------------------------------------------------------
  void Dispatch(InstanceState& inst);
  void Complete(InstanceState& inst);
  void OnSampled(InstanceState& inst, Sequence& seq, const proto::SampledToken& sampled);

  // ---- disaggregation: prefill -> KV transfer -> decode ------------------
  // A request of a deployment with prefill and decode pools first runs as a
  // prefill job: its prompt's whole blocks (all but the last position's
  // block) are computed on a prefill instance by an internal sequence. The
  // job's blocks are then pinned there, the decode instance allocates only
  // the blocks its prefix cache lacks, the prefill ranks write them over UCX
  // (TransferPlan), and the received blocks enter the decode instance's
  // prefix cache. The request then joins the decode instance like any other:
  // its prefix lookup hits the transferred blocks and it computes only the
  // rest of its prompt.
  //
  // Failures: a transfer that fails or passes its deadline (the plan's
  // timeout_ms plus kTransferDeadlineSlack) is sent once more, with the same
  // blocks on both sides; after a second failure the decode instance
  // computes the whole prompt (a fallback). The receiving blocks of a failed
  // transfer are not reused until every writer has answered or is gone
  // (Draining): a late put must never land in a block that another sequence
  // owns by then.
  struct PdJob {
    uint64_t request_id = 0;
    EngineRequest request;          // admitted to the decode instance at the end
    int prefill = -1;               // instance ids
    int decode = -1;
    uint64_t prefill_generation = 0;  // InstanceState::generation when chosen
    uint64_t decode_generation = 0;
    int64_t full_positions = 0;     // positions moved: whole blocks of the prompt
    bool transferring = false;
    bool cancelled = false;         // the client went away meanwhile
    int attempt = 0;                // 1: the first transfer, 2: its retry
    uint64_t transfer_id = 0;       // of the current attempt
    int pending_results = 0;        // prefill ranks yet to answer it
    std::map<int, proto::TransferPlan> plans;  // by prefill rank, kept for the retry
    std::string error;              // of the current attempt
    uint64_t bytes = 0, blocks = 0;
    Clock::time_point arrival;           // the client's request
    Clock::time_point started;           // the first attempt
    Clock::time_point deadline;          // of the current attempt
  };
  // The receiving blocks of a failed transfer, held until its writers have
  // answered (pending_results reaches 0), or release_at passes.
  struct Draining {
    int decode = -1;
    uint64_t decode_generation = 0;
    uint64_t recv_seq_id = 0;
    int pending_results = 0;
    Clock::time_point release_at;
  };
  static constexpr uint64_t kJobBit = uint64_t(1) << 62;    // the prefill job's sequence
  static constexpr uint64_t kPinBit = uint64_t(1) << 61;    // its pinned blocks on the prefill side
  static constexpr uint64_t kRecvBit = uint64_t(1) << 60;   // the receiving blocks on the decode side
  bool Disaggregated() const;
  InstanceState* LeastLoaded(PoolRole role);
  // True while instance `id` is ready and has not restarted since `generation`.
  bool Alive(int id, uint64_t generation) const;
  // Adds request `id`'s sequence to `inst`'s scheduler; `arrival` starts its
  // TTFT and queue-time clocks. Error: the scheduler's refusal.
  Status AddSequence(InstanceState& inst, uint64_t id, const EngineRequest& request,
                     Clock::time_point arrival);
  void OnPrefillDone(InstanceState& prefill, uint64_t job_id);
  // Sends the job's plans under a new transfer id (attempt + 1).
  void SendTransfer(PdJob& job, uint64_t job_id);
  void HandleTransferResult(const proto::TransferResult& result);
  // Ends the current attempt: retries once after a failure, then hands the
  // request to a decode instance (with the blocks, or for a fallback).
  void EndTransfer(uint64_t job_id, bool ok);
  void JoinDecode(PdJob& job, bool transferred);
  void DropJob(uint64_t request_id);
  void CheckTransferDeadlines(Clock::time_point now);
  std::unordered_map<uint64_t, PdJob> jobs;              // by job sequence id
  std::unordered_map<uint64_t, uint64_t> transfers;      // transfer id -> job sequence id
  std::unordered_map<uint64_t, Draining> draining;       // by transfer id
  uint64_t next_transfer_id = 1;

  // ---- requests -------------------------------------------------------
  void Admit(uint64_t id, EngineRequest request, std::promise<CompletionOutcome> promise);
  void FinishRequest(InstanceState& inst, uint64_t id, std::optional<ApiError> error);
  void Cancel(uint64_t id, ApiError why);
  void CheckDeadlines(Clock::time_point now);

  // ---- liveness -------------------------------------------------------
  void SendHeartbeats(Clock::time_point now);
  void CheckLiveness(Clock::time_point now);
  // Fails every request of the instance and forgets its ranks; the instance
  // is ready again once all its ranks register anew.
  void MarkDown(InstanceState& inst, const std::string& why);
  // Tells the instance's registered ranks to exit (their TP group is broken).
  void StopRanks(InstanceState& inst, const std::string& reason);
  void Shutdown(const std::string& reason);

  std::vector<InstanceHealth> Snapshot() const;

  const Config config;
  const ModelSpec spec;
  const Tokenizer* const tokenizer;
  std::unique_ptr<ControlServer> server;
  std::vector<int> tp_sizes;  // per instance
  std::unique_ptr<ServingMetrics> metrics;
  std::vector<InstanceState> instances;
  std::map<std::string, std::pair<int, int>> peers;  // routing identity -> (instance, rank)
  std::unordered_map<uint64_t, RequestState> requests;
  // Ended requests, answered by Run after it publishes the health snapshot,
  // so a client that gets its answer sees the blocks back in /health.
  std::vector<Completed> completed;

  void AnswerCompleted() {
    for (Completed& c : completed) {
      if (c.stream) c.stream->Close(c.unstreamed_text, c.outcome);
      c.promise.set_value(std::move(c.outcome));
    }
    completed.clear();
  }
  Clock::time_point last_heartbeat_sent;
};

}  // namespace headway
