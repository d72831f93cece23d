#include "coordinator/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <unordered_map>

#include "coordinator/engine_impl.h"
#include "coordinator/registration.h"

namespace headway {
namespace {

// How long one Receive may block when nothing else needs the thread; bounds
// the latency of picking up a submitted request.
constexpr std::chrono::milliseconds kPollTimeout(2);
// Messages handled per loop iteration before scheduling again.
constexpr int kMaxMessagesPerIteration = 256;

uint64_t UnixMillis() {
  return uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count());
}

}  // namespace

// ======================================================================
// messages

void Engine::Impl::Handle(const Inbound& in) {
  const proto::Envelope& env = in.envelope;
  if (env.has_register_request()) {
    HandleRegister(in.peer, env.register_request());
    return;
  }
  auto it = peers.find(in.peer);
  if (it == peers.end()) {
    spdlog::warn("control: message from unknown peer `{}` ignored", in.peer);
    return;
  }
  InstanceState& inst = instances[it->second.first];
  int rank = it->second.second;
  // Ranks meet through the store before they register.
  if (env.has_store_set() || env.has_store_get()) {
    HandleStore(inst, in.peer, env);
    return;
  }
  RankState& rs = inst.ranks[rank];
  if (!rs.registered) {
    spdlog::debug("control: message from unregistered peer `{}` ignored", in.peer);
    return;
  }
  rs.last_heard = Clock::now();
  if (env.has_step_result()) {
    HandleStepResult(inst, rank, env.step_result());
  } else if (env.has_transfer_result()) {
    HandleTransferResult(env.transfer_result());
  }
  // Heartbeats only refresh last_heard.
}

void Engine::Impl::HandleStore(InstanceState& inst, const std::string& peer,
                               const proto::Envelope& env) {
  if (env.has_store_set()) {
    inst.store[env.store_set().key()] = env.store_set().value();
    return;
  }
  proto::Envelope reply;
  proto::StoreValue* value = reply.mutable_store_value();
  value->set_key(env.store_get().key());
  auto it = inst.store.find(env.store_get().key());
  value->set_found(it != inst.store.end());
  if (it != inst.store.end()) value->set_value(it->second);
  Status s = server->Send(peer, reply);
  if (!s.ok()) spdlog::warn("cannot answer store get from `{}`: {}", peer, s.message());
}

void Engine::Impl::HandleRegister(const std::string& peer, const proto::RegisterRequest& req) {
  proto::Envelope reply;
  Status valid = ValidateRegisterRequest(req, peer, config, spec);
  reply.mutable_register_response()->set_accepted(valid.ok());
  if (!valid.ok()) {
    spdlog::error("rejected worker `{}` (pid {}): {}", peer, req.pid(), valid.message());
    reply.mutable_register_response()->set_error(valid.message());
    Status s = server->Send(peer, reply);
    if (!s.ok()) spdlog::warn("cannot answer `{}`: {}", peer, s.message());
    return;
  }
  InstanceState& inst = instances[req.instance_id()];
  int rank = int(req.tp_rank());
  if (inst.ranks[rank].registered) {
    // The worker restarted: whatever the instance had in flight is lost.
    MarkDown(inst, "worker `" + peer + "` registered again (restarted)");
  }
  RankState& rs = inst.ranks[rank];
  rs.registered = true;
  rs.num_blocks = int(req.num_blocks());
  rs.last_heard = Clock::now();
  rs.kv_endpoint = req.kv_endpoint();
  Status s = server->Send(peer, reply);
  if (!s.ok()) spdlog::warn("cannot answer `{}`: {}", peer, s.message());
  spdlog::info("worker `{}` registered (pid {}, {} blocks of {} positions)", peer, req.pid(),
               req.num_blocks(), req.block_size());

  bool all = std::all_of(inst.ranks.begin(), inst.ranks.end(),
                         [](const RankState& r) { return r.registered; });
  if (all && !inst.ready()) {
    std::vector<int> num_blocks;
    for (const RankState& r : inst.ranks) num_blocks.push_back(r.num_blocks);
    KvCacheOptions kv_options;
    kv_options.enable_prefix_caching = config.enable_prefix_caching;
    kv_options.enable_recycling = config.enable_recycling;
    kv_options.recycling_granularity = config.recycling_granularity == "layer"
                                           ? KvCacheOptions::Granularity::kLayer
                                           : KvCacheOptions::Granularity::kKvHead;
    auto kv = std::make_unique<KvCacheManager>(spec, inst.tp_size, config.block_size, num_blocks,
                                               kv_options);
    SchedulerConfig sc{config.max_num_seqs, config.max_num_batched_tokens};
    inst.scheduler = std::make_unique<Scheduler>(sc, std::move(kv));
    ++inst.generation;
    // The new scheduler counts from zero.
    inst.reported_preemptions = 0;
    inst.reported_recycled = 0;
    inst.reported_prefix = {};
    inst.in_flight.reset();
    spdlog::info("instance {} ready (tp_size {}; at most {} positions per sequence)", inst.id,
                 inst.tp_size, inst.scheduler->MaxPositionsPerSequence());
  }
}

void Engine::Impl::Send(InstanceState& inst, int rank, const proto::Envelope& env) {
  Status s = server->Send(PeerName(inst.id, rank), env);
  if (!s.ok()) spdlog::warn("control send to instance {} rank {}: {}", inst.id, rank, s.message());
}

void Engine::Impl::HandleStepResult(InstanceState& inst, int rank,
                                    const proto::StepResult& result) {
  if (result.fatal()) {
    // A rank whose collectives broke cannot finish this or any later step;
    // waiting for the others would only delay the errors.
    StopRanks(inst, "rank " + std::to_string(rank) + " failed: " + result.error());
    MarkDown(inst, "worker `" + PeerName(inst.id, rank) + "` failed: " + result.error());
    return;
  }
  if (!inst.in_flight || result.step_id() != inst.in_flight->step_id) {
    spdlog::warn("instance {} rank {}: step result for step {} rejected (in flight: {})", inst.id,
                 rank, result.step_id(),
                 inst.in_flight ? std::to_string(inst.in_flight->step_id) : "none");
    return;
  }
  InFlight& f = *inst.in_flight;
  if (f.answered[rank]) {
    spdlog::warn("instance {} rank {}: duplicate result for step {} ignored", inst.id, rank,
                 result.step_id());
    return;
  }
  f.answered[rank] = true;
  if (!result.error().empty() && f.error.empty()) {
    f.error = "instance " + std::to_string(inst.id) + " rank " + std::to_string(rank) +
              " failed step " + std::to_string(result.step_id()) + ": " + result.error();
  }
  if (rank == 0) f.tokens.assign(result.tokens().begin(), result.tokens().end());
  if (std::all_of(f.answered.begin(), f.answered.end(), [](bool b) { return b; })) Complete(inst);
}

// ======================================================================
// steps: schedule -> dispatch -> collect

void Engine::Impl::Dispatch(InstanceState& inst) {
  if (!inst.ready() || inst.in_flight || !inst.scheduler->HasWork()) return;
  ScheduledBatch batch = inst.scheduler->Schedule();
  ReportSchedulerCounters(inst);
  if (batch.empty()) return;
  const Clock::time_point now = Clock::now();
  for (const ScheduledSeq& s : batch.seqs) {
    auto it = requests.find(s.seq_id);
    if (it == requests.end() || it->second.scheduled) continue;
    it->second.scheduled = true;
    const Sequence& seq = *inst.scheduler->Find(s.seq_id);
    metrics->OnScheduled(inst.id, Seconds(now - seq.arrival_time()));
  }
  uint64_t step_id = inst.next_step_id++;
  for (int rank = 0; rank < inst.tp_size; ++rank) {
    proto::Envelope env;
    proto::StepPlan* plan = env.mutable_step_plan();
    plan->set_step_id(step_id);
    for (uint64_t id : batch.released_seq_ids) plan->add_released_seq_ids(id);
    for (const ScheduledSeq& s : batch.seqs) {
      const Sequence& seq = *inst.scheduler->Find(s.seq_id);
      proto::SequenceStep* step = plan->add_seqs();
      step->set_seq_id(s.seq_id);
      step->set_is_new(s.is_new);
      for (int p = s.start_pos; p < s.start_pos + s.num_tokens; ++p) {
        step->add_token_ids(seq.TokenAt(p));
      }
      step->set_start_pos(uint32_t(s.start_pos));
      step->set_sample(s.sample);
      proto::SamplingParams* sp = step->mutable_sampling();
      sp->set_temperature(seq.sampling().temperature);
      sp->set_top_p(seq.sampling().top_p);
      sp->set_top_k(seq.sampling().top_k);
      sp->set_has_seed(seq.sampling().seed.has_value());
      sp->set_seed(seq.sampling().seed.value_or(0));
      sp->set_num_logprobs(seq.sampling().num_top_logprobs);
      step->set_num_generated(uint32_t(seq.num_output_tokens()));
      for (const SlotBlockDelta& d : s.deltas[rank]) {
        proto::SlotDelta* pd = step->add_deltas();
        pd->set_slot(uint32_t(d.slot));
        pd->set_first_logical(uint32_t(d.first_logical));
        for (int32_t b : d.appended) pd->add_appended(b);
        for (int32_t i : d.recycled) pd->add_recycled(uint32_t(i));
      }
    }
    Send(inst, rank, env);
  }
  InFlight f;
  f.step_id = step_id;
  f.batch = std::move(batch);
  f.answered.assign(inst.tp_size, false);
  inst.in_flight = std::move(f);
}

void Engine::Impl::Complete(InstanceState& inst) {
  InFlight f = std::move(*inst.in_flight);
  inst.in_flight.reset();
  if (!f.error.empty()) {
    spdlog::error("{}", f.error);
    for (const ScheduledSeq& s : f.batch.seqs) {
      const uint64_t id = s.seq_id & ~kJobBit;  // a prefill job fails its request
      if (requests.count(id)) FinishRequest(inst, id, ApiError::Internal(f.error));
    }
    return;
  }
  inst.scheduler->OnStepComputed(f.batch);
  std::unordered_map<uint64_t, const proto::SampledToken*> sampled;
  for (const proto::SampledToken& t : f.tokens) sampled[t.seq_id()] = &t;
  for (const ScheduledSeq& s : f.batch.seqs) {
    if (!s.sample) continue;
    Sequence* seq = inst.scheduler->Find(s.seq_id);
    if (seq == nullptr) continue;  // cancelled while the step ran
    if (s.seq_id & kJobBit) {      // a prefill job's prompt is computed
      OnPrefillDone(inst, s.seq_id);
      continue;
    }
    auto it = sampled.find(s.seq_id);
    int32_t token_id = it == sampled.end() ? -1 : it->second->token_id();
    if (token_id < 0 || token_id >= tokenizer->vocab_size()) {
      std::string why = it == sampled.end()
                            ? "no sampled token"
                            : "sampled token id " + std::to_string(token_id) + " out of range";
      FinishRequest(inst, s.seq_id,
                    ApiError::Internal("instance " + std::to_string(inst.id) + " step " +
                                       std::to_string(f.step_id) + " returned " + why +
                                       " for sequence " + std::to_string(s.seq_id)));
      continue;
    }
    OnSampled(inst, *seq, *it->second);
  }
}

void Engine::Impl::OnSampled(InstanceState& inst, Sequence& seq, const proto::SampledToken& sampled) {
  Clock::time_point now = Clock::now();
  RequestState& rs = requests.at(seq.seq_id());
  const int32_t token_id = sampled.token_id();
  seq.AppendToken(token_id, now);
  if (seq.num_output_tokens() == 1) {
    metrics->OnFirstToken(inst.id, Seconds(now - seq.arrival_time()));
    if (rs.joined_decode) metrics->OnPdFirstDecode(Seconds(now - *rs.joined_decode));
  } else {
    metrics->OnToken(inst.id, Seconds(now - rs.last_token_time));
  }
  rs.last_token_time = now;
  GeneratedToken token;
  token.token_id = token_id;
  if (rs.logprobs) {
    token.logprob = sampled.logprob();
    for (const proto::TopLogprob& t : sampled.top_logprobs()) {
      token.top_logprobs.emplace_back(t.token_id(), t.logprob());
    }
    rs.tokens.push_back(token);
  }
  // Special tokens (EOS, <|im_end|>, ...) are not part of the text, as with
  // vLLM's default skip_special_tokens, and neither is a token that stops
  // the sequence (EOS, stop_token_ids), as in vLLM's detokenizer.
  const StopConditions& stop = seq.stop();
  bool is_stop_token = (!stop.ignore_eos && token_id == stop.eos_id) ||
                       std::find(stop.stop_token_ids.begin(), stop.stop_token_ids.end(), token_id) !=
                           stop.stop_token_ids.end();
  if (!is_stop_token && !tokenizer->IsSpecial(token_id)) rs.text += rs.decoder->Push(token_id);
  bool done = seq.CheckStop(rs.text, now);
  if (rs.stream) {
    // Stream what no stop string can still cut; the rest goes out at the end.
    size_t safe = done ? rs.num_streamed : StreamableLength(rs.text, seq.stop().stop_strings);
    safe = std::max(safe, rs.num_streamed);
    rs.stream->Push(std::string_view(rs.text).substr(rs.num_streamed, safe - rs.num_streamed),
                    std::move(token));
    rs.num_streamed = safe;
  }
  if (!done) return;
  // A stop string trims the text; otherwise what the decoder held back
  // (an incomplete character at the very end) is part of the answer.
  if (seq.output_text().size() == rs.text.size()) seq.set_output_text(rs.text + rs.decoder->Flush());
  FinishRequest(inst, seq.seq_id(), std::nullopt);
}

// ======================================================================
// requests

void Engine::Impl::Admit(uint64_t id, EngineRequest request,
                         std::promise<CompletionOutcome> promise) {
  auto fail = [&](ApiError e) {
    CompletionOutcome out;
    out.error = std::move(e);
    completed.push_back(Completed{std::move(promise), std::move(out), request.stream, ""});
  };
  const bool pd = Disaggregated();
  // Prompts of at least one whole block (besides the last position) go
  // through a prefill instance; shorter ones have nothing to transfer.
  const int64_t full = (int64_t(request.prompt_ids.size()) - 1) / config.block_size *
                       config.block_size;
  InstanceState* prefill = pd && full > 0 ? LeastLoaded(PoolRole::kPrefill) : nullptr;
  InstanceState* target =
      prefill != nullptr ? prefill : LeastLoaded(pd ? PoolRole::kDecode : PoolRole::kMixed);
  if (target == nullptr) {
    int num_ready = 0;
    for (const InstanceState& inst : instances) num_ready += inst.ready();
    return fail(ApiError::Unavailable(
        "no instance is ready to serve (" + std::to_string(num_ready) + " of " +
        std::to_string(instances.size()) + " instances have all their workers registered" +
        (pd ? ", and both a prefill and a decode instance are needed)" : ")")));
  }
  if (prefill != nullptr) {
    // The job computes the prompt's whole blocks and samples one token that
    // is dropped; the decode instance samples the first real token.
    EngineRequest job_request;
    job_request.prompt_ids.assign(request.prompt_ids.begin(), request.prompt_ids.begin() + full);
    job_request.max_tokens = 1;
    job_request.ignore_eos = true;
    const Clock::time_point arrival = Clock::now();
    Status added = AddSequence(*prefill, id | kJobBit, job_request, arrival);
    if (!added.ok()) return fail(ApiError::BadRequest(added.message()));
    PdJob job;
    job.request_id = id;
    job.prefill = prefill->id;
    job.prefill_generation = prefill->generation;
    job.full_positions = full;
    job.arrival = arrival;
    job.request = request;
    jobs.emplace(id | kJobBit, std::move(job));
  } else {
    Status added = AddSequence(*target, id, request, Clock::now());
    if (!added.ok()) return fail(ApiError::BadRequest(added.message()));
  }
  RequestState rs;
  rs.instance = target->id;
  rs.deadline = request.deadline;
  rs.promise = std::move(promise);
  rs.decoder = std::make_unique<StreamDecoder>(*tokenizer);
  rs.logprobs = request.logprobs;
  rs.stream = std::move(request.stream);
  requests.emplace(id, std::move(rs));
}

Status Engine::Impl::AddSequence(InstanceState& inst, uint64_t id, const EngineRequest& request,
                                 Clock::time_point arrival) {
  StopConditions stop;
  stop.max_tokens = request.max_tokens;
  stop.max_model_len = config.max_model_len;
  stop.ignore_eos = request.ignore_eos;
  stop.eos_id = tokenizer->eos_id();
  stop.stop_strings = request.stop;
  stop.stop_token_ids = request.stop_token_ids;
  auto seq = std::make_unique<Sequence>(id, request.prompt_ids, request.sampling,
                                        std::move(stop), arrival);
  return inst.scheduler->Add(std::move(seq));
}

void Engine::Impl::FinishRequest(InstanceState& inst, uint64_t id, std::optional<ApiError> error) {
  auto it = requests.find(id);
  if (it == requests.end()) return;
  DropJob(id);
  std::unique_ptr<Sequence> seq = inst.scheduler ? inst.scheduler->Remove(id) : nullptr;
  RequestState& rs = it->second;
  CompletionOutcome out;
  std::string unstreamed;
  const bool aborted = error && error->http_status == 499;  // the client went away
  if (seq != nullptr && (!error || aborted)) {
    metrics->OnFinished(inst.id, aborted ? FinishReason::kAbort : seq->finish_reason(),
                        Seconds(Clock::now() - seq->arrival_time()), seq->num_prompt_tokens(),
                        seq->num_output_tokens());
  }
  if (error) {
    out.error = std::move(error);
  } else {
    HW_CHECK(seq != nullptr);
    out.text = seq->output_text();
    out.finish_reason = seq->finish_reason();
    out.stop_reason = seq->stop_string();
    out.stop_token_id = seq->stop_token_id();
    out.num_prompt_tokens = seq->num_prompt_tokens();
    out.num_output_tokens = seq->num_output_tokens();
    out.num_cached_tokens = seq->num_cached_tokens();
    out.output_ids = seq->output_ids();
    out.tokens = std::move(rs.tokens);
    if (rs.num_streamed < out.text.size()) unstreamed = out.text.substr(rs.num_streamed);
  }
  completed.push_back(Completed{std::move(rs.promise), std::move(out), std::move(rs.stream),
                                std::move(unstreamed)});
  requests.erase(it);
}

void Engine::Impl::Cancel(uint64_t id, ApiError why) {
  auto it = requests.find(id);
  if (it == requests.end()) return;
  FinishRequest(instances[it->second.instance], id, std::move(why));
}

void Engine::Impl::CheckDeadlines(Clock::time_point now) {
  std::vector<uint64_t> expired;
  for (const auto& [id, rs] : requests) {
    if (now >= rs.deadline) expired.push_back(id);
  }
  for (uint64_t id : expired) {
    Cancel(id, ApiError::Unavailable("the request did not finish before its deadline"));
  }
}

// ======================================================================
// liveness

void Engine::Impl::SendHeartbeats(Clock::time_point now) {
  if (now - last_heartbeat_sent < std::chrono::milliseconds(config.heartbeat_interval_ms)) return;
  last_heartbeat_sent = now;
  proto::Envelope env;
  env.mutable_heartbeat()->set_sent_unix_ms(UnixMillis());
  for (InstanceState& inst : instances) {
    for (int r = 0; r < inst.tp_size; ++r) {
      if (inst.ranks[r].registered) Send(inst, r, env);
    }
  }
}

void Engine::Impl::CheckLiveness(Clock::time_point now) {
  auto timeout = std::chrono::milliseconds(config.heartbeat_timeout_ms);
  for (InstanceState& inst : instances) {
    for (int r = 0; r < inst.tp_size; ++r) {
      const RankState& rs = inst.ranks[r];
      if (!rs.registered || now - rs.last_heard <= timeout) continue;
      auto silent_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(now - rs.last_heard).count();
      const std::string why = "worker `" + PeerName(inst.id, r) + "` has been silent for " +
                              std::to_string(silent_ms) + " ms (heartbeat_timeout_ms " +
                              std::to_string(config.heartbeat_timeout_ms) + ")";
      StopRanks(inst, why);
      MarkDown(inst, why);
      break;
    }
  }
}

void Engine::Impl::MarkDown(InstanceState& inst, const std::string& why) {
  spdlog::error("instance {} is down: {}", inst.id, why);
  // Requests still prefilling or transferring from a lost prefill instance
  // fall back to a decode instance, which prefills them itself; every other
  // request of the instance fails.
  std::vector<uint64_t> orphaned;
  for (const auto& [job_id, job] : jobs) {
    if (job.prefill == inst.id) orphaned.push_back(job_id);
  }
  std::vector<uint64_t> ids;
  for (const auto& [id, rs] : requests) {
    if (rs.instance == inst.id && jobs.count(id | kJobBit) == 0) ids.push_back(id);
  }
  inst.scheduler.reset();
  inst.in_flight.reset();
  inst.store.clear();  // a restarted group must not read the old addresses
  for (RankState& r : inst.ranks) r.registered = false;

  for (uint64_t job_id : orphaned) {
    PdJob& job = jobs.at(job_id);
    spdlog::warn("request {}: its prefill instance {} is down; a decode instance prefills it",
                 job.request_id, inst.id);
    if (job.transferring) {
      job.error = "the prefill instance went down";
      EndTransfer(job_id, false);  // no retry: the writer is gone
    } else {
      JoinDecode(job, false);
      jobs.erase(job_id);
    }
  }
  ApiError error = ApiError::Unavailable("instance " + std::to_string(inst.id) + " is down: " + why);
  for (uint64_t id : ids) FinishRequest(inst, id, error);
}

void Engine::Impl::StopRanks(InstanceState& inst, const std::string& reason) {
  proto::Envelope env;
  env.mutable_shutdown()->set_reason("instance " + std::to_string(inst.id) + " is down: " + reason);
  for (int r = 0; r < inst.tp_size; ++r) {
    if (inst.ranks[r].registered) Send(inst, r, env);
  }
}

void Engine::Impl::Shutdown(const std::string& reason) {
  proto::Envelope env;
  env.mutable_shutdown()->set_reason(reason);
  for (InstanceState& inst : instances) {
    for (int r = 0; r < inst.tp_size; ++r) {
      if (inst.ranks[r].registered) Send(inst, r, env);
    }
    std::vector<uint64_t> ids;
    for (const auto& [id, rs] : requests) {
      if (rs.instance == inst.id) ids.push_back(id);
    }
    for (uint64_t id : ids) FinishRequest(inst, id, ApiError::Unavailable(reason));
  }
}

void Engine::Impl::ReportSchedulerCounters(InstanceState& inst) {
  const size_t preemptions = inst.scheduler->num_preemptions();
  if (preemptions > inst.reported_preemptions) {
    metrics->OnPreemption(inst.id, int64_t(preemptions - inst.reported_preemptions));
    inst.reported_preemptions = preemptions;
  }
  const uint64_t recycled = inst.scheduler->kv().num_recycled_blocks();
  if (recycled > inst.reported_recycled) {
    metrics->OnKvBlocksRecycled(inst.id, int64_t(recycled - inst.reported_recycled));
    inst.reported_recycled = recycled;
  }
  const PrefixCacheStats& stats = inst.scheduler->prefix_cache_stats();
  if (stats.num_queried_tokens > inst.reported_prefix.num_queried_tokens) {
    metrics->OnPrefixCacheQuery(
        inst.id, int64_t(stats.num_queried_tokens - inst.reported_prefix.num_queried_tokens),
        int64_t(stats.num_hit_tokens - inst.reported_prefix.num_hit_tokens));
    inst.reported_prefix = stats;
  }
}

void Engine::Impl::ReportGauges(const std::vector<InstanceHealth>& health) {
  for (const InstanceHealth& h : health) {
    metrics->SetQueueState(h.instance_id, int64_t(h.num_running), int64_t(h.num_waiting));
    for (const RankHealth& r : h.ranks) {
      metrics->SetKvUsage(h.instance_id, r.tp_rank, r.total_blocks - r.free_blocks,
                          r.total_blocks);
    }
  }
}

std::vector<InstanceHealth> Engine::Impl::Snapshot() const {
  std::vector<InstanceHealth> out;
  for (const InstanceState& inst : instances) {
    InstanceHealth h;
    h.instance_id = inst.id;
    h.tp_size = inst.tp_size;
    h.ready = inst.ready();
    if (inst.ready()) {
      h.num_waiting = inst.scheduler->num_waiting();
      h.num_running = inst.scheduler->num_running();
    }
    for (int r = 0; r < inst.tp_size; ++r) {
      RankHealth rh;
      rh.tp_rank = r;
      rh.registered = inst.ranks[r].registered;
      if (inst.ready()) {
        RankBlockUsage u = inst.scheduler->kv().Usage(r);
        rh.free_blocks = u.num_free;
        rh.total_blocks = u.num_total;
      }
      h.ranks.push_back(rh);
    }
    out.push_back(std::move(h));
  }
  return out;
}

// ======================================================================
// Engine

Engine::Engine(Config config, ModelSpec spec, const Tokenizer* tokenizer,
               std::unique_ptr<ControlServer> server)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(spec), tokenizer,
                                   std::move(server))) {
  health_ = impl_->Snapshot();
}

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
      impl_->AnswerCompleted();
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (Pending& p : submitted_) {
      CompletionOutcome out;
      out.error = ApiError::Unavailable(reason);
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
    out.error = ApiError::Unavailable("the server is shutting down");
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

std::vector<InstanceHealth> Engine::Health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return health_;
}

const ServingMetrics& Engine::metrics() const { return *impl_->metrics; }

bool Engine::AllReady() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::all_of(health_.begin(), health_.end(),
                     [](const InstanceHealth& h) { return h.ready; });
}

void Engine::Run() {
  Impl& impl = *impl_;
  while (!stop_requested_) {
    // Collect: block briefly for the first message, then drain the rest.
    std::optional<Inbound> in = impl.server->Receive(kPollTimeout);
    for (int n = 0; in && n < kMaxMessagesPerIteration; ++n) {
      impl.Handle(*in);
      in = impl.server->Receive(std::chrono::milliseconds(0));
    }
    if (in) impl.Handle(*in);

    std::vector<Pending> submitted;
    std::vector<uint64_t> cancelled;
    {
      std::lock_guard<std::mutex> lock(mu_);
      submitted.swap(submitted_);
      cancelled.swap(cancelled_);
    }
    for (Pending& p : submitted) impl.Admit(p.id, std::move(p.request), std::move(p.promise));
    for (uint64_t id : cancelled) {
      impl.Cancel(id, ApiError{499, "the request was cancelled", "server_error", "", ""});
    }
    Clock::time_point now = Clock::now();
    impl.CheckDeadlines(now);
    impl.CheckLiveness(now);
    impl.CheckTransferDeadlines(now);

    // Schedule and dispatch every idle instance.
    for (Impl::InstanceState& inst : impl.instances) impl.Dispatch(inst);
    impl.SendHeartbeats(now);

    std::vector<InstanceHealth> snapshot = impl.Snapshot();
    impl.ReportGauges(snapshot);
    {
      std::lock_guard<std::mutex> lock(mu_);
      health_ = std::move(snapshot);
    }
    impl.AnswerCompleted();
  }
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reason = stop_reason_;
  }
  impl.Shutdown(reason);
  impl.AnswerCompleted();
}

}  // namespace headway
