#include "coordinator/engine/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <unordered_map>

#include "coordinator/engine/disaggregation.h"
#include "coordinator/engine/output_processor.h"
#include "coordinator/engine/request_table.h"
#include "coordinator/engine/router.h"
#include "coordinator/engine/step_plan.h"

namespace headway {
namespace {

// How long one Receive may block when nothing else needs the thread; bounds
// the latency of picking up a submitted request.
constexpr std::chrono::milliseconds kPollTimeout(2);
// Messages handled per loop iteration before scheduling again.
constexpr int kMaxMessagesPerIteration = 256;

StopConditions StopConditionsOf(const EngineRequest& request, const Config& config,
                                const Tokenizer& tokenizer) {
  StopConditions stop;
  stop.max_tokens = request.max_tokens;
  stop.max_model_len = config.max_model_len;
  stop.ignore_eos = request.ignore_eos;
  stop.eos_id = tokenizer.eos_id();
  stop.stop_strings = request.stop;
  stop.stop_token_ids = request.stop_token_ids;
  stop.min_tokens = request.min_tokens;
  return stop;
}

}  // namespace

// Everything here runs on the engine thread.
struct Engine::Impl {
  Impl(Config c, ModelSpec s, const Tokenizer* t, std::unique_ptr<ControlServer> srv);

  // ---- the loop's steps (Engine::Run) ------------------------------------
  void CollectMessages();
  void Admit(uint64_t id, EngineRequest request, std::promise<CompletionOutcome> promise);
  void CheckTimers(Clock::time_point now);
  void ScheduleAndDispatch(Clock::time_point now);
  std::vector<InstanceHealth> Snapshot();
  void Shutdown(const std::string& reason);

  // ---- messages -------------------------------------------------------
  void Handle(const Inbound& in);
  // The connection of worker `peer` closed: a registered rank is gone.
  void OnDisconnected(const std::string& peer);
  // Starts draining `inst` (no-op unless it is ready and not draining yet):
  // it takes no new request; CheckDrains lets it go.
  void Drain(Instance& inst, const std::string& why, Clock::time_point now);
  // Releases each draining instance whose requests have all ended (orderly
  // Shutdown to its ranks, then Reset), and takes down those past their
  // drain deadline (MarkDown: their requests move or fail).
  void CheckDrains(Clock::time_point now);
  void OnRegister(const std::string& peer, const proto::RegisterRequest& request);
  void OnStepResult(Instance& inst, int rank, const proto::StepResult& result);
  // ---- steps ----------------------------------------------------------
  void Dispatch(Instance& inst);
  void OnStepDone(Instance& inst);
  // ---- requests -------------------------------------------------------
  // Adds request `id`'s sequence to `inst`'s scheduler; `arrival` starts its
  // TTFT and queue-time clocks; prompt positions [received_from,
  // received_to) arrived by KV transfer (Handoff). Error: the scheduler's
  // refusal.
  Status AddSequence(Instance& inst, uint64_t id, const EngineRequest& request,
                     Clock::time_point arrival, int received_from = 0, int received_to = 0);
  // Runs what the disaggregation coordinator handed back.
  void Apply(std::vector<Handoff> handoffs);
  void JoinDecode(Handoff& handoff);
  // Ends request `id` on `inst`: drops its prefill job, removes its
  // sequence, and has the request table answer it with its outcome when
  // `status` is OK, else with `status` (Cancelled: the client went away).
  void EndRequest(Instance& inst, uint64_t id, Status status);
  // Hands the prompt logprobs a step computed for `seq` (`s` in the step's
  // batch; `results` by seq id) to its request and advances
  // seq.prompt_logprobs_end(). Internal when the worker's answer does not
  // match the rows asked for.
  using PromptLogprobsBySeq = std::unordered_map<uint64_t, const proto::PromptLogprobs*>;
  Status TakePromptLogprobs(const ScheduledSeq& s, Sequence& seq,
                            const PromptLogprobsBySeq& results);
  // Ends request `id` with `why` wherever it is; no-op once it has ended.
  void Cancel(uint64_t id, Status why);
  // Forgets the instance's ranks (it is ready again once all of them
  // register anew) and ends or moves each of its requests: a prefill job
  // falls back to a decode instance; a request whose client has been sent
  // nothing yet moves to another ready instance of the pool's role
  // (Readmit); the rest fail with Unavailable naming the instance and `why`.
  // `orderly`: a worker said it stops (Leaving), logged as information
  // rather than an error.
  void MarkDown(Instance& inst, const std::string& why, bool orderly = false);
  // A rank is gone: its TP group is broken, so every registered rank is
  // told to exit (InstanceRegistry::StopRanks) and the instance goes down.
  void LoseRanks(Instance& inst, const std::string& why, bool orderly = false) {
    registry.StopRanks(inst, why);
    MarkDown(inst, why, orderly);
  }
  // Adds `seq`'s request, whose instance `from` went down before its client
  // was sent any output, to the least loaded ready instance of `from`'s
  // role as a new sequence with the same id, prompt, sampling (seed
  // included), stop conditions and arrival time: it starts again from its
  // prompt. False (and nothing changes) when no such instance is
  // ready or its scheduler refuses the sequence.
  bool Readmit(const Instance& from, const Sequence& seq);

  const Config config;
  const ModelSpec spec;
  const Tokenizer* const tokenizer;
  std::unique_ptr<ControlServer> server;
  std::unique_ptr<ServingMetrics> metrics;
  InstanceRegistry registry;
  Router router;
  DisaggregationCoordinator disaggregation;
  RequestTable requests;
};

namespace {

std::unique_ptr<ServingMetrics> MakeMetrics(const Config& config) {
  std::vector<int> tp_sizes;
  for (const InstanceConfig* inst : config.Instances()) tp_sizes.push_back(inst->tp_size);
  Result<std::unique_ptr<ServingMetrics>> m =
      ServingMetrics::Create(config.served_model_name, tp_sizes);
  HW_CHECK(m.ok());  // the config has passed validation: at least one instance
  return std::move(*m);
}

}  // namespace

Engine::Impl::Impl(Config c, ModelSpec s, const Tokenizer* t, std::unique_ptr<ControlServer> srv)
    : config(std::move(c)),
      spec(std::move(s)),
      tokenizer(t),
      server(std::move(srv)),
      metrics(MakeMetrics(config)),
      registry(config, spec, server.get(), metrics.get()),
      router(config),
      disaggregation(config, spec, &registry, &router, metrics.get()),
      requests(metrics.get()) {}

// ======================================================================
// messages

void Engine::Impl::CollectMessages() {
  // Block briefly for the first message, then drain the rest.
  std::optional<Inbound> in = server->Receive(kPollTimeout);
  for (int n = 0; in && n < kMaxMessagesPerIteration; ++n) {
    Handle(*in);
    in = server->Receive(std::chrono::milliseconds(0));
  }
  if (in) Handle(*in);
}

void Engine::Impl::Handle(const Inbound& in) {
  if (in.kind == Inbound::Kind::kDisconnected) {
    OnDisconnected(in.peer);
    return;
  }
  const proto::Envelope& env = in.envelope;
  if (env.has_register_request()) {
    OnRegister(in.peer, env.register_request());
    return;
  }
  std::optional<InstanceRegistry::Peer> peer = registry.FindPeer(in.peer);
  if (!peer) {
    spdlog::warn("control: message from unknown peer `{}` ignored", in.peer);
    return;
  }
  Instance& inst = *peer->instance;
  // Ranks meet through the store before they register.
  if (env.has_store_set() || env.has_store_get()) {
    registry.HandleStore(inst, in.peer, env);
    return;
  }
  if (!inst.ranks[size_t(peer->rank)].registered) {
    // A worker that believes it is registered, but whose instance went down
    // meanwhile (it was silent past the timeout, or a rank of its group
    // died): its TP group is gone, so it must exit and start afresh.
    spdlog::warn("control: message from unregistered worker `{}`; telling it to exit", in.peer);
    registry.StopPeer(in.peer, "worker `" + in.peer + "` is not registered (its instance " +
                                   std::to_string(inst.id) + " went down); restart it");
    return;
  }
  registry.Heard(inst, peer->rank);
  if (env.has_step_result()) {
    OnStepResult(inst, peer->rank, env.step_result());
  } else if (env.has_transfer_result()) {
    Apply(disaggregation.OnTransferResult(env.transfer_result()));
  } else if (env.has_drain_request()) {
    Drain(inst, "worker `" + in.peer + "` asked: " + env.drain_request().reason(), Clock::now());
  } else if (env.has_leaving()) {
    LoseRanks(inst, "worker `" + in.peer + "` left: " + env.leaving().reason(), /*orderly=*/true);
  }
  // Heartbeats only refresh last_heard.
}

void Engine::Impl::OnDisconnected(const std::string& peer) {
  std::optional<InstanceRegistry::Peer> p = registry.FindPeer(peer);
  if (!p || !p->instance->ranks[size_t(p->rank)].registered) return;  // not serving
  LoseRanks(*p->instance, "worker `" + peer + "` disconnected");
}

void Engine::Impl::OnRegister(const std::string& peer, const proto::RegisterRequest& request) {
  Instance* inst = registry.CheckRegistration(peer, request);
  if (inst == nullptr) return;
  if (inst->ranks[request.tp_rank()].registered) {
    // The worker restarted: whatever the instance had in flight is lost.
    MarkDown(*inst, "worker `" + peer + "` registered again (restarted)");
  }
  registry.Register(*inst, peer, request);
}

void Engine::Impl::OnStepResult(Instance& inst, int rank, const proto::StepResult& result) {
  if (result.fatal()) {
    // A rank whose collectives broke cannot finish this or any later step;
    // waiting for the others would only delay the errors.
    registry.StopRanks(inst, "rank " + std::to_string(rank) + " failed: " + result.error());
    MarkDown(inst, "worker `" + PeerName(inst.id, rank) + "` failed: " + result.error());
    return;
  }
  if (!inst.in_flight) {
    spdlog::warn("instance {} rank {}: step result for step {} rejected (in flight: none)",
                 inst.id, rank, result.step_id());
    return;
  }
  if (inst.in_flight->OnResult(rank, result) == InFlightStep::Progress::kDone) OnStepDone(inst);
}

// ======================================================================
// steps: schedule -> dispatch -> collect

void Engine::Impl::ScheduleAndDispatch(Clock::time_point now) {
  for (Instance& inst : registry.instances()) Dispatch(inst);
  registry.SendHeartbeats(now);
}

void Engine::Impl::Dispatch(Instance& inst) {
  if (!inst.ready() || inst.in_flight) return;
  if (!inst.scheduler->HasWork()) {
    // Its waiting requests were cancelled or moved: what follows is idle
    // time, not a gap between steps.
    inst.last_step_done.reset();
    return;
  }
  ScheduledBatch batch = inst.scheduler->Schedule();
  if (batch.empty()) return;
  requests.RecordScheduled(inst.id, batch, *inst.scheduler, Clock::now());
  const uint64_t step_id = inst.next_step_id++;
  std::vector<proto::StepPlan> plans = BuildStepPlans(step_id, batch, *inst.scheduler, inst.tp_size);
  // The gap ends, and the step starts, as the first plan goes out: a rank
  // may start on it before the last one is sent, and its own time
  // (headway:step_worker_seconds) must lie inside the step's.
  const Clock::time_point sent = Clock::now();
  if (inst.last_step_done) {
    metrics->OnStepGap(inst.id, Seconds(sent - *inst.last_step_done));
    inst.last_step_done.reset();
  }
  for (int rank = 0; rank < inst.tp_size; ++rank) {
    proto::Envelope env;
    *env.mutable_step_plan() = std::move(plans[size_t(rank)]);
    registry.Send(inst, rank, env);
  }
  inst.in_flight.emplace(inst.id, step_id, std::move(batch), inst.tp_size, sent);
}

void Engine::Impl::OnStepDone(Instance& inst) {
  InFlightStep step = std::move(*inst.in_flight);
  inst.in_flight.reset();
  const Clock::time_point done = Clock::now();
  metrics->OnStep(inst.id, Seconds(done - step.sent_at()), step.worker_seconds());
  // Reported when the next step goes out, however this one's outputs end.
  struct MarkDone {
    Instance& inst;
    Clock::time_point done;
    ~MarkDone() {
      if (inst.ready() && inst.scheduler->HasWork()) inst.last_step_done = done;
    }
  } mark_done{inst, done};
  if (!step.status().ok()) {
    spdlog::error("{}", step.status().message());
    // A prefill job's sequence has its request's id: the request fails too.
    for (const ScheduledSeq& s : step.batch().seqs) {
      if (requests.Contains(s.seq_id)) EndRequest(inst, s.seq_id, step.status());
    }
    return;
  }
  inst.scheduler->OnStepComputed(step.batch());
  std::unordered_map<uint64_t, const proto::SampledToken*> sampled;
  for (const proto::SampledToken& t : step.tokens()) sampled[t.seq_id()] = &t;
  PromptLogprobsBySeq prompt_logprobs;
  for (const proto::PromptLogprobs& p : step.prompt_logprobs()) prompt_logprobs[p.seq_id()] = &p;
  for (const ScheduledSeq& s : step.batch().seqs) {
    Sequence* seq = inst.scheduler->Find(s.seq_id);
    if (seq == nullptr) continue;  // cancelled while the step ran
    if (seq->IsPrefillDone()) {
      Apply(disaggregation.OnPrefillDone(inst, s.seq_id));
      continue;
    }
    // Before the sampled token, which may end the request.
    if (Status taken = TakePromptLogprobs(s, *seq, prompt_logprobs); !taken.ok()) {
      EndRequest(inst, s.seq_id,
                 Status::Internal("instance " + std::to_string(inst.id) + " step " +
                                  std::to_string(step.step_id()) + ": " + taken.message()));
      continue;
    }
    if (!s.sample) continue;
    auto it = sampled.find(s.seq_id);
    const int32_t token_id = it == sampled.end() ? -1 : it->second->token_id();
    if (token_id < 0 || token_id >= tokenizer->vocab_size()) {
      const std::string why = it == sampled.end() ? "no sampled token"
                                                  : "sampled token id " +
                                                        std::to_string(token_id) + " out of range";
      EndRequest(inst, s.seq_id,
                 Status::Internal("instance " + std::to_string(inst.id) + " step " +
                                  std::to_string(step.step_id()) + " returned " + why +
                                  " for sequence " + std::to_string(s.seq_id)));
      continue;
    }
    if (Status advanced = seq->AdvanceGrammar(token_id); !advanced.ok()) {
      // A grammar too large to run is the client's to fix (its own words);
      // anything else is ours, with where it happened.
      if (advanced.code() != StatusCode::kInvalidArgument) {
        advanced = advanced.WithContext("instance " + std::to_string(inst.id) + " step " +
                                        std::to_string(step.step_id()));
      }
      EndRequest(inst, s.seq_id, std::move(advanced));
      continue;
    }
    if (requests.OnSampled(inst.id, *seq, *it->second)) EndRequest(inst, s.seq_id, Status::Ok());
  }
}

Status Engine::Impl::TakePromptLogprobs(const ScheduledSeq& s, Sequence& seq,
                                        const PromptLogprobsBySeq& results) {
  const Sequence::PromptRows rows = seq.PromptLogprobRows(s.start_pos, s.num_tokens);
  if (rows.count == 0) return Status::Ok();
  auto it = results.find(s.seq_id);
  const int got = it == results.end() ? 0 : it->second->positions_size();
  if (got != rows.count) {
    return Status::Internal("sequence " + std::to_string(s.seq_id) + " got " +
                            std::to_string(got) + " prompt logprobs for " +
                            std::to_string(rows.count) + " rows");
  }
  const int first_position = s.start_pos + rows.first + 1;
  for (int i = 0; i < rows.count; ++i) {
    if (it->second->positions(i).token_id() != seq.TokenAt(first_position + i)) {
      return Status::Internal("sequence " + std::to_string(s.seq_id) +
                              ": prompt logprob for the wrong token at position " +
                              std::to_string(first_position + i));
    }
  }
  seq.AdvancePromptLogprobs(first_position + rows.count);
  requests.OnPromptLogprobs(s.seq_id, *it->second, !seq.NeedsPromptLogprobs());
  return Status::Ok();
}

// ======================================================================
// requests

void Engine::Impl::Admit(uint64_t id, EngineRequest request,
                         std::promise<CompletionOutcome> promise) {
  auto fail = [&](Status status) {
    requests.Refuse(std::move(promise), request.stream, std::move(status));
  };
  const bool pd = Disaggregated(registry);
  const TokenIds prompt{request.prompt_ids, {}};
  // A disaggregated request's decode instance is chosen first: what it
  // holds of the prompt decides where the prompt is computed (Place).
  const Route route = router.Pick(registry, pd ? PoolRole::kDecode : PoolRole::kMixed, prompt,
                                  int64_t(prompt.size()));
  Instance* target = route.instance;
  if (target == nullptr) {
    int num_ready = 0;
    int num_draining = 0;
    for (const Instance& inst : registry.instances()) {
      num_ready += inst.ready();
      num_draining += inst.draining();
    }
    return fail(Status::Unavailable(
        "no instance is ready to serve (" + std::to_string(num_ready) + " of " +
        std::to_string(registry.instances().size()) + " instances have all their workers registered" +
        (num_draining > 0 ? ", " + std::to_string(num_draining) + " draining" : "") +
        (pd ? "; a decode instance is needed)" : ")")));
  }
  const Clock::time_point arrival = Clock::now();
  // Prompt logprobs are computed where the prompt is, so such a request
  // stays on its decode instance: a prefill instance returns no logits.
  const bool wants_prompt_logprobs = request.sampling.prompt_logprobs >= 0;
  DisaggregationCoordinator::Placement placement;
  if (pd && wants_prompt_logprobs) {
    placement.reason = LocalPrefillReason::kPromptLogprobs;
  } else if (pd) {
    placement = disaggregation.Place(prompt, *target, route.hit_positions);
  }
  Status added = placement.prefill != nullptr
                     ? disaggregation.Begin(id, request, *placement.prefill, *target, arrival)
                     : AddSequence(*target, id, request, arrival);
  if (!added.ok()) return fail(Status::InvalidArgument(added.message()));
  metrics->OnRouted(target->id, route.hit_positions);
  if (placement.prefill != nullptr) {
    metrics->OnRouted(placement.prefill->id, placement.prefill_hit);
    target = placement.prefill;  // where the request is until its handoff
  } else if (pd) {
    metrics->OnLocalPrefill(placement.reason);
  }
  requests.Add(id, target->id, request.deadline, std::move(promise),
               std::make_unique<OutputProcessor>(*tokenizer,
                                                 StopConditionsOf(request, config, *tokenizer),
                                                 request.sampling.logprobs,
                                                 std::move(request.stream),
                                                 std::move(request.first_token)));
}

Status Engine::Impl::AddSequence(Instance& inst, uint64_t id, const EngineRequest& request,
                                 Clock::time_point arrival, int received_from, int received_to) {
  auto seq = std::make_unique<Sequence>(id, request.prompt_ids, request.sampling,
                                        StopConditionsOf(request, config, *tokenizer), arrival);
  seq->set_received_positions(received_from, received_to);
  return inst.scheduler->Add(std::move(seq));
}

void Engine::Impl::Apply(std::vector<Handoff> handoffs) {
  for (Handoff& h : handoffs) {
    std::optional<int> instance = requests.InstanceOf(h.request_id);
    if (!instance) continue;
    if (!h.status.ok()) {
      EndRequest(registry.at(*instance), h.request_id, h.status);
    } else {
      JoinDecode(h);
    }
  }
}

void Engine::Impl::JoinDecode(Handoff& h) {
  Instance* decode = h.decode >= 0 && registry.at(h.decode).ready()
                         ? &registry.at(h.decode)
                         : LeastLoaded(registry, PoolRole::kDecode);
  if (decode == nullptr) {
    EndRequest(registry.at(*requests.InstanceOf(h.request_id)), h.request_id,
               Status::Unavailable("no decode instance is ready"));
    return;
  }
  // TTFT counts from the client's arrival, prefill and transfer included.
  Status added = AddSequence(*decode, h.request_id, h.request, h.arrival, h.received_from,
                             h.received_to);
  if (!added.ok()) {
    EndRequest(*decode, h.request_id, Status::InvalidArgument(added.message()));
    return;
  }
  requests.JoinedDecode(h.request_id, decode->id, Clock::now());
}

void Engine::Impl::EndRequest(Instance& inst, uint64_t id, Status status) {
  if (!requests.Contains(id)) return;
  disaggregation.Drop(id);
  std::unique_ptr<Sequence> seq = inst.scheduler ? inst.scheduler->Remove(id) : nullptr;
  requests.End(id, inst.id, std::move(seq), std::move(status));
}

void Engine::Impl::Cancel(uint64_t id, Status why) {
  std::optional<int> instance = requests.InstanceOf(id);
  if (!instance) return;
  EndRequest(registry.at(*instance), id, std::move(why));
}

// ======================================================================
// timers and liveness

void Engine::Impl::CheckTimers(Clock::time_point now) {
  for (uint64_t id : requests.Expired(now)) {
    Cancel(id, Status::DeadlineExceeded("the request did not finish before its deadline"));
  }
  for (auto& [inst, why] : registry.FindSilent(now)) LoseRanks(*inst, why);
  for (auto& [inst, why] : registry.FindStragglers(now)) LoseRanks(*inst, why);
  Apply(disaggregation.CheckDeadlines(now));
  CheckDrains(now);
}

void Engine::Impl::Drain(Instance& inst, const std::string& why, Clock::time_point now) {
  if (!inst.ready() || inst.draining()) return;
  inst.drain_deadline = now + std::chrono::milliseconds(config.drain_timeout_ms);
  spdlog::info("instance {} is draining ({} requests, at most {} ms): {}", inst.id,
               requests.OnInstance(inst.id).size(), config.drain_timeout_ms, why);
}

void Engine::Impl::CheckDrains(Clock::time_point now) {
  for (Instance& inst : registry.instances()) {
    if (!inst.draining()) continue;
    if (requests.OnInstance(inst.id).empty() && !inst.in_flight) {
      spdlog::info("instance {} drained; its workers may leave", inst.id);
      registry.ReleaseRanks(inst, "instance " + std::to_string(inst.id) + " drained");
      registry.Reset(inst);
      metrics->OnInstanceDrained();
    } else if (now >= *inst.drain_deadline) {
      const std::string why = "its drain did not end within drain_timeout_ms = " +
                              std::to_string(config.drain_timeout_ms);
      registry.ReleaseRanks(inst, "instance " + std::to_string(inst.id) + ": " + why);
      MarkDown(inst, why);
      metrics->OnInstanceDrained();
    }
  }
}

void Engine::Impl::MarkDown(Instance& inst, const std::string& why, bool orderly) {
  if (orderly) {
    spdlog::info("instance {} is down: {}", inst.id, why);
  } else {
    spdlog::error("instance {} is down: {}", inst.id, why);
  }
  // Requests still prefilling or transferring from a lost prefill instance
  // fall back to a decode instance, which prefills them itself (the
  // disaggregation coordinator's). The sequences of the others leave the
  // instance's scheduler before it goes: those whose client has been sent
  // nothing (no token yet, or not streaming) move, in arrival order; the
  // rest fail.
  const std::string down = "instance " + std::to_string(inst.id) + " is down: " + why;
  std::vector<std::unique_ptr<Sequence>> unsent;
  std::vector<std::pair<uint64_t, Status>> failed;
  for (uint64_t id : requests.OnInstance(inst.id)) {
    if (disaggregation.HasJob(id)) continue;
    std::unique_ptr<Sequence> seq = inst.scheduler ? inst.scheduler->Remove(id) : nullptr;
    const bool sent = seq != nullptr && seq->num_output_tokens() > 0 && requests.Streams(id);
    if (seq != nullptr && seq->kind() == SequenceKind::kGenerate && !sent) {
      unsent.push_back(std::move(seq));
    } else {
      failed.emplace_back(
          id, Status::Unavailable(sent ? down + " (the request had streamed tokens)" : down));
    }
  }
  std::sort(unsent.begin(), unsent.end(), [](const auto& a, const auto& b) {
    return std::pair(a->arrival_time(), a->seq_id()) < std::pair(b->arrival_time(), b->seq_id());
  });
  registry.Reset(inst);  // its blocks go with its scheduler
  Apply(disaggregation.OnInstanceDown(inst.id));
  size_t num_moved = 0;
  for (const std::unique_ptr<Sequence>& seq : unsent) {
    if (Readmit(inst, *seq)) {
      ++num_moved;
    } else {
      failed.emplace_back(seq->seq_id(),
                          Status::Unavailable(down + " (no other " + PoolRoleName(inst.role) +
                                              " instance could take the request)"));
    }
  }
  if (num_moved > 0 || !failed.empty()) {
    spdlog::warn("instance {} is down: {} of its requests moved to other instances, {} failed",
                 inst.id, num_moved, failed.size());
  }
  for (auto& [id, status] : failed) EndRequest(inst, id, std::move(status));
}

bool Engine::Impl::Readmit(const Instance& from, const Sequence& seq) {
  Instance* to = LeastLoaded(registry, from.role);
  if (to == nullptr) return false;
  Status added = to->scheduler->Add(std::make_unique<Sequence>(
      seq.seq_id(), seq.prompt_ids(), seq.sampling(), seq.stop(), seq.arrival_time()));
  if (!added.ok()) {
    spdlog::warn("request {}: instance {} cannot take it: {}", seq.seq_id(), to->id,
                 added.message());
    return false;
  }
  requests.MovedTo(seq.seq_id(), to->id);
  metrics->OnRequestMoved();
  return true;
}

void Engine::Impl::Shutdown(const std::string& reason) {
  registry.ShutdownAll(reason);
  for (uint64_t id : requests.Ids()) Cancel(id, Status::Unavailable(reason));
}

std::vector<InstanceHealth> Engine::Impl::Snapshot() {
  std::vector<InstanceHealth> health = registry.Snapshot();
  for (const InstanceHealth& h : health) {
    metrics->SetQueueState(h.instance_id, int64_t(h.num_running), int64_t(h.num_waiting));
    metrics->SetInstanceState(h.instance_id, h.state);
    for (const RankHealth& r : h.ranks) {
      metrics->SetKvUsage(h.instance_id, r.tp_rank, r.used_shares, r.total_shares);
      metrics->SetKvRetained(h.instance_id, r.tp_rank, r.retained_blocks);
      for (const auto& [owner, chunks] : r.arena_chunks) {
        metrics->SetKvArenaChunks(h.instance_id, r.tp_rank, owner, chunks);
      }
    }
  }
  return health;
}

// ======================================================================
// Engine

Engine::Engine(Config config, ModelSpec spec, const Tokenizer* tokenizer,
               std::unique_ptr<ControlServer> server)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(spec), tokenizer,
                                   std::move(server))),
      health_(impl_->registry.Snapshot()) {}

Engine::~Engine() { Stop(); }

void Engine::Start() {
  HW_CHECK(!thread_.joinable());
  thread_ = std::thread([this] { Run(); });
}

void Engine::Stop(const std::string& reason) {
  std::call_once(stop_once_, [&] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      accepting_ = false;
      stop_reason_ = reason;
    }
    stop_requested_ = true;
    if (thread_.joinable()) {
      thread_.join();
    } else {
      impl_->Shutdown(reason);  // never started: still fail queued requests
      impl_->requests.AnswerEnded();
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (Pending& p : submitted_) {
      CompletionOutcome out;
      out.status = Status::Unavailable(reason);
      if (p.request.stream) p.request.stream->Close("", out);
      p.promise.set_value(std::move(out));
    }
    submitted_.clear();
  });
}

std::future<CompletionOutcome> Engine::Submit(EngineRequest request, uint64_t* request_id) {
  uint64_t id = next_request_id_++;
  if (request_id) *request_id = id;
  std::promise<CompletionOutcome> promise;
  std::future<CompletionOutcome> future = promise.get_future();
  std::lock_guard<std::mutex> lock(mu_);
  if (!accepting_) {
    CompletionOutcome out;
    out.status = Status::Unavailable("the server is shutting down");
    if (request.stream) request.stream->Close("", out);
    promise.set_value(std::move(out));
    return future;
  }
  submitted_.push_back(Pending{id, std::move(request), std::move(promise)});
  return future;
}

void Engine::Cancel(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_.push_back(request_id);
}

std::vector<InstanceHealth> Engine::Health() const { return health_.Health(); }

const ServingMetrics& Engine::metrics() const { return *impl_->metrics; }

void Engine::TakeSubmitted(std::vector<Pending>* submitted, std::vector<uint64_t>* cancelled) {
  std::lock_guard<std::mutex> lock(mu_);
  submitted->swap(submitted_);
  cancelled->swap(cancelled_);
}

Status Engine::Drain(int instance_id, const std::string& why) {
  return health_.RequestDrain(instance_id, why);
}

void Engine::Run() {
  Impl& impl = *impl_;
  while (!stop_requested_) {
    impl.CollectMessages();
    std::vector<Pending> submitted;
    std::vector<uint64_t> cancelled;
    TakeSubmitted(&submitted, &cancelled);
    for (DrainRequest& d : health_.TakeDrains()) {
      impl.Drain(impl.registry.at(d.instance_id), d.why, Clock::now());
    }
    for (Pending& p : submitted) impl.Admit(p.id, std::move(p.request), std::move(p.promise));
    for (uint64_t id : cancelled) impl.Cancel(id, Status::Cancelled("the request was cancelled"));
    const Clock::time_point now = Clock::now();
    impl.CheckTimers(now);
    impl.ScheduleAndDispatch(now);
    health_.Publish(impl.Snapshot());
    impl.requests.AnswerEnded();
  }
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reason = stop_reason_;
  }
  impl.Shutdown(reason);
  impl.requests.AnswerEnded();
}

}  // namespace headway
