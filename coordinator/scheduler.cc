#include "coordinator/scheduler.h"

#include <algorithm>
#include <string>

namespace headway {

Scheduler::Scheduler(SchedulerConfig config, std::unique_ptr<KvCacheManager> kv)
    : config_(config), kv_(std::move(kv)) {
  HW_CHECK(kv_ != nullptr);
  HW_CHECK(config_.max_num_seqs >= 1 && config_.max_num_batched_tokens >= 1);
}

Status Scheduler::CheckFits(int num_prompt_tokens, int max_tokens) const {
  int64_t needed = int64_t(num_prompt_tokens) + max_tokens;
  int64_t most = kv_->MaxPositionsPerSequence();
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
  HW_RETURN_IF_ERROR(CheckFits(seq->num_prompt_tokens(), seq->stop().max_tokens));
  uint64_t id = seq->seq_id();
  if (seqs_.count(id)) {
    return Status::InvalidArgument("duplicate sequence id " + std::to_string(id));
  }
  seq->set_status(SequenceStatus::kWaiting);
  seqs_.emplace(id, std::move(seq));
  waiting_.push_back(id);
  return Status::Ok();
}

ScheduledSeq Scheduler::Plan(Sequence& seq, int num_tokens) {
  ScheduledSeq s;
  s.seq_id = seq.seq_id();
  s.start_pos = seq.num_computed();
  s.num_tokens = num_tokens;
  s.sample = seq.num_computed() + num_tokens == seq.num_tokens();
  s.is_new = !seq.on_worker();
  s.deltas = kv_->Append(seq.seq_id(), int64_t(seq.num_computed()) + num_tokens);
  seq.set_on_worker(true);
  return s;
}

ScheduledBatch Scheduler::Schedule() {
  ScheduledBatch batch;
  int budget = config_.max_num_batched_tokens;
  bool preempted = false;

  // Running sequences first: decodes and partial prefills.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& seq = *seqs_.at(running_[i]);
    int n = std::min(seq.num_uncomputed(), budget);
    if (n <= 0) {
      ++i;
      continue;
    }
    int64_t positions = int64_t(seq.num_computed()) + n;
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
    batch.seqs.push_back(Plan(seq, n));
    budget -= n;
    ++i;
  }

  // Then waiting sequences, FCFS, unless this step had to preempt (the pool
  // is short; a preempted sequence must not restart in the same step).
  while (!preempted && budget > 0 && !waiting_.empty() &&
         running_.size() < size_t(config_.max_num_seqs)) {
    Sequence& seq = *seqs_.at(waiting_.front());
    int n = std::min(seq.num_uncomputed(), budget);
    if (!kv_->CanAppend(seq.seq_id(), int64_t(seq.num_computed()) + n)) break;
    waiting_.pop_front();
    running_.push_back(seq.seq_id());
    seq.set_status(SequenceStatus::kRunning);
    batch.seqs.push_back(Plan(seq, n));
    budget -= n;
  }

  batch.num_batched_tokens = config_.max_num_batched_tokens - budget;
  batch.released_seq_ids = std::move(released_);
  released_.clear();
  return batch;
}

void Scheduler::OnStepComputed(const ScheduledBatch& batch) {
  for (const ScheduledSeq& s : batch.seqs) {
    Sequence* seq = Find(s.seq_id);
    // Gone (finished or cancelled meanwhile), or preempted and restarted.
    if (seq == nullptr || seq->num_computed() != s.start_pos) continue;
    seq->AdvanceComputed(s.num_tokens);
  }
}

Sequence* Scheduler::Find(uint64_t seq_id) {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

void Scheduler::ReleaseBlocks(Sequence& seq) {
  kv_->Release(seq.seq_id());
  if (seq.on_worker()) released_.push_back(seq.seq_id());
}

void Scheduler::Preempt(Sequence& seq) {
  ReleaseBlocks(seq);
  seq.ResetComputed();
  seq.set_status(SequenceStatus::kWaiting);
  waiting_.push_front(seq.seq_id());
  ++num_preemptions_;
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

std::vector<std::unique_ptr<Sequence>> Scheduler::RemoveAll() {
  std::vector<uint64_t> ids;
  for (const auto& [id, seq] : seqs_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  std::vector<std::unique_ptr<Sequence>> out;
  for (uint64_t id : ids) out.push_back(Remove(id));
  return out;
}

}  // namespace headway
