// Headway's serving metrics, named after vLLM's (vllm/v1/metrics/loggers.py)
// with the prefix `headway:` so that dashboards and scrapers written for
// vLLM work after a rename of the prefix.
//
//   histograms (seconds; vLLM's bucket bounds)
//     headway:time_to_first_token_seconds    arrival -> first output token
//     headway:inter_token_latency_seconds    between consecutive output tokens
//     headway:e2e_request_latency_seconds    arrival -> finish
//     headway:request_queue_time_seconds     arrival -> first scheduled
//     headway:step_seconds                   a step: plan sent -> every rank's result in
//     headway:step_worker_seconds            a step on the slowest rank, by its clock (the
//                                            rest of step_seconds is the control messages'
//                                            transit and queueing)
//     headway:step_gap_seconds               a step's results in -> the next plan sent, when
//                                            the instance still had work (sequences to run,
//                                            or ended ones its workers must drop): the
//                                            coordinator's own time per step
//   gauges
//     headway:num_requests_running, headway:num_requests_waiting
//     headway:kv_cache_usage_perc            0..1, the fullest TP rank of the instance
//     headway:kv_cache_rank_usage_perc       0..1, per TP rank (extra label tp_rank)
//     headway:kv_cache_retained_blocks       per TP rank (extra label tp_rank): cached blocks
//                                            no sequence's row holds whose entry is still
//                                            referenced (e.g. a prompt's retained window)
//     headway:kv_arena_chunks                per TP rank (extra labels tp_rank, owner): the KV
//                                            arena's chunks lent to each block class, by its
//                                            KV cache dtype (owner float32, q8_0, ...), and
//                                            the free ones (owner free); common/kv_arena.h
//     headway:instance_state                 1 for the instance's state, else 0 (extra label
//                                            state: down | joining | ready | draining | vacant)
//   counters (tokens unless said otherwise)
//     headway:prefix_cache_queries_total, headway:prefix_cache_hits_total
//     headway:prompt_tokens_total, headway:generation_tokens_total
//     headway:num_preemptions_total          preempted sequences
//     headway:kv_blocks_recycled_total       sliding-window blocks returned to the pools
//                                            (recycling frees sliding slots' blocks only)
//     headway:routed_requests_total          requests the router placed on the instance
//     headway:routed_prefix_hit_tokens_total their tokens its prefix cache held at that moment
//     headway:kv_blocks_evicted_total        blocks freed by prefix-cache eviction, extra
//                                            label slot_kind (full | sliding)
//     headway:request_success_total          finished requests, extra label finished_reason
//                                            (stop | length | abort, as vLLM)
//     headway:metrics_rejected_observations_total  calls below dropped as invalid
//   deployment-wide, prefill/decode disaggregation (label model_name only)
//     headway:kv_transfer_bytes_total, headway:kv_transfer_blocks_total
//     headway:kv_transfer_tokens_total       prompt positions moved (the KV of one token each)
//     headway:kv_transfer_fallbacks_total    requests prefilled by their decode instance after
//                                            a remote prefill was planned, extra label reason
//                                            (TransferFallbackReasonName)
//     headway:pd_remote_prefills_total       requests planned for a prefill instance
//     headway:pd_local_prefills_total        requests prefilled by their decode instance by
//                                            decision, extra label reason (LocalPrefillReasonName)
//     headway:kv_transfer_seconds            histogram: a transfer, plan sent -> last result
//     headway:kv_transfer_send_seconds       histogram: one prefill rank's send, its own clock
//     headway:pd_prefill_seconds, headway:pd_first_decode_seconds  histograms: TTFT's parts
//   deployment-wide, failover (label model_name only)
//     headway:requests_moved_total           requests moved to another instance of their pool
//                                            when theirs went down before their client was
//                                            sent any output
//     headway:instance_drains_total          drains that ended (the instance let its
//                                            workers go, its requests done or moved)
//
// Every other series has the labels model_name (the served model name) and
// instance (the instance id of Config::Instances(), as a decimal string).
// Note for scrape configs: Prometheus renames a scraped `instance` label to
// `exported_instance` unless the job sets honor_labels: true.
//
// Thread-safety: every method may be called from any thread (the engine
// thread and HTTP threads). The On*/Set* methods never fail and never
// crash: an invalid call (unknown instance id, negative or NaN duration,
// negative token count, hits > queries) changes nothing but
// headway:metrics_rejected_observations_total, so counters never go down.
#pragma once

#include <cstdint>
#include <memory>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/scheduling/instance_counters.h"
#include "coordinator/metrics/metrics.h"
#include "coordinator/scheduling/sequence.h"

namespace headway {

// Where an instance is in its life, as /health and headway:instance_state
// report it: no rank registered (down; vacant for a standby slot of a pool,
// which nothing runs until the pool grows), some (joining), all and
// admitting (ready), all and taking no new request (draining).
enum class InstanceState { kDown, kJoining, kReady, kDraining, kVacant };
inline constexpr int kNumInstanceStates = 5;
// "down", "joining", "ready", "draining", "vacant".
const char* InstanceStateName(InstanceState state);

// Why a request of a prefill/decode deployment is prefilled by its decode
// instance, decided when it arrives (coordinator/engine/disaggregation.h):
//   short_uncached       the part of the prompt that instance lacks is at most
//                        routing.max_local_prefill_tokens, or holds no whole
//                        block to move
//   prefill_queue_full   the prefill instance has more than
//                        routing.max_prefill_queue_tokens queued
//   decode_no_room       the decode instance cannot reserve the blocks it
//                        would receive
//   no_prefill_instance  no prefill instance is ready
//   prefix_caching_off   cache.enable_prefix_caching is false: a prefill
//                        instance keeps no blocks to send
//   prompt_logprobs      the request wants prompt logprobs, which come from
//                        the logits of the instance that computes the prompt
enum class LocalPrefillReason {
  kShortUncached, kPrefillQueueFull, kDecodeNoRoom, kNoPrefillInstance, kPrefixCachingOff,
  kPromptLogprobs
};
inline constexpr int kNumLocalPrefillReasons = 6;
const char* LocalPrefillReasonName(LocalPrefillReason reason);

// Why a planned remote prefill ended with the decode instance computing the
// prompt after all:
//   transfer_failed         the transfer failed or timed out twice
//   prefill_instance_down   the prefill instance went down
//   decode_instance_down    the decode instance went down during the prefill
//                           and no other could reserve the blocks
//   prefill_blocks_evicted  the prefill instance no longer held the blocks
//   plan_error              the transfer could not be planned (a bug; logged)
enum class TransferFallbackReason {
  kTransferFailed, kPrefillInstanceDown, kDecodeInstanceDown, kPrefillBlocksEvicted, kPlanError
};
inline constexpr int kNumTransferFallbackReasons = 5;
const char* TransferFallbackReasonName(TransferFallbackReason reason);

// Bucket upper bounds in seconds, copied from vLLM's PrometheusStatLogger.
const std::vector<double>& TtftBucketsSeconds();            // 22 bounds, 0.001 .. 2560
const std::vector<double>& InterTokenLatencyBucketsSeconds();  // 19 bounds, 0.01 .. 80
const std::vector<double>& RequestLatencyBucketsSeconds();  // 21 bounds, 0.3 .. 7680 (e2e, queue)
// Headway's own, for the step protocol's two halves: a decode step on a CPU
// takes milliseconds and the coordinator's gap between steps a fraction of
// one, below vLLM's finest latency bucket.
const std::vector<double>& StepBucketsSeconds();     // 16 bounds, 0.0005 .. 30
const std::vector<double>& StepGapBucketsSeconds();  // 14 bounds, 0.00002 .. 0.5

class ServingMetrics {
 public:
  // Registers the metric set of the model served as `model_name` for one
  // instance per entry of `instance_tp_sizes` (instance ids in that order,
  // as Config::Instances(); each entry the instance's tp_size). Every series
  // exists from the start at zero, so a scrape before any request already
  // shows the full set.
  // Errors: InvalidArgument if instance_tp_sizes is empty or has an entry < 1.
  static Result<std::unique_ptr<ServingMetrics>> Create(const std::string& model_name,
                                                        const std::vector<int>& instance_tp_sizes);

  ~ServingMetrics();
  ServingMetrics(const ServingMetrics&) = delete;
  ServingMetrics& operator=(const ServingMetrics&) = delete;

  // A request left the waiting queue for its first schedule on
  // `instance_id`, `queue_seconds` after it arrived. Call once per request
  // (not again when a preempted request is rescheduled), as vLLM does.
  void OnScheduled(int instance_id, double queue_seconds);

  // A request produced its first output token, `ttft_seconds` after it
  // arrived (queue time included). Once per request.
  void OnFirstToken(int instance_id, double ttft_seconds);

  // A request produced an output token after its first one,
  // `itl_seconds` after the previous token of the same request.
  void OnToken(int instance_id, double itl_seconds);

  // A step of the instance finished `seconds` after its first plan was
  // sent: sending the plans, the workers' compute and both control
  // messages' transit. Its slowest
  // rank took `worker_seconds` of it by its own clock.
  void OnStep(int instance_id, double seconds, double worker_seconds);
  // The instance's next step was sent `seconds` after the previous one's
  // results were all in: output processing, scheduling, building the plans,
  // and any wait for KV memory or a KV transfer. Call
  // only when the instance still had work when that step finished
  // (Scheduler::HasWork), so idle time is never counted.
  void OnStepGap(int instance_id, double seconds);

  // A request ended with `reason` (kStop, kLength or kAbort; kNone is
  // rejected) `e2e_seconds` after it arrived. Adds its prompt length and the
  // number of output tokens it produced to the token counters: tokens are
  // counted once per request, at its end, so these counters agree exactly
  // with the usage the API reported. Requests that failed (no completion
  // returned: instance down, worker error) are not reported here.
  void OnFinished(int instance_id, FinishReason reason, double e2e_seconds, int64_t prompt_tokens,
                  int64_t generation_tokens);

  // `num_sequences` running sequences were preempted (blocks freed, to be
  // recomputed). Call each time a sequence is preempted.
  void OnPreemption(int instance_id, int64_t num_sequences = 1);
  // Blocks of sliding-window slots that left every window and went back to
  // the instance's pools (DESIGN.md "Recycling"); num_blocks >= 0.
  void OnKvBlocksRecycled(int instance_id, int64_t num_blocks);
  // Prefix-cache eviction freed `full_blocks` blocks of full-attention slots
  // and `sliding_blocks` of sliding-window slots; both >= 0.
  void OnKvBlocksEvicted(int instance_id, int64_t full_blocks, int64_t sliding_blocks);

  // A prefix-cache lookup for `queried_tokens` prompt tokens found the first
  // `hit_tokens` of them cached. REQUIRES (else rejected): 0 <= hit_tokens
  // <= queried_tokens. Call once per lookup that decides a prefill.
  void OnPrefixCacheQuery(int instance_id, int64_t queried_tokens, int64_t hit_tokens);

  // The router placed a request on the instance, which held `hit_tokens`
  // of it in its prefix cache then (coordinator/engine/router.h).
  // REQUIRES (else rejected): hit_tokens >= 0.
  void OnRouted(int instance_id, int64_t hit_tokens);
  // A KV transfer between instances finished: `bytes` and `blocks` holding
  // `tokens` prompt positions moved in `seconds` (plan sent to last
  // result). Deployment-wide series: headway:kv_transfer_bytes_total,
  // headway:kv_transfer_blocks_total, headway:kv_transfer_tokens_total,
  // headway:kv_transfer_seconds (histogram).
  void OnKvTransfer(uint64_t bytes, uint64_t blocks, uint64_t tokens, double seconds);
  // A prefill rank sent its blocks of one KV transfer plan in `seconds`, by
  // its own clock (proto TransferResult.seconds, successful sends only):
  // headway:kv_transfer_send_seconds (histogram), one observation per rank
  // and attempt. A negative, NaN or infinite `seconds` is rejected; the
  // series has no instance, so the rejection counts under instance
  // "unknown".
  void OnKvTransferSent(double seconds);
  // A request was prefilled by its decode instance after a remote prefill
  // had been planned for it (headway:kv_transfer_fallbacks_total).
  void OnKvTransferFallback(TransferFallbackReason reason);
  // Where a disaggregated request's prompt is computed, decided on arrival:
  // on a prefill instance (headway:pd_remote_prefills_total), or on its
  // decode instance for `reason` (headway:pd_local_prefills_total).
  void OnRemotePrefill();
  void OnLocalPrefill(LocalPrefillReason reason);
  // TTFT of a disaggregated request, split: arrival to the end of its
  // prefill on the prefill instance (headway:pd_prefill_seconds), then the
  // KV transfer (headway:kv_transfer_seconds), then joining the decode
  // instance to the first token (headway:pd_first_decode_seconds).
  void OnPdPrefill(double seconds);
  void OnPdFirstDecode(double seconds);
  // A request's instance went down before the request produced a token; it
  // moved to another instance of its pool (headway:requests_moved_total).
  void OnRequestMoved();
  // A drain ended (headway:instance_drains_total).
  void OnInstanceDrained();

  // The instance is now in `state` (headway:instance_state). Call after
  // each change; cheap enough for every engine iteration.
  void SetInstanceState(int instance_id, InstanceState state);

  // The instance's scheduler now runs `num_running` sequences and holds
  // `num_waiting` in its queue. Call after each schedule.
  void SetQueueState(int instance_id, int64_t num_running, int64_t num_waiting);

  // TP rank `tp_rank` of the instance has `used_blocks` of `total_blocks`
  // KV blocks in use (prefix-cached blocks nobody references count as free,
  // as in vLLM). total_blocks == 0 (rank not ready) reads as usage 0.
  // REQUIRES (else rejected): 0 <= tp_rank < the instance's tp_size,
  // 0 <= used_blocks <= total_blocks.
  void SetKvUsage(int instance_id, int tp_rank, int64_t used_blocks, int64_t total_blocks);
  // Retained blocks of one TP rank (RankBlockUsage::num_retained); >= 0.
  void SetKvRetained(int instance_id, int tp_rank, int64_t retained_blocks);
  // Chunks of TP rank `tp_rank`'s KV arena lent to `owner` (a KV cache
  // dtype's name) or free (owner "free"). REQUIRES (else rejected): 0 <=
  // tp_rank < the instance's tp_size, chunks >= 0, owner not empty.
  void SetKvArenaChunks(int instance_id, int tp_rank, const std::string& owner, int64_t chunks);

  // The counters that instance `instance_id`'s scheduler and KV cache
  // manager feed as events happen (OnPreemption, OnPrefixCacheQuery,
  // OnKvBlocksRecycled of that instance). Owned by this object.
  // REQUIRES: 0 <= instance_id < the number of instances.
  InstanceCounters* Counters(int instance_id);

  // The whole set in Prometheus text format 0.0.4; serve it with
  // Content-Type kPrometheusContentType (coordinator/metrics.h).
  std::string RenderPrometheus() const { return registry_.RenderPrometheus(); }

  // The registry behind the set, to register more metrics next to it.
  MetricRegistry& registry() { return registry_; }

 private:
  // Series of one instance, resolved once so that the hot path takes no
  // family lock.
  struct InstanceSeries {
    Histogram* ttft = nullptr;
    Histogram* itl = nullptr;
    Histogram* e2e = nullptr;
    Histogram* queue = nullptr;
    Histogram* step = nullptr;
    Histogram* step_worker = nullptr;
    Histogram* step_gap = nullptr;
    Gauge* running = nullptr;
    Gauge* waiting = nullptr;
    Gauge* kv_usage = nullptr;
    std::vector<Gauge*> state;  // [kNumInstanceStates], by InstanceState
    Counter* prefix_queries = nullptr;
    Counter* prefix_hits = nullptr;
    Counter* prompt_tokens = nullptr;
    Counter* generation_tokens = nullptr;
    Counter* preemptions = nullptr;
    Counter* blocks_recycled = nullptr;
    Counter* routed = nullptr;
    Counter* routed_hits = nullptr;
    Counter* blocks_evicted_full = nullptr;
    Counter* blocks_evicted_sliding = nullptr;
    Counter* success_stop = nullptr;
    Counter* success_length = nullptr;
    Counter* success_abort = nullptr;
    Counter* rejected = nullptr;
    std::vector<Gauge*> rank_kv_usage;  // [tp_size]
    std::vector<Gauge*> rank_retained;  // [tp_size]
    // (tp_rank, owner) -> headway:kv_arena_chunks, resolved on first use
    // (owners are the deployment's dtypes); guarded by kv_mu_.
    std::map<std::pair<int, std::string>, Gauge*> arena_chunks;
  };

  ServingMetrics(std::string model_name, std::vector<int> instance_tp_sizes);
  // Registers every family and resolves every series, in render order: the
  // per-instance families, each instance's series, then the deployment-wide
  // (KV transfer, disaggregation) series.
  Status Register();
  struct InstanceFamilies;
  Status AddLatencyFamilies(InstanceFamilies* f);  // the per-instance histograms
  Status AddUsageFamilies(InstanceFamilies* f);    // queue and KV usage gauges
  Status AddCounterFamilies(InstanceFamilies* f);  // tokens, preemptions, finishes, rejections
  Status ResolveInstanceSeries(const InstanceFamilies& f, int instance_id);
  Status RegisterDeploymentSeries();
  // A family labelled model_name only, and its one series.
  Result<Counter*> AddDeploymentCounter(const std::string& name, const std::string& help);
  // A deployment-wide counter family with the extra label `reason`: one
  // series per name in `reasons`, in that order.
  Result<std::vector<Counter*>> AddDeploymentCountersByReason(
      const std::string& name, const std::string& help, const std::vector<const char*>& reasons);
  Result<Histogram*> AddDeploymentHistogram(const std::string& name, const std::string& help,
                                            const std::vector<double>& bounds);
  void Reject(int instance_id);
  // Observes `seconds` in the instance's histogram `series`; an invalid
  // duration is rejected, an unknown instance ignored.
  void ObserveSeconds(int instance_id, Histogram* InstanceSeries::*series, double seconds);
  InstanceSeries* Find(int instance_id);

  // Constant after Create.
  const std::string model_name_;
  const std::vector<int> instance_tp_sizes_;
  const int num_instances_;
  MetricRegistry registry_;
  std::vector<InstanceSeries> instances_;  // [num_instances]
  Counter* rejected_unknown_instance_ = nullptr;
  GaugeFamily* arena_chunks_ = nullptr;  // headway:kv_arena_chunks
  Counter* kv_transfer_bytes_ = nullptr;
  Counter* kv_transfer_blocks_ = nullptr;
  Counter* kv_transfer_tokens_ = nullptr;
  std::vector<Counter*> kv_transfer_fallbacks_;  // [TransferFallbackReason]
  Counter* pd_remote_prefills_ = nullptr;
  std::vector<Counter*> pd_local_prefills_;      // [LocalPrefillReason]
  Histogram* kv_transfer_seconds_ = nullptr;
  Histogram* kv_transfer_send_seconds_ = nullptr;
  Histogram* pd_prefill_seconds_ = nullptr;
  Histogram* pd_first_decode_seconds_ = nullptr;
  Counter* requests_moved_ = nullptr;
  Counter* instance_drains_ = nullptr;

  class CountersOf;  // InstanceCounters feeding one instance's series
  std::vector<std::unique_ptr<CountersOf>> counters_;  // [num_instances]

  std::mutex kv_mu_;
  std::vector<std::vector<double>> rank_usage_;  // guarded by kv_mu_; [instance][tp_rank] 0..1
};

}  // namespace headway
