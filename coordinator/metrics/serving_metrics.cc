#include "coordinator/metrics/serving_metrics.h"

#include <algorithm>
#include <cmath>

namespace headway {

const char* InstanceStateName(InstanceState state) {
  switch (state) {
    case InstanceState::kDown:
      return "down";
    case InstanceState::kJoining:
      return "joining";
    case InstanceState::kReady:
      return "ready";
    case InstanceState::kDraining:
      return "draining";
    case InstanceState::kVacant:
      return "vacant";
  }
  return "down";
}

const char* LocalPrefillReasonName(LocalPrefillReason reason) {
  switch (reason) {
    case LocalPrefillReason::kShortUncached: return "short_uncached";
    case LocalPrefillReason::kPrefillQueueFull: return "prefill_queue_full";
    case LocalPrefillReason::kDecodeNoRoom: return "decode_no_room";
    case LocalPrefillReason::kNoPrefillInstance: return "no_prefill_instance";
    case LocalPrefillReason::kPrefixCachingOff: return "prefix_caching_off";
    case LocalPrefillReason::kPromptLogprobs: return "prompt_logprobs";
  }
  return "short_uncached";
}

const char* TransferFallbackReasonName(TransferFallbackReason reason) {
  switch (reason) {
    case TransferFallbackReason::kTransferFailed: return "transfer_failed";
    case TransferFallbackReason::kPrefillInstanceDown: return "prefill_instance_down";
    case TransferFallbackReason::kDecodeInstanceDown: return "decode_instance_down";
    case TransferFallbackReason::kPrefillBlocksEvicted: return "prefill_blocks_evicted";
    case TransferFallbackReason::kPlanError: return "plan_error";
  }
  return "transfer_failed";
}

namespace {

// The label values of a by-reason counter family: every reason's name, in
// enum order.
template <typename Reason>
std::vector<const char*> ReasonNames(int count, const char* (*name)(Reason)) {
  std::vector<const char*> names;
  for (int i = 0; i < count; ++i) names.push_back(name(Reason(i)));
  return names;
}

// A duration argument is valid when it is a finite, non-negative number.
bool ValidSeconds(double seconds) { return std::isfinite(seconds) && seconds >= 0.0; }

// Label value for an instance that is not one of the deployment's.
constexpr const char kUnknownInstance[] = "unknown";

}  // namespace

const std::vector<double>& TtftBucketsSeconds() {
  static const std::vector<double> kBounds = {
      0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
      1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
  return kBounds;
}

const std::vector<double>& InterTokenLatencyBucketsSeconds() {
  static const std::vector<double> kBounds = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                              0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                              7.5,  10.0,  20.0, 40.0,  80.0};
  return kBounds;
}

const std::vector<double>& RequestLatencyBucketsSeconds() {
  static const std::vector<double> kBounds = {0.3,  0.5,  0.8,  1.0,   1.5,   2.0,   2.5,
                                              5.0,  10.0, 15.0, 20.0,  30.0,  40.0,  50.0,
                                              60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  return kBounds;
}

const std::vector<double>& StepBucketsSeconds() {
  static const std::vector<double> kBounds = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                              0.05,   0.1,   0.25,   0.5,   1.0,  2.5,
                                              5.0,    10.0,  20.0,   30.0};
  return kBounds;
}

const std::vector<double>& StepGapBucketsSeconds() {
  static const std::vector<double> kBounds = {0.00002, 0.00005, 0.0001, 0.00025, 0.0005,
                                              0.001,   0.0025,  0.005,  0.01,    0.025,
                                              0.05,    0.1,     0.25,   0.5};
  return kBounds;
}

Result<std::unique_ptr<ServingMetrics>> ServingMetrics::Create(
    const std::string& model_name, const std::vector<int>& instance_tp_sizes) {
  if (instance_tp_sizes.empty()) {
    return Status::InvalidArgument("serving metrics need at least one instance");
  }
  for (size_t i = 0; i < instance_tp_sizes.size(); ++i) {
    if (instance_tp_sizes[i] < 1) {
      return Status::InvalidArgument("serving metrics: instance " + std::to_string(i) +
                                     " has tp_size " + std::to_string(instance_tp_sizes[i]) +
                                     ", must be >= 1");
    }
  }
  std::unique_ptr<ServingMetrics> metrics(new ServingMetrics(model_name, instance_tp_sizes));
  HW_RETURN_IF_ERROR(metrics->Register());
  return metrics;
}

class ServingMetrics::CountersOf : public InstanceCounters {
 public:
  CountersOf(ServingMetrics* metrics, int instance_id)
      : metrics_(metrics), instance_id_(instance_id) {}
  void OnPreemption() override { metrics_->OnPreemption(instance_id_); }
  void OnPrefixCacheQuery(int64_t queried_tokens, int64_t hit_tokens) override {
    metrics_->OnPrefixCacheQuery(instance_id_, queried_tokens, hit_tokens);
  }
  void OnKvBlocksRecycled(int64_t num_blocks) override {
    metrics_->OnKvBlocksRecycled(instance_id_, num_blocks);
  }
  void OnKvBlocksEvicted(int64_t full_blocks, int64_t sliding_blocks) override {
    metrics_->OnKvBlocksEvicted(instance_id_, full_blocks, sliding_blocks);
  }

 private:
  ServingMetrics* const metrics_;
  const int instance_id_;
};

ServingMetrics::~ServingMetrics() = default;

InstanceCounters* ServingMetrics::Counters(int instance_id) {
  return counters_.at(size_t(instance_id)).get();
}

ServingMetrics::ServingMetrics(std::string model_name, std::vector<int> instance_tp_sizes)
    : model_name_(std::move(model_name)),
      instance_tp_sizes_(std::move(instance_tp_sizes)),
      num_instances_(static_cast<int>(instance_tp_sizes_.size())),
      instances_(instance_tp_sizes_.size()),
      rank_usage_(instance_tp_sizes_.size()) {
  for (size_t i = 0; i < rank_usage_.size(); ++i) {
    rank_usage_[i].assign(static_cast<size_t>(instance_tp_sizes_[i]), 0.0);
    counters_.push_back(std::make_unique<CountersOf>(this, int(i)));
  }
}

// The families of the per-instance series (labels model_name and instance,
// plus their own), in the order they render.
struct ServingMetrics::InstanceFamilies {
  HistogramFamily* ttft = nullptr;
  HistogramFamily* itl = nullptr;
  HistogramFamily* e2e = nullptr;
  HistogramFamily* queue = nullptr;
  HistogramFamily* step = nullptr;
  HistogramFamily* step_worker = nullptr;
  HistogramFamily* step_gap = nullptr;
  GaugeFamily* running = nullptr;
  GaugeFamily* waiting = nullptr;
  GaugeFamily* kv_usage = nullptr;
  GaugeFamily* rank_usage = nullptr;  // + tp_rank
  GaugeFamily* rank_retained = nullptr;  // + tp_rank
  GaugeFamily* arena_chunks = nullptr;   // + tp_rank, owner
  GaugeFamily* state = nullptr;       // + state
  CounterFamily* prefix_queries = nullptr;
  CounterFamily* prefix_hits = nullptr;
  CounterFamily* prompt_tokens = nullptr;
  CounterFamily* generation_tokens = nullptr;
  CounterFamily* preemptions = nullptr;
  CounterFamily* recycled = nullptr;
  CounterFamily* routed = nullptr;
  CounterFamily* routed_hits = nullptr;
  CounterFamily* evicted = nullptr;  // + slot_kind
  CounterFamily* success = nullptr;  // + finished_reason
  CounterFamily* rejected = nullptr;
};

Status ServingMetrics::Register() {
  InstanceFamilies f;
  HW_RETURN_IF_ERROR(AddLatencyFamilies(&f));
  HW_RETURN_IF_ERROR(AddUsageFamilies(&f));
  HW_RETURN_IF_ERROR(AddCounterFamilies(&f));
  for (int id = 0; id < num_instances_; ++id) HW_RETURN_IF_ERROR(ResolveInstanceSeries(f, id));
  HW_ASSIGN_OR_RETURN(rejected_unknown_instance_,
                      f.rejected->WithLabels({model_name_, kUnknownInstance}));
  arena_chunks_ = f.arena_chunks;
  return RegisterDeploymentSeries();
}

Status ServingMetrics::AddLatencyFamilies(InstanceFamilies* f) {
  const std::vector<std::string> labels = {"model_name", "instance"};
  MetricRegistry& r = registry_;
  HW_ASSIGN_OR_RETURN(f->ttft,
                      r.AddHistogram("headway:time_to_first_token_seconds",
                                     "Seconds from request arrival to its first output token.", labels,
                                     TtftBucketsSeconds()));
  HW_ASSIGN_OR_RETURN(f->itl,
                      r.AddHistogram("headway:inter_token_latency_seconds",
                                     "Seconds between consecutive output tokens of a request.", labels,
                                     InterTokenLatencyBucketsSeconds()));
  HW_ASSIGN_OR_RETURN(f->e2e,
                      r.AddHistogram("headway:e2e_request_latency_seconds",
                                     "Seconds from request arrival to its end.", labels,
                                     RequestLatencyBucketsSeconds()));
  HW_ASSIGN_OR_RETURN(f->queue,
                      r.AddHistogram("headway:request_queue_time_seconds",
                                     "Seconds a request waited before its first schedule.",
                                     labels, RequestLatencyBucketsSeconds()));
  HW_ASSIGN_OR_RETURN(f->step,
                      r.AddHistogram("headway:step_seconds",
                                     "Seconds from a step's plans being sent to every TP rank's "
                                     "result being in.",
                                     labels, StepBucketsSeconds()));
  HW_ASSIGN_OR_RETURN(f->step_worker,
                      r.AddHistogram("headway:step_worker_seconds",
                                     "Seconds the slowest TP rank spent on a step by its own clock "
                                     "(plan handed to its compute thread to result built).",
                                     labels, StepBucketsSeconds()));
  HW_ASSIGN_OR_RETURN(f->step_gap,
                      r.AddHistogram("headway:step_gap_seconds",
                                     "Seconds from a step's results being in to the next step "
                                     "being sent, when the instance still had work.",
                                     labels, StepGapBucketsSeconds()));
  return Status::Ok();
}

Status ServingMetrics::AddUsageFamilies(InstanceFamilies* f) {
  const std::vector<std::string> labels = {"model_name", "instance"};
  MetricRegistry& r = registry_;
  HW_ASSIGN_OR_RETURN(f->running,
                      r.AddGauge("headway:num_requests_running",
                                 "Sequences the instance is running.", labels));
  HW_ASSIGN_OR_RETURN(f->waiting,
                      r.AddGauge("headway:num_requests_waiting",
                                 "Requests waiting in the instance queue.", labels));
  HW_ASSIGN_OR_RETURN(f->kv_usage,
                      r.AddGauge("headway:kv_cache_usage_perc",
                                 "Fraction of KV blocks in use on the fullest TP rank (1 = full).",
                                 labels));
  HW_ASSIGN_OR_RETURN(f->rank_usage,
                      r.AddGauge("headway:kv_cache_rank_usage_perc",
                                 "Fraction of KV blocks in use on one TP rank (1 = full).",
                                 {"model_name", "instance", "tp_rank"}));
  HW_ASSIGN_OR_RETURN(f->rank_retained,
                      r.AddGauge("headway:kv_cache_retained_blocks",
                                 "Cached KV blocks of one TP rank that no running sequence's row "
                                 "holds while their entry is still referenced (e.g. a prompt's "
                                 "sliding window kept for later prefix hits).",
                                 {"model_name", "instance", "tp_rank"}));
  HW_ASSIGN_OR_RETURN(f->arena_chunks,
                      r.AddGauge("headway:kv_arena_chunks",
                                 "Chunks of one TP rank's KV arena lent to the blocks of one KV "
                                 "cache dtype (owner), or free (owner \"free\").",
                                 {"model_name", "instance", "tp_rank", "owner"}));
  HW_ASSIGN_OR_RETURN(f->state,
                      r.AddGauge("headway:instance_state",
                                 "1 for the instance's state (down, joining, ready, draining, "
                                 "vacant), else 0.",
                                 {"model_name", "instance", "state"}));
  return Status::Ok();
}

Status ServingMetrics::AddCounterFamilies(InstanceFamilies* f) {
  const std::vector<std::string> labels = {"model_name", "instance"};
  MetricRegistry& r = registry_;
  HW_ASSIGN_OR_RETURN(f->prefix_queries,
                      r.AddCounter("headway:prefix_cache_queries_total",
                                   "Prompt tokens looked up in the prefix cache.",
                                   labels));
  HW_ASSIGN_OR_RETURN(f->prefix_hits,
                      r.AddCounter("headway:prefix_cache_hits_total",
                                   "Prompt tokens found in the prefix cache.",
                                   labels));
  HW_ASSIGN_OR_RETURN(f->prompt_tokens,
                      r.AddCounter("headway:prompt_tokens_total",
                                   "Prompt tokens of finished requests.", labels));
  HW_ASSIGN_OR_RETURN(f->generation_tokens,
                      r.AddCounter("headway:generation_tokens_total",
                                   "Output tokens of finished requests.", labels));
  HW_ASSIGN_OR_RETURN(f->preemptions,
                      r.AddCounter("headway:num_preemptions_total",
                                   "Sequences preempted (blocks freed, recomputed later).", labels));
  HW_ASSIGN_OR_RETURN(f->recycled,
                      r.AddCounter("headway:kv_blocks_recycled_total",
                                   "Sliding-window KV blocks returned to the pools once outside "
                                   "every window and sink.",
                                   labels));
  HW_ASSIGN_OR_RETURN(f->routed,
                      r.AddCounter("headway:routed_requests_total",
                                   "Requests the router placed on the instance (a disaggregated "
                                   "request counts on its prefill and on its decode instance).",
                                   labels));
  HW_ASSIGN_OR_RETURN(f->routed_hits,
                      r.AddCounter("headway:routed_prefix_hit_tokens_total",
                                   "Tokens of the requests placed on the instance that its prefix "
                                   "cache held when the router chose it.",
                                   labels));
  HW_ASSIGN_OR_RETURN(f->evicted,
                      r.AddCounter("headway:kv_blocks_evicted_total",
                                   "KV blocks returned to the pools by evicting least recently "
                                   "used prefix-cache entries, by slot kind.",
                                   {"model_name", "instance", "slot_kind"}));
  HW_ASSIGN_OR_RETURN(f->success,
                      r.AddCounter("headway:request_success_total",
                                   "Requests finished, by finish reason.",
                                   {"model_name", "instance", "finished_reason"}));
  HW_ASSIGN_OR_RETURN(f->rejected,
                      r.AddCounter("headway:metrics_rejected_observations_total",
                                   "Metric updates dropped because their arguments were invalid.",
                                   labels));
  return Status::Ok();
}

Status ServingMetrics::ResolveInstanceSeries(const InstanceFamilies& f, int id) {
  const std::vector<std::string> values = {model_name_, std::to_string(id)};
  InstanceSeries& s = instances_[static_cast<size_t>(id)];
  HW_ASSIGN_OR_RETURN(s.ttft, f.ttft->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.itl, f.itl->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.e2e, f.e2e->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.queue, f.queue->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.step, f.step->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.step_worker, f.step_worker->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.step_gap, f.step_gap->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.running, f.running->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.waiting, f.waiting->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.kv_usage, f.kv_usage->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.prefix_queries, f.prefix_queries->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.prefix_hits, f.prefix_hits->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.prompt_tokens, f.prompt_tokens->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.generation_tokens, f.generation_tokens->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.preemptions, f.preemptions->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.blocks_recycled, f.recycled->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.routed, f.routed->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.routed_hits, f.routed_hits->WithLabels(values));
  HW_ASSIGN_OR_RETURN(s.blocks_evicted_full, f.evicted->WithLabels({model_name_, values[1], "full"}));
  HW_ASSIGN_OR_RETURN(s.blocks_evicted_sliding,
                      f.evicted->WithLabels({model_name_, values[1], "sliding"}));
  HW_ASSIGN_OR_RETURN(s.success_stop, f.success->WithLabels({model_name_, values[1], "stop"}));
  HW_ASSIGN_OR_RETURN(s.success_length, f.success->WithLabels({model_name_, values[1], "length"}));
  HW_ASSIGN_OR_RETURN(s.success_abort, f.success->WithLabels({model_name_, values[1], "abort"}));
  HW_ASSIGN_OR_RETURN(s.rejected, f.rejected->WithLabels(values));
  for (int i = 0; i < kNumInstanceStates; ++i) {
    HW_ASSIGN_OR_RETURN(Gauge * g, f.state->WithLabels({model_name_, values[1],
                                                        InstanceStateName(InstanceState(i))}));
    s.state.push_back(g);
  }
  s.state[size_t(InstanceState::kDown)]->Set(1);
  for (int rank = 0; rank < instance_tp_sizes_[static_cast<size_t>(id)]; ++rank) {
    HW_ASSIGN_OR_RETURN(Gauge * g,
                        f.rank_usage->WithLabels({model_name_, values[1], std::to_string(rank)}));
    s.rank_kv_usage.push_back(g);
    HW_ASSIGN_OR_RETURN(Gauge * retained,
                        f.rank_retained->WithLabels({model_name_, values[1], std::to_string(rank)}));
    s.rank_retained.push_back(retained);
    // Owners are known once the instance registers; "free" exists from the
    // start so that the family is visible before any instance is ready.
    HW_ASSIGN_OR_RETURN(Gauge * free_chunks,
                        f.arena_chunks->WithLabels(
                            {model_name_, values[1], std::to_string(rank), "free"}));
    s.arena_chunks[{rank, "free"}] = free_chunks;
  }
  return Status::Ok();
}

Result<Counter*> ServingMetrics::AddDeploymentCounter(const std::string& name,
                                                      const std::string& help) {
  HW_ASSIGN_OR_RETURN(CounterFamily * family, registry_.AddCounter(name, help, {"model_name"}));
  return family->WithLabels({model_name_});
}

Result<std::vector<Counter*>> ServingMetrics::AddDeploymentCountersByReason(
    const std::string& name, const std::string& help, const std::vector<const char*>& reasons) {
  HW_ASSIGN_OR_RETURN(CounterFamily * family,
                      registry_.AddCounter(name, help, {"model_name", "reason"}));
  std::vector<Counter*> counters;
  for (const char* reason : reasons) {
    HW_ASSIGN_OR_RETURN(Counter * c, family->WithLabels({model_name_, reason}));
    counters.push_back(c);
  }
  return counters;
}

Result<Histogram*> ServingMetrics::AddDeploymentHistogram(const std::string& name,
                                                          const std::string& help,
                                                          const std::vector<double>& bounds) {
  HW_ASSIGN_OR_RETURN(HistogramFamily * family,
                      registry_.AddHistogram(name, help, {"model_name"}, bounds));
  return family->WithLabels({model_name_});
}

Status ServingMetrics::RegisterDeploymentSeries() {
  HW_ASSIGN_OR_RETURN(kv_transfer_bytes_,
                      AddDeploymentCounter("headway:kv_transfer_bytes_total",
                                           "KV bytes moved from prefill to decode instances."));
  HW_ASSIGN_OR_RETURN(kv_transfer_blocks_,
                      AddDeploymentCounter("headway:kv_transfer_blocks_total",
                                           "KV blocks moved from prefill to decode instances."));
  HW_ASSIGN_OR_RETURN(kv_transfer_tokens_,
                      AddDeploymentCounter("headway:kv_transfer_tokens_total",
                                           "Prompt positions whose KV moved from prefill to "
                                           "decode instances."));
  HW_ASSIGN_OR_RETURN(kv_transfer_fallbacks_,
                      AddDeploymentCountersByReason(
                          "headway:kv_transfer_fallbacks_total",
                          "Requests prefilled by their decode instance after a remote prefill "
                          "was planned, by reason.",
                          ReasonNames(kNumTransferFallbackReasons, TransferFallbackReasonName)));
  HW_ASSIGN_OR_RETURN(pd_remote_prefills_,
                      AddDeploymentCounter("headway:pd_remote_prefills_total",
                                           "Disaggregated requests planned for a prefill "
                                           "instance."));
  HW_ASSIGN_OR_RETURN(pd_local_prefills_,
                      AddDeploymentCountersByReason(
                          "headway:pd_local_prefills_total",
                          "Disaggregated requests prefilled by their decode instance by "
                          "decision on arrival, by reason.",
                          ReasonNames(kNumLocalPrefillReasons, LocalPrefillReasonName)));
  HW_ASSIGN_OR_RETURN(kv_transfer_seconds_,
                      AddDeploymentHistogram("headway:kv_transfer_seconds",
                                             "Seconds from a KV transfer plan to its last result.",
                                             InterTokenLatencyBucketsSeconds()));
  HW_ASSIGN_OR_RETURN(kv_transfer_send_seconds_,
                      AddDeploymentHistogram("headway:kv_transfer_send_seconds",
                                             "Seconds a prefill rank took to send its blocks of "
                                             "one KV transfer plan, as it reports them.",
                                             InterTokenLatencyBucketsSeconds()));
  HW_ASSIGN_OR_RETURN(pd_prefill_seconds_,
                      AddDeploymentHistogram("headway:pd_prefill_seconds",
                                             "Seconds from a disaggregated request's arrival to "
                                             "the end of its prefill on the prefill instance.",
                                             TtftBucketsSeconds()));
  HW_ASSIGN_OR_RETURN(pd_first_decode_seconds_,
                      AddDeploymentHistogram("headway:pd_first_decode_seconds",
                                             "Seconds from a disaggregated request joining its "
                                             "decode instance to its first token.",
                                             TtftBucketsSeconds()));
  HW_ASSIGN_OR_RETURN(requests_moved_,
                      AddDeploymentCounter("headway:requests_moved_total",
                                           "Requests moved to another instance of their pool "
                                           "when theirs went down before their client was sent "
                                           "any output."));
  HW_ASSIGN_OR_RETURN(instance_drains_,
                      AddDeploymentCounter("headway:instance_drains_total",
                                           "Drains that ended: the instance let its workers go."));
  return Status::Ok();
}

ServingMetrics::InstanceSeries* ServingMetrics::Find(int instance_id) {
  if (instance_id < 0 || instance_id >= num_instances_) {
    (void)rejected_unknown_instance_->Increment();
    return nullptr;
  }
  return &instances_[static_cast<size_t>(instance_id)];
}

void ServingMetrics::Reject(int instance_id) {
  InstanceSeries* s = Find(instance_id);
  if (s != nullptr) (void)s->rejected->Increment();
}

void ServingMetrics::ObserveSeconds(int instance_id, Histogram* InstanceSeries::*series,
                                    double seconds) {
  InstanceSeries* s = Find(instance_id);
  if (s == nullptr) return;
  if (!ValidSeconds(seconds)) return Reject(instance_id);
  (void)(s->*series)->Observe(seconds);
}

void ServingMetrics::OnScheduled(int instance_id, double queue_seconds) {
  ObserveSeconds(instance_id, &InstanceSeries::queue, queue_seconds);
}

void ServingMetrics::OnFirstToken(int instance_id, double ttft_seconds) {
  ObserveSeconds(instance_id, &InstanceSeries::ttft, ttft_seconds);
}

void ServingMetrics::OnToken(int instance_id, double itl_seconds) {
  ObserveSeconds(instance_id, &InstanceSeries::itl, itl_seconds);
}

void ServingMetrics::OnStep(int instance_id, double seconds, double worker_seconds) {
  InstanceSeries* s = Find(instance_id);
  if (s == nullptr) return;
  if (!ValidSeconds(seconds) || !ValidSeconds(worker_seconds)) return Reject(instance_id);
  (void)s->step->Observe(seconds);
  (void)s->step_worker->Observe(worker_seconds);
}

void ServingMetrics::OnStepGap(int instance_id, double seconds) {
  ObserveSeconds(instance_id, &InstanceSeries::step_gap, seconds);
}

void ServingMetrics::OnFinished(int instance_id, FinishReason reason, double e2e_seconds,
                                int64_t prompt_tokens, int64_t generation_tokens) {
  InstanceSeries* s = Find(instance_id);
  if (s == nullptr) return;
  Counter* success = nullptr;
  switch (reason) {
    case FinishReason::kStop: success = s->success_stop; break;
    case FinishReason::kLength: success = s->success_length; break;
    case FinishReason::kAbort: success = s->success_abort; break;
    case FinishReason::kNone: break;
  }
  if (success == nullptr || !ValidSeconds(e2e_seconds) || prompt_tokens < 0 ||
      generation_tokens < 0) {
    return Reject(instance_id);
  }
  (void)success->Increment();
  (void)s->e2e->Observe(e2e_seconds);
  (void)s->prompt_tokens->Increment(static_cast<double>(prompt_tokens));
  (void)s->generation_tokens->Increment(static_cast<double>(generation_tokens));
}

void ServingMetrics::OnPreemption(int instance_id, int64_t num_sequences) {
  InstanceSeries* s = Find(instance_id);
  if (s == nullptr) return;
  if (num_sequences < 0) return Reject(instance_id);
  (void)s->preemptions->Increment(static_cast<double>(num_sequences));
}

void ServingMetrics::OnKvBlocksRecycled(int instance_id, int64_t num_blocks) {
  InstanceSeries* s = Find(instance_id);
  if (s == nullptr) return;
  if (num_blocks < 0) return Reject(instance_id);
  (void)s->blocks_recycled->Increment(static_cast<double>(num_blocks));
}

void ServingMetrics::OnRouted(int instance_id, int64_t hit_tokens) {
  InstanceSeries* s = Find(instance_id);
  if (s == nullptr) return;
  if (hit_tokens < 0) return Reject(instance_id);
  (void)s->routed->Increment(1.0);
  (void)s->routed_hits->Increment(static_cast<double>(hit_tokens));
}

void ServingMetrics::OnKvBlocksEvicted(int instance_id, int64_t full_blocks,
                                       int64_t sliding_blocks) {
  InstanceSeries* s = Find(instance_id);
  if (s == nullptr) return;
  if (full_blocks < 0 || sliding_blocks < 0) return Reject(instance_id);
  (void)s->blocks_evicted_full->Increment(static_cast<double>(full_blocks));
  (void)s->blocks_evicted_sliding->Increment(static_cast<double>(sliding_blocks));
}

void ServingMetrics::SetKvRetained(int instance_id, int tp_rank, int64_t retained_blocks) {
  InstanceSeries* s = Find(instance_id);
  if (s == nullptr) return;
  if (tp_rank < 0 || static_cast<size_t>(tp_rank) >= s->rank_retained.size() ||
      retained_blocks < 0) {
    return Reject(instance_id);
  }
  s->rank_retained[static_cast<size_t>(tp_rank)]->Set(static_cast<double>(retained_blocks));
}

void ServingMetrics::SetKvArenaChunks(int instance_id, int tp_rank, const std::string& owner,
                                      int64_t chunks) {
  InstanceSeries* s = Find(instance_id);
  if (s == nullptr) return;
  if (tp_rank < 0 || static_cast<size_t>(tp_rank) >= s->rank_retained.size() || chunks < 0 ||
      owner.empty()) {
    return Reject(instance_id);
  }
  std::lock_guard<std::mutex> lock(kv_mu_);
  Gauge*& g = s->arena_chunks[{tp_rank, owner}];
  if (g == nullptr) {
    Result<Gauge*> made = arena_chunks_->WithLabels(
        {model_name_, std::to_string(instance_id), std::to_string(tp_rank), owner});
    if (!made.ok()) {
      s->arena_chunks.erase({tp_rank, owner});
      return Reject(instance_id);
    }
    g = *made;
  }
  g->Set(static_cast<double>(chunks));
}

void ServingMetrics::OnKvTransfer(uint64_t bytes, uint64_t blocks, uint64_t tokens,
                                  double seconds) {
  (void)kv_transfer_bytes_->Increment(static_cast<double>(bytes));
  (void)kv_transfer_blocks_->Increment(static_cast<double>(blocks));
  (void)kv_transfer_tokens_->Increment(static_cast<double>(tokens));
  (void)kv_transfer_seconds_->Observe(seconds);
}

void ServingMetrics::OnKvTransferSent(double seconds) {
  if (!ValidSeconds(seconds)) {
    (void)rejected_unknown_instance_->Increment();
    return;
  }
  (void)kv_transfer_send_seconds_->Observe(seconds);
}

void ServingMetrics::OnKvTransferFallback(TransferFallbackReason reason) {
  (void)kv_transfer_fallbacks_.at(static_cast<size_t>(reason))->Increment();
}

void ServingMetrics::OnRemotePrefill() { (void)pd_remote_prefills_->Increment(); }

void ServingMetrics::OnLocalPrefill(LocalPrefillReason reason) {
  (void)pd_local_prefills_.at(static_cast<size_t>(reason))->Increment();
}

void ServingMetrics::OnRequestMoved() { (void)requests_moved_->Increment(); }

void ServingMetrics::OnInstanceDrained() { (void)instance_drains_->Increment(); }

void ServingMetrics::SetInstanceState(int instance_id, InstanceState state) {
  InstanceSeries* s = Find(instance_id);
  if (s == nullptr) return;
  for (int i = 0; i < kNumInstanceStates; ++i) s->state[size_t(i)]->Set(i == int(state) ? 1 : 0);
}

void ServingMetrics::OnPdPrefill(double seconds) { (void)pd_prefill_seconds_->Observe(seconds); }

void ServingMetrics::OnPdFirstDecode(double seconds) {
  (void)pd_first_decode_seconds_->Observe(seconds);
}

void ServingMetrics::OnPrefixCacheQuery(int instance_id, int64_t queried_tokens,
                                        int64_t hit_tokens) {
  InstanceSeries* s = Find(instance_id);
  if (s == nullptr) return;
  if (hit_tokens < 0 || queried_tokens < hit_tokens) return Reject(instance_id);
  (void)s->prefix_queries->Increment(static_cast<double>(queried_tokens));
  (void)s->prefix_hits->Increment(static_cast<double>(hit_tokens));
}

void ServingMetrics::SetQueueState(int instance_id, int64_t num_running, int64_t num_waiting) {
  InstanceSeries* s = Find(instance_id);
  if (s == nullptr) return;
  if (num_running < 0 || num_waiting < 0) return Reject(instance_id);
  s->running->Set(static_cast<double>(num_running));
  s->waiting->Set(static_cast<double>(num_waiting));
}

void ServingMetrics::SetKvUsage(int instance_id, int tp_rank, int64_t used_blocks,
                                int64_t total_blocks) {
  InstanceSeries* s = Find(instance_id);
  if (s == nullptr) return;
  if (tp_rank < 0 || static_cast<size_t>(tp_rank) >= s->rank_kv_usage.size() ||
      used_blocks < 0 || total_blocks < used_blocks) {
    return Reject(instance_id);
  }
  const double usage =
      total_blocks == 0 ? 0.0 : static_cast<double>(used_blocks) / static_cast<double>(total_blocks);
  std::lock_guard<std::mutex> lock(kv_mu_);
  std::vector<double>& ranks = rank_usage_[static_cast<size_t>(instance_id)];
  ranks[static_cast<size_t>(tp_rank)] = usage;
  s->rank_kv_usage[static_cast<size_t>(tp_rank)]->Set(usage);
  s->kv_usage->Set(*std::max_element(ranks.begin(), ranks.end()));
}

}  // namespace headway
