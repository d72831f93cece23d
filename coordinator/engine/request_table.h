// The engine's requests between admission and their answer: for each one
// the instance its sequence (or prefill job) is on, its deadline, its
// promise, its OutputProcessor and its latency clocks (queue time, TTFT,
// inter-token latency, the disaggregated first decode step, reported to
// ServingMetrics as they happen). A request that ends leaves the table at
// once; its answer (the promise's value and, when streaming, the
// OutputStream's Close) waits in the table until AnswerEnded, which the
// engine calls after it has published the health snapshot, so a client that
// gets its answer sees the request's blocks back in /health.
//
// The table knows nothing of schedulers or transfers: the engine removes a
// request's sequence and its prefill job, then hands the sequence to End.
//
// Not thread-safe: everything runs on the engine thread. The promises are
// fulfilled and the streams closed from that thread too (AnswerEnded).
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "coordinator/engine/output_processor.h"
#include "coordinator/engine/request_output.h"
#include "coordinator/metrics/serving_metrics.h"
#include "coordinator/scheduling/scheduler.h"
#include "coordinator/scheduling/sequence.h"
#include "proto/control.pb.h"

namespace headway {

class RequestTable {
 public:
  // `metrics` receives every latency and finish the table records and must
  // outlive the table.
  explicit RequestTable(ServingMetrics* metrics);

  RequestTable(const RequestTable&) = delete;
  RequestTable& operator=(const RequestTable&) = delete;

  // ---- admission ---------------------------------------------------------
  // Holds request `id`, admitted on instance `instance_id` (a mixed or
  // decode instance, or the prefill instance of its prefill job). `output`
  // turns its sampled tokens into text and owns its stream, if any.
  // REQUIRES: id is not held; output != nullptr.
  void Add(uint64_t id, int instance_id, Clock::time_point deadline,
           std::promise<CompletionOutcome> promise, std::unique_ptr<OutputProcessor> output);

  // A request that could not be admitted: its answer, `status` (not OK),
  // waits for AnswerEnded like any other. `stream` (null unless streaming)
  // is closed with it. The request is never held.
  void Refuse(std::promise<CompletionOutcome> promise, std::shared_ptr<OutputStream> stream,
              Status status);

  // ---- lookups -----------------------------------------------------------
  bool Contains(uint64_t id) const { return requests_.count(id) > 0; }
  // The instance request `id` is on; nullopt for an id not held (never
  // admitted, or ended).
  std::optional<int> InstanceOf(uint64_t id) const;
  // Held requests on instance `instance_id`, in the table's iteration order.
  std::vector<uint64_t> OnInstance(int instance_id) const;
  // Held requests whose deadline is at or before `now`, in the table's
  // iteration order.
  std::vector<uint64_t> Expired(Clock::time_point now) const;
  // Every held request, in the table's iteration order.
  std::vector<uint64_t> Ids() const;
  size_t size() const { return requests_.size(); }

  // ---- progress ----------------------------------------------------------
  // Instance `instance_id` dispatched `batch` (planned by `scheduler`) at
  // `now`: each held request in it that had never been scheduled records
  // its queue time (ServingMetrics::OnScheduled), once per request, whether
  // it is then preempted or moves to a decode instance later.
  void RecordScheduled(int instance_id, const ScheduledBatch& batch, const Scheduler& scheduler,
                       Clock::time_point now);

  // A disaggregated request joined decode instance `instance_id` at `now`:
  // it is on that instance from here on, and its first token's latency
  // from `now` is reported (ServingMetrics::OnPdFirstDecode).
  // REQUIRES: Contains(id).
  void JoinedDecode(uint64_t id, int instance_id, Clock::time_point now);

  // Request `id`'s instance went down before the client was sent any of
  // its output; a new sequence from its prompt now runs on instance
  // `instance_id`. Tokens it had produced (a request that does not stream)
  // are dropped: its output starts again (OutputProcessor::Restarted). Its
  // clocks are kept: its TTFT counts from the client's arrival and is
  // recorded once; a token after the move is an inter-token latency from
  // the last one before it. REQUIRES: Contains(id).
  void MovedTo(uint64_t id, int instance_id);
  // True when request `id` streams its output (it has an OutputStream).
  // REQUIRES: Contains(id).
  bool Streams(uint64_t id) const { return requests_.at(id).output->stream() != nullptr; }

  // `seq`, the sequence of a held request on instance `instance_id`, was
  // sampled `sampled` (a token id in the vocabulary): appends the token to
  // `seq` at Clock::now(), records TTFT or the inter-token latency, and
  // passes the token (with its log-probabilities when the request asked
  // for them) to the request's OutputProcessor, which streams its text.
  // Returns true when the request is done (a stop condition): the caller
  // then ends it with an OK status. REQUIRES: Contains(seq.seq_id()).
  bool OnSampled(int instance_id, Sequence& seq, const proto::SampledToken& sampled);

  // Request `id`'s sequence computed the prompt logprobs `logprobs` (the
  // positions after those it had; `complete`: the last ones): passed to its
  // OutputProcessor. REQUIRES: Contains(id).
  void OnPromptLogprobs(uint64_t id, const proto::PromptLogprobs& logprobs, bool complete);

  // ---- ending ------------------------------------------------------------
  // Ends request `id`, which was on instance `instance_id`, and queues its
  // answer. `status` OK: the request finished; its outcome (text, finish
  // and stop reasons, counts, log-probabilities) comes from `seq` and its
  // OutputProcessor. Otherwise the outcome is `status` alone (Cancelled:
  // the client went away). A finished or cancelled request with a sequence
  // is counted by ServingMetrics::OnFinished (cancelled as kAbort); a failed
  // one is not. `seq` is the request's sequence, already removed from its
  // scheduler, or null (a prefill job, an instance that went down). No-op
  // for an id not held. REQUIRES: seq != nullptr when status is OK.
  void End(uint64_t id, int instance_id, std::unique_ptr<Sequence> seq, Status status);

  // Answers every request that ended since the last call, in the order
  // they ended: closes its stream (with the text not yet streamed and the
  // outcome), then fulfils its promise.
  void AnswerEnded();
  // Answers queued and not yet given.
  size_t num_unanswered() const { return answers_.size(); }

 private:
  // A request between admission and its answer.
  struct ActiveRequest {
    int instance = 0;  // where its sequence (or prefill job) is
    Clock::time_point deadline;
    std::promise<CompletionOutcome> promise;
    std::unique_ptr<OutputProcessor> output;
    bool scheduled = false;                          // queue time recorded
    bool first_token = false;                        // TTFT recorded
    Clock::time_point last_token_time;               // for inter-token latency
    std::optional<Clock::time_point> joined_decode;  // disaggregated: when it reached decode
  };
  // An ended request, answered by AnswerEnded.
  struct Answer {
    std::promise<CompletionOutcome> promise;
    CompletionOutcome outcome;
    std::shared_ptr<OutputStream> stream;
    std::string unstreamed_text;  // the end of the answer not yet pushed
  };

  ServingMetrics* const metrics_;
  std::unordered_map<uint64_t, ActiveRequest> requests_;  // by request id
  std::vector<Answer> answers_;                           // in the order they ended
};

}  // namespace headway
