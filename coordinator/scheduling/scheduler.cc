#include "coordinator/scheduling/scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <string>


namespace headway {
namespace {

TokenIds TokensOf(const Sequence& seq) {
  return TokenIds{seq.prompt_ids(), seq.output_ids()};
}

InstanceCounters kNoCounters;

}  // namespace

Scheduler::Scheduler(SchedulerConfig config, std::unique_ptr<KvCacheManager> kv,
                     InstanceCounters* counters)
    : config_(config), kv_(std::move(kv)), counters_(counters != nullptr ? counters : &kNoCounters) {
  HW_CHECK(kv_ != nullptr);
  HW_CHECK(config_.max_num_seqs >= 1 && config_.max_num_batched_tokens >= 1);
  reserved_.assign(size_t(kv_->tp_size()), 0);
}

std::vector<int64_t> Scheduler::Footprint(const Sequence& seq) const {
  int64_t positions = seq.num_prompt_tokens();
  if (seq.kind() == SequenceKind::kGenerate) positions += seq.stop().max_tokens;
  if (seq.stop().max_model_len > 0) {
    positions = std::min<int64_t>(positions, seq.stop().max_model_len);
  }
  std::vector<int64_t> shares(size_t(kv_->tp_size()));
  for (int r = 0; r < kv_->tp_size(); ++r) {
    shares[size_t(r)] = kv_->FootprintShares(r, positions, seq.num_prompt_tokens());
  }
  return shares;
}

bool Scheduler::Admits(const std::vector<int64_t>& footprint) const {
  if (config_.admission != SchedulerConfig::Admission::kGuaranteedNoEvict) return true;
  for (int r = 0; r < kv_->tp_size(); ++r) {
    const int64_t chunk = kv_->ChunkReserveShares(r, config_.max_num_batched_tokens);
    if (reserved_[size_t(r)] + footprint[size_t(r)] + chunk > kv_->AdmissionShares(r)) {
      return false;
    }
  }
  return true;
}

void Scheduler::Reserve(uint64_t seq_id, std::vector<int64_t> footprint) {
  for (size_t r = 0; r < reserved_.size(); ++r) reserved_[r] += footprint[r];
  footprints_[seq_id] = std::move(footprint);
}

void Scheduler::Unreserve(uint64_t seq_id) {
  auto it = footprints_.find(seq_id);
  if (it == footprints_.end()) return;
  for (size_t r = 0; r < reserved_.size(); ++r) reserved_[r] -= it->second[r];
  footprints_.erase(it);
}

int64_t Scheduler::FloorShares(int tp_rank, int64_t max_positions) const {
  return int64_t(config_.max_num_seqs) * kv_->FootprintShares(tp_rank, max_positions) +
         kv_->ChunkReserveShares(tp_rank, config_.max_num_batched_tokens);
}

int Scheduler::MaxConcurrentAt(int64_t max_positions) const {
  int64_t most = config_.max_num_seqs;
  for (int r = 0; r < kv_->tp_size(); ++r) {
    const int64_t room = kv_->AdmissionShares(r) -
                         kv_->ChunkReserveShares(r, config_.max_num_batched_tokens);
    const int64_t each = std::max<int64_t>(1, kv_->FootprintShares(r, max_positions));
    most = std::min(most, std::max<int64_t>(0, room) / each);
  }
  return int(most);
}

template <typename Fits>
int Scheduler::LongestFittingChunk(int n, Fits fits) {
  if (n <= 0 || !fits(1)) return 0;
  if (fits(n)) return n;
  int lo = 1, hi = n;  // fits(lo), !fits(hi)
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

Status Scheduler::CheckFits(int num_prompt_tokens, int max_tokens) const {
  int64_t needed = int64_t(num_prompt_tokens) + max_tokens;
  int64_t most = MaxPositionsPerSequence();
  if (needed > most) {
    return Status::InvalidArgument(
        "the request needs KV cache for " + std::to_string(needed) + " positions (" +
        std::to_string(num_prompt_tokens) + " prompt + " + std::to_string(max_tokens) +
        " max_tokens) but the instance's KV pool holds at most " + std::to_string(most) +
        " positions for one sequence; shorten the request or raise cache.kv_memory_mb");
  }
  return Status::Ok();
}

Status Scheduler::Add(std::unique_ptr<Sequence> seq) {
  HW_CHECK(seq != nullptr);
  const bool generates = seq->kind() == SequenceKind::kGenerate;
  HW_RETURN_IF_ERROR(CheckFits(seq->num_prompt_tokens(), generates ? seq->stop().max_tokens : 0));
  uint64_t id = seq->seq_id();
  if (seqs_.count(id)) {
    return Status::InvalidArgument("duplicate sequence id " + std::to_string(id));
  }
  seq->set_status(SequenceStatus::kWaiting);
  seqs_.emplace(id, std::move(seq));
  waiting_.push_back(id);
  return Status::Ok();
}

ScheduledSeq Scheduler::Plan(Sequence& seq, int num_tokens,
                             std::vector<std::vector<SlotBlockDelta>> deltas) {
  ScheduledSeq s;
  s.seq_id = seq.seq_id();
  s.start_pos = seq.num_computed();
  s.num_tokens = num_tokens;
  s.sample = seq.kind() == SequenceKind::kGenerate &&
             seq.num_computed() + num_tokens == seq.num_tokens();
  s.is_new = !seq.on_worker();
  s.deltas = std::move(deltas);
  auto pending = pending_recycled_.find(seq.seq_id());
  if (pending != pending_recycled_.end()) {
    if (seq.on_worker()) {  // a new sequence's rows already say -1
      if (s.deltas.size() < pending->second.size()) s.deltas.resize(pending->second.size());
      for (size_t r = 0; r < pending->second.size(); ++r) {
        for (SlotBlockDelta& d : pending->second[r]) s.deltas[r].push_back(std::move(d));
      }
    }
    pending_recycled_.erase(pending);
  }
  seq.set_on_worker(true);
  return s;
}

ScheduledBatch Scheduler::Schedule() {
  ScheduledBatch batch;
  int budget = config_.max_num_batched_tokens;
  int prompt_rows = config_.max_prompt_logprob_rows;
  RecycleBlocks();
  // Running sequences first; then waiting ones, unless this step had to
  // preempt (the pool is short; a preempted sequence must not restart in
  // the same step).
  const bool preempted = ScheduleRunning(&batch, &budget, &prompt_rows);
  if (!preempted) ScheduleWaiting(&batch, &budget, &prompt_rows);
  batch.num_batched_tokens = config_.max_num_batched_tokens - budget;
  batch.released_seq_ids = std::move(released_);
  released_.clear();
  return batch;
}

void Scheduler::RecycleBlocks() {
  for (uint64_t id : running_) {
    std::vector<std::vector<SlotBlockDelta>> recycled =
        kv_->Recycle(id, seqs_.at(id)->num_computed());
    for (size_t r = 0; r < recycled.size(); ++r) {
      if (recycled[r].empty()) continue;
      std::vector<std::vector<SlotBlockDelta>>& pending = pending_recycled_[id];
      pending.resize(recycled.size());
      for (SlotBlockDelta& d : recycled[r]) pending[r].push_back(std::move(d));
    }
  }
}

bool Scheduler::ScheduleRunning(ScheduledBatch* batch, int* budget, int* prompt_rows) {
  bool preempted = false;
  for (size_t i = 0; i < running_.size() && *budget > 0;) {
    Sequence& seq = *seqs_.at(running_[i]);
    int n = std::min(seq.num_uncomputed(), *budget);
    // A chunk whose rows give prompt logprobs has its logits computed row
    // by row: it waits for a step with rows to spare.
    if (seq.NeedsPromptLogprobs()) n = std::min(n, *prompt_rows);
    if (n <= 0) {
      ++i;
      continue;
    }
    const int64_t computed = seq.num_computed();
    // A chunk that does not fit shrinks before anything is preempted.
    const int fitting = LongestFittingChunk(
        n, [&](int c) { return kv_->CanAppend(seq.seq_id(), computed + c); });
    n = fitting > 0 ? fitting : 1;  // not even one token: preempt for that much
    int64_t positions = computed + n;
    bool scheduled_self = true;
    while (!kv_->CanAppend(seq.seq_id(), positions)) {
      uint64_t victim = running_.back();
      running_.pop_back();
      Preempt(*seqs_.at(victim));
      preempted = true;
      if (victim == seq.seq_id()) {
        scheduled_self = false;
        break;
      }
    }
    if (!scheduled_self) break;  // it was the newest: nothing after it runs
    *prompt_rows -= seq.PromptLogprobRows(int(computed), n).count;
    batch->seqs.push_back(Plan(seq, n, kv_->Append(seq.seq_id(), positions)));
    *budget -= n;
    ++i;
  }
  return preempted;
}

void Scheduler::ScheduleWaiting(ScheduledBatch* batch, int* budget, int* prompt_rows) {
  while (*budget > 0 && !waiting_.empty() && running_.size() < size_t(config_.max_num_seqs)) {
    Sequence& seq = *seqs_.at(waiting_.front());
    // Waiting sequences hold no blocks (new, or released by preemption).
    HW_CHECK(seq.num_computed() == 0 && !kv_->Contains(seq.seq_id()));
    std::vector<int64_t> footprint = Footprint(seq);
    if (!Admits(footprint)) break;
    // A cached position has no logits: prompt logprobs compute every one.
    const bool needs_rows = seq.NeedsPromptLogprobs();
    if (needs_rows && *prompt_rows <= 0) break;
    const PrefixMatch match =
        needs_rows ? PrefixMatch{} : kv_->MatchPrefix(TokensOf(seq), seq.num_tokens() - 1);
    const int cached = int(match.num_positions);
    const int most = std::min({seq.num_tokens() - cached, *budget,
                               needs_rows ? *prompt_rows : std::numeric_limits<int>::max()});
    const int n = LongestFittingChunk(most, [&](int c) {
      return kv_->CanStart(match, int64_t(cached) + c, -1, seq.num_prompt_tokens());
    });
    if (n == 0) break;
    waiting_.pop_front();
    running_.push_back(seq.seq_id());
    Reserve(seq.seq_id(), std::move(footprint));
    seq.set_status(SequenceStatus::kRunning);
    seq.AdvanceComputed(cached);
    seq.RecordPrefixHit(std::min(cached, seq.num_prompt_tokens()));
    if (kv_->prefix_caching_enabled() && !needs_rows) CountPrefixLookup(seq, cached);
    *prompt_rows -= seq.PromptLogprobRows(cached, n).count;
    batch->seqs.push_back(Plan(seq, n,
                               kv_->Start(seq.seq_id(), match, int64_t(cached) + n, -1,
                                          seq.num_prompt_tokens())));
    *budget -= n;
  }
}

void Scheduler::CountPrefixLookup(const Sequence& seq, int cached) {
  prefix_stats_.num_queried_tokens += uint64_t(seq.num_tokens());
  prefix_stats_.num_hit_tokens += uint64_t(cached);
  counters_->OnPrefixCacheQuery(seq.num_tokens(), cached);
}

void Scheduler::OnStepComputed(const ScheduledBatch& batch) {
  for (const ScheduledSeq& s : batch.seqs) {
    Sequence* seq = Find(s.seq_id);
    // Gone (finished or cancelled meanwhile), or preempted and restarted.
    if (seq == nullptr || seq->num_computed() != s.start_pos) continue;
    seq->AdvanceComputed(s.num_tokens);
    kv_->CacheComputedBlocks(s.seq_id, TokensOf(*seq), seq->num_computed());
  }
}

Sequence* Scheduler::Find(uint64_t seq_id) {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

const Sequence* Scheduler::Find(uint64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

void Scheduler::ReleaseBlocks(Sequence& seq) {
  Unreserve(seq.seq_id());
  kv_->Release(seq.seq_id());
  pending_recycled_.erase(seq.seq_id());
  if (seq.on_worker()) released_.push_back(seq.seq_id());
}

void Scheduler::Preempt(Sequence& seq) {
  ++num_preemptions_;
  counters_->OnPreemption();
  // vLLM's habit: warn on the first preemption and every 50th after it, as a
  // recompute is costly and frequent ones mean the pool is too small, without
  // flooding the log under sustained pressure.
  if (num_preemptions_ % 50 == 1) {
    spdlog::warn("preempted sequence {} ({} computed positions, recomputed later); {} "
                 "preemptions so far; raise cache.kv_memory_mb or lower max_num_seqs if frequent",
                 seq.seq_id(), seq.num_computed(), num_preemptions_);
  }
  ReleaseBlocks(seq);
  seq.ResetComputed();
  seq.set_status(SequenceStatus::kWaiting);
  waiting_.push_front(seq.seq_id());
}

SchedulerLoad Scheduler::Load() const {
  SchedulerLoad load;
  load.num_running = running_.size();
  load.num_waiting = waiting_.size();
  for (uint64_t id : waiting_) {
    const Sequence& seq = *seqs_.at(id);
    load.queued_prefill_tokens += std::max(0, seq.num_prompt_tokens() - seq.num_computed());
  }
  for (uint64_t id : running_) {
    const Sequence& seq = *seqs_.at(id);
    load.queued_prefill_tokens += std::max(0, seq.num_prompt_tokens() - seq.num_computed());
    load.active_tokens += seq.num_computed();
  }
  return load;
}

std::unique_ptr<Sequence> Scheduler::Remove(uint64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return nullptr;
  std::unique_ptr<Sequence> seq = std::move(it->second);
  seqs_.erase(it);
  ReleaseBlocks(*seq);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq_id), waiting_.end());
  running_.erase(std::remove(running_.begin(), running_.end(), seq_id), running_.end());
  return seq;
}

}  // namespace headway
