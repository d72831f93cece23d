// Disaggregated prefill/decode: a request's prefill job on a prefill
// instance, the KV transfer of its blocks to a decode instance, and the
// request's handoff to that instance (see the PdJob comment in
// engine_impl.h).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>

#include "coordinator/engine_impl.h"
#include "coordinator/transfer_planner.h"

namespace headway {

// ======================================================================
// disaggregation

bool Engine::Impl::Disaggregated() const {
  return std::any_of(instances.begin(), instances.end(),
                     [](const InstanceState& i) { return i.role == PoolRole::kPrefill; });
}

Engine::Impl::InstanceState* Engine::Impl::LeastLoaded(PoolRole role) {
  InstanceState* best = nullptr;
  size_t best_load = 0;
  for (InstanceState& inst : instances) {
    if (!inst.ready() || inst.role != role) continue;
    size_t load = inst.scheduler->num_waiting() + inst.scheduler->num_running();
    if (best == nullptr || load < best_load) {
      best = &inst;
      best_load = load;
    }
  }
  return best;
}

namespace {

// How much longer than a plan's timeout_ms the coordinator waits for its
// results: the writers bound their own puts by timeout_ms, so a result
// later than this means a writer that is stuck or gone.
constexpr std::chrono::milliseconds kTransferDeadlineSlack(2000);
// How long the receiving blocks of a failed transfer stay out of use once
// its writer's instance is gone: bytes the writer sent before it died may
// still be in the receiver's socket buffers.
constexpr std::chrono::milliseconds kDeadWriterGrace(1000);
// Transfer attempts before the decode instance prefills the request itself.
constexpr int kMaxTransferAttempts = 2;

}  // namespace

bool Engine::Impl::Alive(int id, uint64_t generation) const {
  return id >= 0 && instances[size_t(id)].ready() && instances[size_t(id)].generation == generation;
}

void Engine::Impl::OnPrefillDone(InstanceState& prefill, uint64_t job_id) {
  // The job's blocks stay cached (prefix caching) once its sequence ends;
  // a sequence of our own pins them for the transfer.
  prefill.scheduler->Remove(job_id);
  auto it = jobs.find(job_id);
  if (it == jobs.end()) return;
  PdJob& job = it->second;
  metrics->OnPdPrefill(Seconds(Clock::now() - job.arrival));
  const TokenIds prompt{job.request.prompt_ids, {}};
  const int64_t full = job.full_positions;
  KvCacheManager& pkv = prefill.scheduler->mutable_kv();
  PrefixMatch pinned = pkv.MatchPrefix(prompt, full);
  // The decode instance that already holds the longest prefix, then the
  // least loaded.
  InstanceState* decode = nullptr;
  int64_t best_hit = -1;
  size_t best_load = 0;
  for (InstanceState& inst : instances) {
    if (!inst.ready() || inst.role != PoolRole::kDecode) continue;
    const int64_t hit = inst.scheduler->kv().MatchPrefix(prompt, full).num_positions;
    const size_t load = inst.scheduler->num_waiting() + inst.scheduler->num_running();
    if (decode == nullptr || hit > best_hit || (hit == best_hit && load < best_load)) {
      decode = &inst;
      best_hit = hit;
      best_load = load;
    }
  }
  if (decode == nullptr) {
    const uint64_t request_id = job.request_id;
    jobs.erase(it);
    FinishRequest(prefill, request_id, ApiError::Unavailable("no decode instance is ready"));
    return;
  }
  job.decode = decode->id;
  job.decode_generation = decode->generation;
  KvCacheManager& dkv = decode->scheduler->mutable_kv();
  PrefixMatch have = dkv.MatchPrefix(prompt, full);
  // The decode side computes from `full` on: sliding slots receive only
  // their sink and the window of position `full`.
  if (pinned.num_positions < full || !pkv.CanStart(pinned, full) ||
      !dkv.CanStart(have, full, full)) {
    // Not cached (prefix caching off) or no room: the decode side computes it.
    job.error = "the prefill blocks are not cached or the decode instance has no room";
    JoinDecode(job, false);
    jobs.erase(job_id);
    return;
  }
  (void)pkv.Start(job.request_id | kPinBit, pinned, full);
  (void)dkv.Start(job.request_id | kRecvBit, have, full, full);
  std::vector<RankRows> src, dst;
  for (int r = 0; r < prefill.tp_size; ++r) src.push_back(pkv.Rows(job.request_id | kPinBit, r));
  for (int r = 0; r < decode->tp_size; ++r) dst.push_back(dkv.Rows(job.request_id | kRecvBit, r));
  Result<std::vector<RankBlockCopies>> copies =
      PlanBlockCopies(spec, prefill.tp_size, src, decode->tp_size, dst, have.entries.size());
  job.transferring = true;
  job.started = Clock::now();
  if (!copies.ok()) {  // a bug, not a runtime condition: fall back, loudly
    spdlog::error("request {}: {}", job.request_id, copies.status().ToString());
    job.error = copies.status().message();
    job.attempt = kMaxTransferAttempts;
    EndTransfer(job_id, false);
    return;
  }
  for (const RankBlockCopies& c : *copies) {
    proto::TransferTarget* t = job.plans[c.src_rank].add_targets();
    *t->mutable_endpoint() = decode->ranks[size_t(c.dst_rank)].kv_endpoint;
    t->mutable_src_blocks()->Add(c.src_blocks.begin(), c.src_blocks.end());
    t->mutable_dst_blocks()->Add(c.dst_blocks.begin(), c.dst_blocks.end());
    job.blocks += c.src_blocks.size();
  }
  if (job.plans.empty()) {  // the decode instance had every block
    EndTransfer(job_id, true);
    return;
  }
  SendTransfer(job, job_id);
}

void Engine::Impl::SendTransfer(PdJob& job, uint64_t job_id) {
  ++job.attempt;
  job.error.clear();
  job.bytes = 0;
  job.transfer_id = next_transfer_id++;
  job.deadline = Clock::now() + std::chrono::milliseconds(config.kv_transfer_timeout_ms) +
                 kTransferDeadlineSlack;
  job.pending_results = int(job.plans.size());
  transfers[job.transfer_id] = job_id;
  InstanceState& prefill = instances[size_t(job.prefill)];
  for (auto& [rank, plan] : job.plans) {
    plan.set_transfer_id(job.transfer_id);
    plan.set_timeout_ms(uint32_t(config.kv_transfer_timeout_ms));
    proto::Envelope env;
    *env.mutable_transfer_plan() = plan;
    Send(prefill, rank, env);
  }
}

void Engine::Impl::HandleTransferResult(const proto::TransferResult& result) {
  auto d = draining.find(result.transfer_id());
  if (d != draining.end()) {
    // A writer of a failed transfer is done with its blocks.
    if (--d->second.pending_results <= 0) d->second.release_at = Clock::now();
    return;
  }
  auto t = transfers.find(result.transfer_id());
  if (t == transfers.end()) return;  // an attempt that ended already
  auto it = jobs.find(t->second);
  if (it == jobs.end()) return;
  PdJob& job = it->second;
  if (!result.error().empty() && job.error.empty()) job.error = result.error();
  job.bytes += result.bytes();
  if (--job.pending_results == 0) EndTransfer(t->second, job.error.empty());
}

void Engine::Impl::EndTransfer(uint64_t job_id, bool ok) {
  auto it = jobs.find(job_id);
  if (it == jobs.end()) return;
  PdJob& job = it->second;
  transfers.erase(job.transfer_id);
  const bool prefill_alive = Alive(job.prefill, job.prefill_generation);
  const bool decode_alive = Alive(job.decode, job.decode_generation);
  if (!ok && !job.cancelled && prefill_alive && decode_alive && job.attempt < kMaxTransferAttempts) {
    // Both sides still hold the blocks: the retry writes the same blocks,
    // so a late put of the failed attempt carries the same bytes.
    spdlog::warn("KV transfer {} for request {} failed ({}); retrying", job.transfer_id,
                 job.request_id, job.error);
    SendTransfer(job, job_id);  // late results of the failed attempt are ignored
    return;
  }
  const TokenIds prompt{job.request.prompt_ids, {}};
  if (decode_alive) {
    KvCacheManager& dkv = instances[size_t(job.decode)].scheduler->mutable_kv();
    const uint64_t recv_id = job.request_id | kRecvBit;
    if (ok) {
      dkv.CacheComputedBlocks(recv_id, prompt, job.full_positions);
      dkv.Release(recv_id);
    } else if (job.pending_results > 0 && dkv.Contains(recv_id)) {
      const auto grace = prefill_alive
                             ? std::chrono::milliseconds(config.kv_transfer_timeout_ms)
                             : kDeadWriterGrace;
      draining[job.transfer_id] = Draining{job.decode, job.decode_generation, recv_id,
                                           job.pending_results, Clock::now() + grace};
    } else {
      dkv.Release(recv_id);
    }
  }
  if (prefill_alive) {
    instances[size_t(job.prefill)].scheduler->mutable_kv().Release(job.request_id | kPinBit);
  }
  if (ok) {
    metrics->OnKvTransfer(job.bytes, job.blocks, Seconds(Clock::now() - job.started));
  } else {
    spdlog::warn("KV transfer {} for request {} failed ({}); the decode instance prefills it",
                 job.transfer_id, job.request_id, job.error);
  }
  if (!job.cancelled) JoinDecode(job, ok);
  jobs.erase(it);
}

void Engine::Impl::JoinDecode(PdJob& job, bool transferred) {
  if (!transferred) metrics->OnKvTransferFallback();
  InstanceState* decode = job.decode >= 0 && instances[size_t(job.decode)].ready()
                              ? &instances[size_t(job.decode)]
                              : LeastLoaded(PoolRole::kDecode);
  auto rs = requests.find(job.request_id);
  if (rs == requests.end()) return;
  if (decode == nullptr) {
    FinishRequest(instances[size_t(rs->second.instance)], job.request_id,
                  ApiError::Unavailable("no decode instance is ready"));
    return;
  }
  // TTFT counts from the client's arrival, prefill and transfer included.
  Status added = AddSequence(*decode, job.request_id, job.request, job.arrival);
  if (!added.ok()) {
    FinishRequest(*decode, job.request_id, ApiError::BadRequest(added.message()));
    return;
  }
  rs->second.instance = decode->id;
  rs->second.joined_decode = Clock::now();
}

void Engine::Impl::DropJob(uint64_t request_id) {
  auto it = jobs.find(request_id | kJobBit);
  if (it == jobs.end()) return;
  if (it->second.transferring) {
    it->second.cancelled = true;  // the pins go when the transfer ends
    return;
  }
  InstanceState& prefill = instances[size_t(it->second.prefill)];
  if (prefill.ready()) prefill.scheduler->Remove(request_id | kJobBit);
  jobs.erase(it);
}

void Engine::Impl::CheckTransferDeadlines(Clock::time_point now) {
  std::vector<uint64_t> late;
  for (const auto& [job_id, job] : jobs) {
    const bool side_down = !Alive(job.prefill, job.prefill_generation) ||
                           (job.decode >= 0 && !Alive(job.decode, job.decode_generation));
    if (job.transferring && (now >= job.deadline || side_down)) late.push_back(job_id);
  }
  for (uint64_t job_id : late) {
    PdJob& job = jobs.at(job_id);
    if (job.error.empty()) {
      job.error = now >= job.deadline ? "timed out" : "an instance of the transfer went down";
    }
    EndTransfer(job_id, false);
  }
  for (auto it = draining.begin(); it != draining.end();) {
    const Draining& d = it->second;
    const bool decode_alive = d.decode >= 0 && Alive(d.decode, d.decode_generation);
    if (decode_alive && now < d.release_at) {
      ++it;
      continue;
    }
    if (decode_alive) instances[size_t(d.decode)].scheduler->mutable_kv().Release(d.recv_seq_id);
    it = draining.erase(it);
  }
}

}  // namespace headway
