// Continuous batching with chunked prefill for one instance (vLLM v1's
// scheduler shape, nano-vllm's size).
//
// Each step first gives every running sequence its uncomputed tokens (one
// for a decoding sequence, the next chunk for a partial prefill) in the
// order they started running, then spends what is left of
// max_num_batched_tokens on waiting sequences, first come first served,
// while fewer than max_num_seqs run. Blocks come from the KvCacheManager
// (check, then commit). A waiting sequence that finds no blocks stays
// waiting and blocks the queue behind it (FCFS). A chunk that does not fit
// shrinks to the longest that does (never below one token); a running
// sequence that cannot compute even one token preempts the newest running
// sequences (their blocks are released and they recompute later from the
// head of the queue), so no step can deadlock: admission guarantees each
// sequence fits the pool alone.
//
// Admission (SchedulerConfig::admission). Under kGuaranteedNoEvict (the
// default; TensorRT-LLM's policy of that name) a waiting sequence starts
// only when, on every TP rank,
//
//   sum over running sequences of F(s)  +  F(new)  +  C  <=  A
//
// where F(s) = KvCacheManager::FootprintShares(rank, prompt + max_tokens)
// is the most KV memory s can hold at once (full slots: its whole context;
// recycling sliding slots: sink + the window of a one-token step + the
// retained prompt window, SlotBlocks::FootprintBlocks), C =
// KvCacheManager::ChunkReserveShares(rank, max_num_batched_tokens) keeps
// room for one prefill chunk beyond a one-token step and A =
// KvCacheManager::AdmissionShares(rank) is the pool. All three count
// shares of the rank's arena chunks (with one KV cache dtype, blocks). Shared prefix blocks
// count once per sequence, so the sum is an upper bound. So a running
// sequence is never preempted for want of blocks, except by blocks the sum
// does not see: transfers' reservations, retained windows of finished
// requests still referenced, and several prefill chunks' rounding in one
// step (then the chunk shrinks first). kMaxUtilization starts a sequence
// whenever its first chunk fits (vLLM's way) and relies on preemption by
// recompute when running sequences grow.
//
// Prefix cache: a waiting sequence starts from its longest cached prefix
// (whole blocks, at most num_tokens - 1 positions, so the step still yields
// logits): its table row begins with the shared blocks and it computes from
// there. After every step the newly full blocks are cached, so a preempted
// sequence usually finds its own prefix again when it restarts.
//
// Not thread-safe: one instance's scheduler lives on the engine thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "coordinator/scheduling/kv_cache_manager.h"
#include "coordinator/scheduling/sequence.h"

namespace headway {

struct SchedulerConfig {
  int max_num_seqs = 32;             // running sequences
  int max_num_batched_tokens = 512;  // tokens computed per step
  // Config key scheduler.admission_policy (class comment).
  enum class Admission { kGuaranteedNoEvict, kMaxUtilization };
  Admission admission = Admission::kGuaranteedNoEvict;
  // Prompt logprob rows per step, over all sequences: the workers'
  // MaxPromptLogprobRowsPerStep(vocab_size) (common/step_limits.h).
  int max_prompt_logprob_rows = 64;
};

// Prefix cache counters since the scheduler started (vLLM's
// prefix_cache_queries / prefix_cache_hits, both in tokens).
struct PrefixCacheStats {
  uint64_t num_queried_tokens = 0;  // tokens of every sequence looked up at its start
  uint64_t num_hit_tokens = 0;      // of which the cache held the KV
};

// One sequence's share of a step.
struct ScheduledSeq {
  uint64_t seq_id = 0;
  int start_pos = 0;       // position of the first token computed
  int num_tokens = 0;      // tokens computed: [start_pos, start_pos + num_tokens)
  bool sample = false;     // the chunk ends at the sequence's last token
  bool is_new = false;     // the worker has not seen the sequence (yet or since a preemption)
  std::vector<std::vector<SlotBlockDelta>> deltas;  // [tp_rank] blocks appended this step
};

struct ScheduledBatch {
  std::vector<ScheduledSeq> seqs;
  std::vector<uint64_t> released_seq_ids;  // workers drop these before computing
  int num_batched_tokens = 0;
  bool empty() const { return seqs.empty() && released_seq_ids.empty(); }
};

// What an instance holds and has queued, as routing sees it
// (coordinator/engine/router.h).
struct SchedulerLoad {
  size_t num_running = 0;
  size_t num_waiting = 0;
  // Prompt tokens not yet computed, waiting and running sequences together
  // (a waiting sequence's prefix-cache hit is not known before it starts,
  // so its whole prompt counts).
  int64_t queued_prefill_tokens = 0;
  // KV positions the running sequences have computed: the context every
  // decode step attends over.
  int64_t active_tokens = 0;
};

class Scheduler {
 public:
  // REQUIRES: kv != nullptr, config values >= 1. `counters` (optional)
  // counts preemptions and prefix-cache lookups as they happen and must
  // outlive the scheduler.
  Scheduler(SchedulerConfig config, std::unique_ptr<KvCacheManager> kv,
            InstanceCounters* counters = nullptr);

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // OK if a sequence of `num_prompt_tokens` that may generate `max_tokens`
  // fits the instance's pools on its own; otherwise InvalidArgument naming
  // the numbers (it could never run, so it must not wait forever).
  Status CheckFits(int num_prompt_tokens, int max_tokens) const;

  // Queues a sequence at the back of the waiting queue. Errors: CheckFits's
  // (for a prefill-only sequence, with max_tokens 0), and InvalidArgument
  // for a duplicate seq_id. On error nothing changes.
  Status Add(std::unique_ptr<Sequence> seq);

  // Plans the next step and allocates its blocks. A chunk samples
  // (ScheduledSeq::sample) when it ends at a generating sequence's last
  // token; a prefill-only sequence never samples. A sequence that starts
  // (or restarts after preemption) with a prefix cache hit of L positions
  // has num_computed() = L and num_cached_tokens() = min(L, prompt length)
  // from here on. The caller sends the batch and, once the step has run,
  // calls OnStepComputed with it.
  ScheduledBatch Schedule();

  // Marks the batch's tokens computed for every sequence still held and
  // caches their newly full blocks. Call before appending sampled tokens.
  void OnStepComputed(const ScheduledBatch& batch);

  // The sequence, or nullptr.
  Sequence* Find(uint64_t seq_id);
  const Sequence* Find(uint64_t seq_id) const;

  // Removes a sequence (finished, aborted or cancelled): frees its blocks and
  // tells workers to drop it in the next step. nullptr for an unknown id.
  std::unique_ptr<Sequence> Remove(uint64_t seq_id);

  bool HasWork() const { return !waiting_.empty() || !running_.empty() || !released_.empty(); }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  // Sums over the held sequences; O(sequences held).
  SchedulerLoad Load() const;
  // Sequences preempted (blocks released for recompute) since the start.
  size_t num_preemptions() const { return num_preemptions_; }
  const PrefixCacheStats& prefix_cache_stats() const { return prefix_stats_; }

  const KvCacheManager& kv() const { return *kv_; }
  // The longest request (prompt + max_tokens) admission accepts: the KV
  // cache's bound for this scheduler's chunk size.
  int64_t MaxPositionsPerSequence() const {
    return kv_->MaxPositionsPerSequence(config_.max_num_batched_tokens);
  }

  // The pool floor of rank `tp_rank`: the shares that max_num_seqs requests
  // of `max_positions` positions each reserve at once under
  // kGuaranteedNoEvict, max_num_seqs * F(max_positions) + C (class comment).
  int64_t FloorShares(int tp_rank, int64_t max_positions) const;
  // How many requests of `max_positions` positions run at once under
  // kGuaranteedNoEvict (min over ranks, at most max_num_seqs).
  int MaxConcurrentAt(int64_t max_positions) const;
  // Shares the running sequences reserve on rank `tp_rank` (their F sum).
  int64_t reserved_shares(int tp_rank) const { return reserved_.at(size_t(tp_rank)); }

  // KV transfer (disaggregation) holds blocks outside any sequence between
  // steps: the KvCacheManager verbs of the same names. Check first through
  // kv() (MatchPrefix, CanPin, CanReserve), then commit.
  PinId Pin(const PrefixMatch& match) { return kv_->Pin(match); }
  void Unpin(PinId pin) { kv_->Unpin(pin); }
  ReservationId Reserve(const PrefixMatch& have, int64_t num_positions) {
    return kv_->Reserve(have, num_positions);
  }
  void CommitReceived(ReservationId reservation, const TokenIds& token_ids,
                      int64_t num_positions) {
    kv_->CommitReceived(reservation, token_ids, num_positions);
  }
  void CancelReservation(ReservationId reservation) { kv_->CancelReservation(reservation); }

 private:
  // Schedule's phases, in this order. Budgets are tokens left of
  // max_num_batched_tokens; chunks planned go to `batch`.
  // Sliding-window blocks that left every running sequence's window go back
  // to the pool before anything is allocated; the workers learn it with the
  // sequence's next plan (pending_recycled_).
  void RecycleBlocks();
  // Running sequences first, in the order they started: decodes and
  // partial prefills. One that finds no blocks preempts the newest running
  // sequences (itself, if it is the newest: then nothing after it runs).
  // Returns true if anything was preempted. `prompt_rows`: the prompt
  // logprob rows this step may still compute (max_prompt_logprob_rows in
  // all); both budgets shrink by what is planned.
  bool ScheduleRunning(ScheduledBatch* batch, int* budget, int* prompt_rows);
  // Waiting sequences, FCFS, each from its longest cached prefix, while
  // fewer than max_num_seqs run; stops at the first that finds no blocks
  // (or no prompt logprob rows, when it needs them). A sequence that needs
  // prompt logprobs starts from position 0 whatever the cache holds.
  void ScheduleWaiting(ScheduledBatch* batch, int* budget, int* prompt_rows);
  // A waiting sequence's prefix-cache lookup found `cached` of its tokens.
  void CountPrefixLookup(const Sequence& seq, int cached);
  // Releases `seq`'s blocks and puts it back at the head of the queue.
  void Preempt(Sequence& seq);
  void ReleaseBlocks(Sequence& seq);
  ScheduledSeq Plan(Sequence& seq, int num_tokens,
                    std::vector<std::vector<SlotBlockDelta>> deltas);
  // F(seq) per rank (class comment), counted at its maximum length.
  std::vector<int64_t> Footprint(const Sequence& seq) const;
  // Whether kGuaranteedNoEvict admits a sequence of footprint `footprint`.
  bool Admits(const std::vector<int64_t>& footprint) const;
  void Reserve(uint64_t seq_id, std::vector<int64_t> footprint);
  void Unreserve(uint64_t seq_id);
  // The longest chunk in [1, n] for which `fits` holds (fits is monotone:
  // true up to some length); 0 if not even one token fits.
  template <typename Fits>
  static int LongestFittingChunk(int n, Fits fits);

  const SchedulerConfig config_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> seqs_;
  std::deque<uint64_t> waiting_;        // FCFS
  std::vector<uint64_t> running_;       // in the order they started running
  std::vector<uint64_t> released_;      // for the next step's released_seq_ids
  size_t num_preemptions_ = 0;
  // Recycled blocks not yet told to the workers, per sequence ([tp_rank]).
  std::unordered_map<uint64_t, std::vector<std::vector<SlotBlockDelta>>> pending_recycled_;
  PrefixCacheStats prefix_stats_;
  // Admission's ledger: each running sequence's footprint, and their sum.
  std::unordered_map<uint64_t, std::vector<int64_t>> footprints_;  // [tp_rank]
  std::vector<int64_t> reserved_;                                   // [tp_rank]
  InstanceCounters* counters_;  // never null (a no-op default)
};

}  // namespace headway
