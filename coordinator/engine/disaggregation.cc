#include "coordinator/engine/disaggregation.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "comm/kv_write_auth.h"
#include "coordinator/engine/router.h"
#include "coordinator/engine/transfer_planner.h"

namespace headway {
namespace {

// How much longer than a plan's timeout_ms the coordinator waits for its
// results: the senders bound their own sends by timeout_ms, so a result
// later than this means a sender that is stuck or gone.
constexpr std::chrono::milliseconds kTransferDeadlineSlack(2000);
// How long the reserved blocks of a failed transfer stay out of use once
// its sender's instance is gone: bytes the sender sent before it died may
// still be in the receiver's socket buffers.
constexpr std::chrono::milliseconds kDeadSenderGrace(1000);
// Transfer attempts before the decode instance prefills the request itself.
constexpr int kMaxTransferAttempts = 2;

}  // namespace

DisaggregationCoordinator::DisaggregationCoordinator(const Config& config, const ModelSpec& spec,
                                                     InstanceRegistry* registry,
                                                     Router* router, ServingMetrics* metrics)
    : config_(config), spec_(spec), registry_(registry), router_(router), metrics_(metrics) {
  const std::vector<KvCacheDtype> classes = KvBlockClasses(config.kv_cache_dtypes(), spec.slot_specs);
  if (classes.size() == 1) {
    granules_per_block_ = {1};
    return;
  }
  const KvArenaLayout arena =
      MakeKvArenaLayout(config.block_size, spec.head_dim, config.kv_cache_dtypes(), spec.slot_specs);
  for (KvCacheDtype d : classes) granules_per_block_.push_back(arena.GranulesPerBlock(d));
}

int64_t DisaggregationCoordinator::PrefillPositions(size_t prompt_length) const {
  return (int64_t(prompt_length) - 1) / config_.block_size * config_.block_size;
}

DisaggregationCoordinator::Placement DisaggregationCoordinator::Place(const TokenIds& prompt,
                                                                      Instance& decode,
                                                                      int64_t decode_hit) {
  Placement local;
  const int64_t full = PrefillPositions(prompt.size());
  const KvCacheManager& dkv = decode.scheduler->kv();
  const PrefixMatch have = dkv.MatchPrefix(prompt, full);
  if (full <= have.num_positions ||
      int64_t(prompt.size()) - decode_hit <= config_.routing_max_local_prefill_tokens) {
    local.reason = LocalPrefillReason::kShortUncached;
    return local;
  }
  if (!config_.enable_prefix_caching) {
    local.reason = LocalPrefillReason::kPrefixCachingOff;
    return local;
  }
  const Route prefill = router_->Pick(*registry_, PoolRole::kPrefill, prompt, full);
  if (prefill.instance == nullptr) {
    local.reason = LocalPrefillReason::kNoPrefillInstance;
    return local;
  }
  if (config_.routing_max_prefill_queue_tokens > 0 &&
      prefill.instance->scheduler->Load().queued_prefill_tokens >
          config_.routing_max_prefill_queue_tokens) {
    local.reason = LocalPrefillReason::kPrefillQueueFull;
    return local;
  }
  if (!dkv.CanReserve(have, full)) {
    local.reason = LocalPrefillReason::kDecodeNoRoom;
    return local;
  }
  return Placement{prefill.instance, prefill.hit_positions, LocalPrefillReason::kShortUncached};
}

Status DisaggregationCoordinator::Begin(uint64_t request_id, const EngineRequest& request,
                                        Instance& prefill, Instance& decode,
                                        Clock::time_point arrival) {
  const int64_t full = PrefillPositions(request.prompt_ids.size());
  HW_CHECK(full > 0 && prefill.ready() && decode.ready());
  StopConditions stop;
  stop.max_model_len = config_.max_model_len;
  std::vector<int32_t> prompt(request.prompt_ids.begin(), request.prompt_ids.begin() + full);
  HW_RETURN_IF_ERROR(prefill.scheduler->Add(std::make_unique<Sequence>(
      request_id, std::move(prompt), SamplingOptions{}, std::move(stop), arrival,
      SequenceKind::kPrefillOnly)));
  Job job;
  job.request = request;
  job.prefill = prefill.id;
  job.prefill_generation = prefill.generation;
  job.full_positions = full;
  job.arrival = arrival;
  HW_CHECK(TryReserveOn(job, decode));  // Place checked it this turn
  jobs_.emplace(request_id, std::move(job));
  metrics_->OnRemotePrefill();
  return Status::Ok();
}

bool DisaggregationCoordinator::TryReserveOn(Job& job, Instance& decode) {
  const TokenIds prompt{job.request.prompt_ids, {}};
  const PrefixMatch have = decode.scheduler->kv().MatchPrefix(prompt, job.full_positions);
  if (!decode.scheduler->kv().CanReserve(have, job.full_positions)) return false;
  job.decode = decode.id;
  job.decode_generation = decode.generation;
  job.have_blocks = have.entries.size();
  job.reservation = decode.scheduler->Reserve(have, job.full_positions);
  job.reserved = true;
  return true;
}

void DisaggregationCoordinator::CancelReservation(Job& job) {
  if (!job.reserved) return;
  job.reserved = false;
  if (registry_->Alive(job.decode, job.decode_generation)) {
    registry_->at(job.decode).scheduler->CancelReservation(job.reservation);
  }
}

std::vector<Handoff> DisaggregationCoordinator::OnPrefillDone(Instance& prefill,
                                                              uint64_t request_id) {
  std::vector<Handoff> out;
  // The job's blocks stay cached (prefix caching) once its sequence ends;
  // a pin holds them for the transfer.
  prefill.scheduler->Remove(request_id);
  auto it = jobs_.find(request_id);
  if (it == jobs_.end()) return out;
  Job& job = it->second;
  metrics_->OnPdPrefill(Seconds(Clock::now() - job.arrival));
  if (!registry_->Alive(job.decode, job.decode_generation)) {
    // Its reservation went with it: another decode instance may take the
    // blocks, if it has room for them now.
    job.reserved = false;
    const TokenIds prompt{job.request.prompt_ids, {}};
    Instance* decode =
        router_->Pick(*registry_, PoolRole::kDecode, prompt, int64_t(prompt.size())).instance;
    if (decode == nullptr || !TryReserveOn(job, *decode)) {
      job.decode = decode != nullptr ? decode->id : -1;
      job.fallback = TransferFallbackReason::kDecodeInstanceDown;
      spdlog::warn("request {}: its decode instance went down during its prefill and no other "
                   "can reserve its blocks; a decode instance prefills it",
                   request_id);
      HandOff(job, request_id, false, &out);
      jobs_.erase(it);
      return out;
    }
  }
  StartTransfer(request_id, job, prefill, registry_->at(job.decode), &out);
  return out;
}

void DisaggregationCoordinator::StartTransfer(uint64_t request_id, Job& job, Instance& prefill,
                                              Instance& decode, std::vector<Handoff>* out) {
  const TokenIds prompt{job.request.prompt_ids, {}};
  const int64_t full = job.full_positions;
  const KvCacheManager& pkv = prefill.scheduler->kv();
  const KvCacheManager& dkv = decode.scheduler->kv();
  const PrefixMatch pinned = pkv.MatchPrefix(prompt, full);
  if (pinned.num_positions < full || !pkv.CanPin(pinned)) {
    // The job's sequence ended this turn, so its blocks are cached: this
    // needs a prefix cache that dropped them at once.
    job.error = "the prefill instance no longer holds the prompt's blocks";
    job.fallback = TransferFallbackReason::kPrefillBlocksEvicted;
    spdlog::warn("request {}: {}; its decode instance prefills it", request_id, job.error);
    HandOff(job, request_id, false, out);
    jobs_.erase(request_id);
    return;
  }
  job.pin = prefill.scheduler->Pin(pinned);
  std::vector<RankRows> src, dst;
  for (int r = 0; r < prefill.tp_size; ++r) src.push_back(pkv.Rows(job.pin, r));
  for (int r = 0; r < decode.tp_size; ++r) dst.push_back(dkv.Rows(job.reservation, r));
  Result<std::vector<RankBlockCopies>> copies =
      PlanBlockCopies(spec_, prefill.tp_size, src, decode.tp_size, dst, job.have_blocks,
                      config_.kv_cache_dtypes());
  job.transferring = true;
  job.started = Clock::now();
  if (!copies.ok()) {  // a bug, not a runtime condition: fall back, loudly
    spdlog::error("request {}: {}", request_id, copies.status().ToString());
    job.error = copies.status().message();
    job.fallback = TransferFallbackReason::kPlanError;
    job.attempt = kMaxTransferAttempts;
    EndTransfer(request_id, false, Clock::now(), out);
    return;
  }
  for (const RankBlockCopies& c : *copies) {
    proto::TransferTarget* t = job.plans[c.src_rank].add_targets();
    job.target_ranks[c.src_rank].push_back(c.dst_rank);
    *t->mutable_endpoint() = decode.ranks[size_t(c.dst_rank)].kv_endpoint;
    t->mutable_src_blocks()->Add(c.src_blocks.begin(), c.src_blocks.end());
    t->mutable_dst_blocks()->Add(c.dst_blocks.begin(), c.dst_blocks.end());
    const int granules = granules_per_block_.at(size_t(c.block_class));
    if (granules > 1) t->set_granules_per_block(uint32_t(granules));
    job.blocks += c.src_blocks.size();
  }
  if (job.plans.empty()) {  // the decode instance had every block
    EndTransfer(request_id, true, Clock::now(), out);
    return;
  }
  SendTransfer(job, request_id, out);
}

void DisaggregationCoordinator::SendTransfer(Job& job, uint64_t request_id,
                                             std::vector<Handoff>* out) {
  ++job.attempt;
  job.error.clear();
  job.bytes = 0;
  job.transfer_id = next_transfer_id_++;
  job.deadline = Clock::now() + std::chrono::milliseconds(config_.kv_transfer_timeout_ms) +
                 kTransferDeadlineSlack;
  transfers_[job.transfer_id] = request_id;
  // Receivers accept the transfer's writes as long as the coordinator waits
  // for it: after that its blocks may be handed to another sequence.
  const auto lifetime_ms =
      uint32_t(config_.kv_transfer_timeout_ms + kTransferDeadlineSlack.count());
  const Instance& decode = registry_->at(job.decode);
  for (auto& [rank, plan] : job.plans) {
    plan.set_transfer_id(job.transfer_id);
    plan.set_write_lifetime_ms(lifetime_ms);
    for (int t = 0; t < plan.targets_size(); ++t) {
      proto::TransferTarget* target = plan.mutable_targets(t);
      const RankState& receiver = decode.ranks[size_t(job.target_ranks[rank][size_t(t)])];
      // Grants cover the receiver's granules (one per block with one dtype).
      const uint32_t n = std::max<uint32_t>(1, target->granules_per_block());
      std::vector<uint32_t> dst;
      dst.reserve(size_t(target->dst_blocks_size()) * n);
      for (uint32_t b : target->dst_blocks()) {
        for (uint32_t j = 0; j < n; ++j) dst.push_back(b * n + j);
      }
      Result<KvWriteGrant> grant =
          GrantKvWrites(receiver.kv_write_key, job.transfer_id, lifetime_ms, dst);
      if (!grant.ok()) {
        spdlog::error("request {}: KV transfer {}: {}", request_id, job.transfer_id,
                      grant.status().ToString());
        job.error = grant.status().message();
        job.fallback = TransferFallbackReason::kPlanError;
        job.attempt = kMaxTransferAttempts;
        job.pending_results = 0;
        EndTransfer(request_id, false, Clock::now(), out);
        return;
      }
      target->clear_write_ranges();
      for (const KvWriteRange& range : grant->ranges) {
        proto::KvWriteRange* r = target->add_write_ranges();
        r->set_first_block(range.first_block);
        r->set_num_blocks(range.num_blocks);
        r->set_tag(range.tag.data(), range.tag.size());
      }
    }
  }
  job.pending_results = int(job.plans.size());
  const Instance& prefill = registry_->at(job.prefill);
  for (auto& [rank, plan] : job.plans) {
    plan.set_timeout_ms(uint32_t(config_.kv_transfer_timeout_ms));
    proto::Envelope env;
    *env.mutable_transfer_plan() = plan;
    registry_->Send(prefill, rank, env);
  }
}

std::vector<Handoff> DisaggregationCoordinator::OnTransferResult(
    const proto::TransferResult& result) {
  std::vector<Handoff> out;
  if (result.error().empty()) metrics_->OnKvTransferSent(result.seconds());
  auto d = draining_.find(result.transfer_id());
  if (d != draining_.end()) {
    // A sender of a failed transfer is done with its blocks.
    if (--d->second.pending_results <= 0) d->second.release_at = Clock::now();
    return out;
  }
  auto t = transfers_.find(result.transfer_id());
  if (t == transfers_.end()) return out;  // an attempt that ended already
  auto it = jobs_.find(t->second);
  if (it == jobs_.end()) return out;
  Job& job = it->second;
  if (!result.error().empty() && job.error.empty()) job.error = result.error();
  job.bytes += result.bytes();
  if (--job.pending_results == 0) EndTransfer(t->second, job.error.empty(), Clock::now(), &out);
  return out;
}

void DisaggregationCoordinator::EndTransfer(uint64_t request_id, bool ok, Clock::time_point now,
                                            std::vector<Handoff>* out) {
  auto it = jobs_.find(request_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  transfers_.erase(job.transfer_id);
  const bool prefill_alive = registry_->Alive(job.prefill, job.prefill_generation);
  const bool decode_alive = registry_->Alive(job.decode, job.decode_generation);
  if (!ok && !job.cancelled && prefill_alive && decode_alive && job.attempt < kMaxTransferAttempts) {
    // Both sides still hold the blocks: the retry sends the same blocks, so
    // a late block of the failed attempt carries the same bytes.
    spdlog::warn("KV transfer {} for request {} failed ({}); retrying", job.transfer_id,
                 request_id, job.error);
    SendTransfer(job, request_id, out);  // late results of the failed attempt are ignored
    return;
  }
  if (decode_alive) {
    Scheduler& decode = *registry_->at(job.decode).scheduler;
    if (ok) {
      decode.CommitReceived(job.reservation, TokenIds{job.request.prompt_ids, {}},
                            job.full_positions);
    } else if (job.pending_results > 0 && decode.kv().Contains(job.reservation)) {
      const auto grace = prefill_alive ? std::chrono::milliseconds(config_.kv_transfer_timeout_ms)
                                       : kDeadSenderGrace;
      draining_[job.transfer_id] = Draining{job.decode, job.decode_generation, job.reservation,
                                            job.pending_results, now + grace};
    } else {
      decode.CancelReservation(job.reservation);
    }
  }
  job.reserved = false;  // committed, draining or given back
  if (prefill_alive) registry_->at(job.prefill).scheduler->Unpin(job.pin);
  if (ok) {
    metrics_->OnKvTransfer(job.bytes, job.blocks, uint64_t(job.full_positions - HavePositions(job)),
                           Seconds(now - job.started));
  } else {
    spdlog::warn("KV transfer {} for request {} failed ({}, {}); the decode instance prefills it",
                 job.transfer_id, request_id, TransferFallbackReasonName(job.fallback), job.error);
  }
  if (!job.cancelled) HandOff(job, request_id, ok, out);
  jobs_.erase(it);
}

void DisaggregationCoordinator::HandOff(Job& job, uint64_t request_id, bool transferred,
                                        std::vector<Handoff>* out) {
  if (!transferred) {
    CancelReservation(job);
    metrics_->OnKvTransferFallback(job.fallback);
  }
  Handoff h;
  h.request_id = request_id;
  h.request = std::move(job.request);
  h.arrival = job.arrival;
  h.decode = job.decode;
  h.transferred = transferred;
  if (transferred) {
    h.received_from = int(HavePositions(job));
    h.received_to = int(job.full_positions);
  }
  out->push_back(std::move(h));
}

void DisaggregationCoordinator::Drop(uint64_t request_id) {
  auto it = jobs_.find(request_id);
  if (it == jobs_.end()) return;
  if (it->second.transferring) {
    it->second.cancelled = true;  // the pin goes when the transfer ends
    return;
  }
  Instance& prefill = registry_->at(it->second.prefill);
  if (prefill.ready()) prefill.scheduler->Remove(request_id);
  CancelReservation(it->second);
  jobs_.erase(it);
}

std::vector<Handoff> DisaggregationCoordinator::CheckDeadlines(Clock::time_point now) {
  std::vector<Handoff> out;
  std::vector<uint64_t> late;
  for (const auto& [request_id, job] : jobs_) {
    const bool side_down = !registry_->Alive(job.prefill, job.prefill_generation) ||
                           (job.decode >= 0 && !registry_->Alive(job.decode, job.decode_generation));
    if (job.transferring && (now >= job.deadline || side_down)) late.push_back(request_id);
  }
  for (uint64_t request_id : late) {
    Job& job = jobs_.at(request_id);
    if (!registry_->Alive(job.prefill, job.prefill_generation)) {
      job.fallback = TransferFallbackReason::kPrefillInstanceDown;
    } else if (!registry_->Alive(job.decode, job.decode_generation)) {
      job.fallback = TransferFallbackReason::kDecodeInstanceDown;
    }
    if (job.error.empty()) {
      job.error = now >= job.deadline ? "timed out" : "an instance of the transfer went down";
    }
    EndTransfer(request_id, false, now, &out);
  }
  for (auto it = draining_.begin(); it != draining_.end();) {
    const Draining& d = it->second;
    const bool decode_alive = registry_->Alive(d.decode, d.decode_generation);
    if (decode_alive && now < d.release_at) {
      ++it;
      continue;
    }
    if (decode_alive) registry_->at(d.decode).scheduler->CancelReservation(d.reservation);
    it = draining_.erase(it);
  }
  return out;
}

std::vector<Handoff> DisaggregationCoordinator::OnInstanceDown(int instance_id) {
  std::vector<Handoff> out;
  std::vector<uint64_t> orphaned;
  for (const auto& [request_id, job] : jobs_) {
    if (job.prefill == instance_id) orphaned.push_back(request_id);
  }
  for (uint64_t request_id : orphaned) {
    Job& job = jobs_.at(request_id);
    spdlog::warn("request {}: its prefill instance {} is down; a decode instance prefills it",
                 request_id, instance_id);
    job.fallback = TransferFallbackReason::kPrefillInstanceDown;
    if (job.transferring) {
      job.error = "the prefill instance went down";
      EndTransfer(request_id, false, Clock::now(), &out);  // no retry: the sender is gone
    } else {
      HandOff(job, request_id, false, &out);
      jobs_.erase(request_id);
    }
  }
  return out;
}

}  // namespace headway
