#include "coordinator/engine/instance_registry.h"

#include "common/step_limits.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "coordinator/engine/registration.h"

namespace headway {
namespace {

uint64_t UnixMillis() {
  return uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count());
}

}  // namespace

bool CanServe(const std::vector<InstanceHealth>& health) {
  const bool disaggregated = std::any_of(health.begin(), health.end(), [](const InstanceHealth& h) {
    return h.role == PoolRole::kPrefill;
  });
  const PoolRole needed = disaggregated ? PoolRole::kDecode : PoolRole::kMixed;
  return std::any_of(health.begin(), health.end(), [needed](const InstanceHealth& h) {
    return h.state == InstanceState::kReady && h.role == needed;
  });
}

InstanceRegistry::InstanceRegistry(const Config& config, const ModelSpec& spec,
                                   ControlServer* server, ServingMetrics* metrics)
    : config_(config), spec_(spec), server_(server), metrics_(metrics) {
  std::vector<const InstanceConfig*> configs = config_.Instances();
  for (size_t i = 0; i < configs.size(); ++i) {
    Instance inst;
    inst.id = int(i);
    inst.tp_size = configs[i]->tp_size;
    inst.role = config_.RoleOf(int(i));
    inst.standby = config_.IsStandby(int(i));
    inst.collective_timeout = std::chrono::milliseconds(configs[i]->collective_timeout_ms);
    inst.ranks.resize(size_t(inst.tp_size));
    instances_.push_back(std::move(inst));
    for (int r = 0; r < configs[i]->tp_size; ++r) peers_[PeerName(int(i), r)] = {int(i), r};
  }
}

bool InstanceRegistry::Alive(int id, uint64_t generation) const {
  return id >= 0 && size_t(id) < instances_.size() && instances_[size_t(id)].ready() &&
         instances_[size_t(id)].generation == generation;
}

std::optional<InstanceRegistry::Peer> InstanceRegistry::FindPeer(const std::string& peer) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return std::nullopt;
  return Peer{&instances_[size_t(it->second.first)], it->second.second};
}

Instance* InstanceRegistry::CheckRegistration(const std::string& peer,
                                              const proto::RegisterRequest& request) {
  Status valid = ValidateRegisterRequest(request, peer, config_, spec_);
  if (valid.ok()) return &instances_[request.instance_id()];
  spdlog::error("rejected worker `{}` (pid {}): {}", peer, request.pid(), valid.message());
  proto::Envelope reply;
  reply.mutable_register_response()->set_accepted(false);
  reply.mutable_register_response()->set_error(valid.message());
  Reply(peer, reply);
  return nullptr;
}

bool InstanceRegistry::Register(Instance& inst, const std::string& peer,
                                const proto::RegisterRequest& request) {
  RankState& rs = inst.ranks[request.tp_rank()];
  HW_CHECK(!rs.registered);
  rs.registered = true;
  rs.num_chunks = int(request.num_chunks());
  rs.last_heard = Clock::now();
  rs.kv_endpoint = request.kv_endpoint();
  rs.kv_write_key = request.kv_write_key();
  proto::Envelope reply;
  reply.mutable_register_response()->set_accepted(true);
  Reply(peer, reply);
  spdlog::info("worker `{}` registered (pid {}, {} chunks of {} bytes, {} blocks of {} positions "
               "in {})",
               peer, request.pid(), request.num_chunks(), request.chunk_bytes(),
               request.num_blocks(), request.block_size(), request.kv_cache_dtype());

  const bool all = std::all_of(inst.ranks.begin(), inst.ranks.end(),
                               [](const RankState& r) { return r.registered; });
  if (!all || inst.ready()) return false;
  std::vector<int> num_chunks;
  for (const RankState& r : inst.ranks) num_chunks.push_back(r.num_chunks);
  KvCacheOptions kv_options;
  kv_options.enable_prefix_caching = config_.enable_prefix_caching;
  kv_options.enable_recycling = config_.enable_recycling;
  kv_options.recycling_granularity = config_.recycling_granularity == "layer"
                                         ? KvCacheOptions::Granularity::kLayer
                                         : KvCacheOptions::Granularity::kKvHead;
  kv_options.dtypes = config_.kv_cache_dtypes();
  InstanceCounters* counters = metrics_ != nullptr ? metrics_->Counters(inst.id) : nullptr;
  auto kv = std::make_unique<KvCacheManager>(spec_, inst.tp_size, config_.block_size, num_chunks,
                                             kv_options, counters);
  SchedulerConfig sc{config_.max_num_seqs, config_.max_num_batched_tokens};
  sc.max_prompt_logprob_rows = MaxPromptLogprobRowsPerStep(spec_.vocab_size);
  sc.admission = config_.admission_policy == "max_utilization"
                     ? SchedulerConfig::Admission::kMaxUtilization
                     : SchedulerConfig::Admission::kGuaranteedNoEvict;
  inst.scheduler = std::make_unique<Scheduler>(sc, std::move(kv), counters);
  ++inst.generation;
  inst.in_flight.reset();
  spdlog::info("instance {} ready (tp_size {}; at most {} positions per sequence)", inst.id,
               inst.tp_size, inst.scheduler->MaxPositionsPerSequence());
  LogPoolFloor(inst);
  return true;
}

void InstanceRegistry::LogPoolFloor(const Instance& inst) const {
  // A pool below the floor still serves (requests shorter than
  // max_model_len reserve less); the log says how many full-length requests
  // run at once and what cache.kv_memory_mb would run max_num_seqs of them.
  const Scheduler& scheduler = *inst.scheduler;
  int64_t floor_blocks = 0, pool_blocks = 0;
  for (int r = 0; r < inst.tp_size; ++r) {
    const int64_t floor = scheduler.FloorShares(r, config_.max_model_len);
    const int64_t total = scheduler.kv().AdmissionShares(r);
    if (floor_blocks == 0 || floor * pool_blocks > floor_blocks * total) {
      floor_blocks = floor;
      pool_blocks = total;
    }
  }
  const int concurrent = scheduler.MaxConcurrentAt(config_.max_model_len);
  // Shares are blocks with one KV cache dtype (KvCacheManager class comment).
  const int64_t per_chunk = scheduler.kv().shares_per_chunk();
  const std::string unit =
      per_chunk == 1 ? "blocks" : "shares (1/" + std::to_string(per_chunk) + " chunk)";
  if (concurrent >= config_.max_num_seqs) {
    spdlog::info("instance {}: KV pool floor {} {} per rank ({} max_num_seqs x max_model_len "
                 "{} footprints); the pool has {}",
                 inst.id, floor_blocks, unit, config_.max_num_seqs, config_.max_model_len, pool_blocks);
  } else {
    spdlog::warn("instance {}: the KV pool ({} {} per rank) is below the floor of {} "
                 "for max_num_seqs {} requests of max_model_len {}: {} such requests run at once "
                 "(shorter ones reserve less); a pool {:.2f}x as large (cache.kv_memory_mb on "
                 "CPU workers) runs {}",
                 inst.id, pool_blocks, unit, floor_blocks, config_.max_num_seqs,
                 config_.max_model_len,
                 concurrent, double(floor_blocks) / double(std::max<int64_t>(1, pool_blocks)),
                 config_.max_num_seqs);
  }
}

void InstanceRegistry::HandleStore(Instance& inst, const std::string& peer,
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
  Status s = server_->Send(peer, reply);
  if (!s.ok()) spdlog::warn("cannot answer store get from `{}`: {}", peer, s.message());
}

void InstanceRegistry::SendHeartbeats(Clock::time_point now) {
  if (now - last_heartbeat_sent_ < std::chrono::milliseconds(config_.heartbeat_interval_ms)) {
    return;
  }
  last_heartbeat_sent_ = now;
  proto::Envelope env;
  env.mutable_heartbeat()->set_sent_unix_ms(UnixMillis());
  for (const Instance& inst : instances_) {
    for (int r = 0; r < inst.tp_size; ++r) {
      if (inst.ranks[size_t(r)].registered) Send(inst, r, env);
    }
  }
}

std::vector<std::pair<Instance*, std::string>> InstanceRegistry::FindSilent(
    Clock::time_point now) {
  const auto timeout = std::chrono::milliseconds(config_.heartbeat_timeout_ms);
  std::vector<std::pair<Instance*, std::string>> silent;
  for (Instance& inst : instances_) {
    for (int r = 0; r < inst.tp_size; ++r) {
      const RankState& rs = inst.ranks[size_t(r)];
      if (!rs.registered || now - rs.last_heard <= timeout) continue;
      const auto silent_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(now - rs.last_heard).count();
      silent.emplace_back(&inst, "worker `" + PeerName(inst.id, r) + "` has been silent for " +
                                     std::to_string(silent_ms) + " ms (heartbeat_timeout_ms " +
                                     std::to_string(config_.heartbeat_timeout_ms) + ")");
      break;
    }
  }
  return silent;
}

std::vector<std::pair<Instance*, std::string>> InstanceRegistry::FindStragglers(
    Clock::time_point now) {
  std::vector<std::pair<Instance*, std::string>> stragglers;
  for (Instance& inst : instances_) {
    if (!inst.in_flight || !inst.in_flight->first_answer_at()) continue;
    const auto waited = now - *inst.in_flight->first_answer_at();
    const int rank = inst.in_flight->FirstUnanswered();
    if (rank < 0 || waited <= inst.collective_timeout) continue;
    const auto waited_ms = std::chrono::duration_cast<std::chrono::milliseconds>(waited).count();
    stragglers.emplace_back(
        &inst, "worker `" + PeerName(inst.id, rank) + "` has not answered step " +
                   std::to_string(inst.in_flight->step_id()) + " " + std::to_string(waited_ms) +
                   " ms after its first peer did (collective_timeout_ms " +
                   std::to_string(inst.collective_timeout.count()) + ")");
  }
  return stragglers;
}

void InstanceRegistry::Reset(Instance& inst) {
  inst.scheduler.reset();
  inst.in_flight.reset();
  inst.last_step_done.reset();
  inst.store.clear();  // a restarted group must not read the old addresses
  inst.drain_deadline.reset();
  for (RankState& r : inst.ranks) r.registered = false;
}

void InstanceRegistry::StopRanks(Instance& inst, const std::string& reason) {
  SendShutdown(inst, "instance " + std::to_string(inst.id) + " is down: " + reason,
               /*fault=*/true);
}

void InstanceRegistry::StopPeer(const std::string& peer, const std::string& reason) {
  proto::Envelope env;
  env.mutable_shutdown()->set_reason(reason);
  env.mutable_shutdown()->set_fault(true);
  Reply(peer, env);
}

void InstanceRegistry::ReleaseRanks(Instance& inst, const std::string& reason) {
  SendShutdown(inst, reason, /*fault=*/false);
}

void InstanceRegistry::ShutdownAll(const std::string& reason) {
  for (Instance& inst : instances_) SendShutdown(inst, reason, /*fault=*/false);
}

void InstanceRegistry::SendShutdown(Instance& inst, const std::string& reason, bool fault) {
  proto::Envelope env;
  env.mutable_shutdown()->set_reason(reason);
  env.mutable_shutdown()->set_fault(fault);
  for (int r = 0; r < inst.tp_size; ++r) {
    if (inst.ranks[size_t(r)].registered) Send(inst, r, env);
  }
}

void InstanceRegistry::Send(const Instance& inst, int rank, const proto::Envelope& env) {
  Status s = server_->Send(PeerName(inst.id, rank), env);
  if (!s.ok()) spdlog::warn("control send to instance {} rank {}: {}", inst.id, rank, s.message());
}

void InstanceRegistry::Reply(const std::string& peer, const proto::Envelope& env) {
  Status s = server_->Send(peer, env);
  if (!s.ok()) spdlog::warn("cannot answer `{}`: {}", peer, s.message());
}

std::vector<InstanceHealth> InstanceRegistry::Snapshot() const {
  std::vector<InstanceHealth> out;
  for (const Instance& inst : instances_) {
    InstanceHealth h;
    h.instance_id = inst.id;
    h.tp_size = inst.tp_size;
    h.role = inst.role;
    const bool any_registered = std::any_of(inst.ranks.begin(), inst.ranks.end(),
                                            [](const RankState& r) { return r.registered; });
    h.state = inst.draining()   ? InstanceState::kDraining
              : inst.ready()    ? InstanceState::kReady
              : any_registered  ? InstanceState::kJoining
              : inst.standby    ? InstanceState::kVacant
                                : InstanceState::kDown;
    if (inst.ready()) {
      h.num_waiting = inst.scheduler->num_waiting();
      h.num_running = inst.scheduler->num_running();
    }
    for (int r = 0; r < inst.tp_size; ++r) {
      RankHealth rh;
      rh.tp_rank = r;
      rh.registered = inst.ranks[size_t(r)].registered;
      if (inst.ready()) {
        RankBlockUsage u = inst.scheduler->kv().Usage(r);
        rh.free_blocks = u.num_free;
        rh.total_blocks = u.num_total;
        rh.retained_blocks = u.num_retained;
        rh.used_shares = u.used_shares;
        rh.total_shares = u.total_shares;
        const std::vector<KvCacheDtype>& classes = inst.scheduler->kv().block_classes();
        for (size_t c = 0; c < classes.size(); ++c) {
          rh.arena_chunks.emplace_back(KvCacheDtypeName(classes[c]), u.lent_chunks[c]);
        }
        rh.arena_chunks.emplace_back("free", u.num_free_chunks);
      }
      h.ranks.push_back(rh);
    }
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace headway
