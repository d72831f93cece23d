#include "coordinator/scheduling/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "tests/coordinator/fake_model_spec.h"

namespace headway {
namespace {

using testing::FakeLlamaSpec;

constexpr int kBlockSize = 4;
constexpr SchedulerConfig::Admission kFirstChunk = SchedulerConfig::Admission::kMaxUtilization;

// Preemption tests use kMaxUtilization: admission by first chunk is what
// lets running sequences outgrow the pool.
std::unique_ptr<Scheduler> MakeScheduler(
    int max_num_seqs, int max_batched, int num_blocks, int tp_size = 1,
    bool prefix_caching = true, BlockHasher hasher = HashBlockTokens,
    SchedulerConfig::Admission admission = SchedulerConfig::Admission::kGuaranteedNoEvict) {
  KvCacheOptions options;
  options.enable_prefix_caching = prefix_caching;
  options.block_hasher = hasher;
  auto kv = std::make_unique<KvCacheManager>(FakeLlamaSpec(1), tp_size, kBlockSize,
                                             std::vector<int>(tp_size, num_blocks), options);
  SchedulerConfig config{max_num_seqs, max_batched};
  config.admission = admission;
  return std::make_unique<Scheduler>(config, std::move(kv));
}

std::unique_ptr<Sequence> MakeSeqWithTokens(uint64_t id, std::vector<int32_t> prompt,
                                            int max_tokens) {
  StopConditions stop;
  stop.max_tokens = max_tokens;
  stop.ignore_eos = true;
  return std::make_unique<Sequence>(id, std::move(prompt), SamplingOptions{}, stop,
                                    Clock::now());
}

// A prompt no other sequence shares (no prefix cache hits between them).
std::unique_ptr<Sequence> MakeSeq(uint64_t id, int prompt_len, int max_tokens) {
  std::vector<int32_t> prompt(prompt_len);
  for (int i = 0; i < prompt_len; ++i) prompt[i] = int32_t(id * 1000 + i);
  return MakeSeqWithTokens(id, std::move(prompt), max_tokens);
}

// Plays the worker and the engine: marks the step computed, appends a token
// to each sampled sequence and removes those that reached max_tokens.
// Returns the ids that finished.
std::vector<uint64_t> RunStep(Scheduler& s, const ScheduledBatch& batch) {
  s.OnStepComputed(batch);
  std::vector<uint64_t> done;
  for (const ScheduledSeq& ss : batch.seqs) {
    if (!ss.sample) continue;
    Sequence* seq = s.Find(ss.seq_id);
    if (!seq) continue;
    seq->AppendToken(7, Clock::now());
    if (seq->num_output_tokens() >= seq->stop().max_tokens) {
      s.Remove(ss.seq_id);
      done.push_back(ss.seq_id);
    }
  }
  return done;
}

// unused + referenced + evictable = total on every rank (the manager's own
// walk), and referenced = the distinct blocks the sequences' tables hold.
void ExpectBlockInvariant(const Scheduler& s, const std::vector<uint64_t>& live_ids) {
  const KvCacheManager& kv = s.kv();
  Status consistent = kv.CheckConsistency();
  ASSERT_TRUE(consistent.ok()) << consistent.message();
  for (int r = 0; r < kv.tp_size(); ++r) {
    std::set<int32_t> held;
    for (uint64_t id : live_ids) {
      if (!kv.Contains(id)) continue;
      for (int slot = 0; slot < kv.num_slots(r); ++slot) {
        for (int32_t b : kv.TEST_Row(id, r, slot)) held.insert(b);
      }
    }
    RankBlockUsage u = kv.Usage(r);
    ASSERT_EQ(u.num_referenced, int(held.size())) << "rank " << r;
    ASSERT_EQ(u.num_total - u.num_free, u.num_referenced) << "rank " << r;
    ASSERT_GE(u.num_free, u.num_evictable);
  }
}

TEST(SchedulerTest, ChunkedPrefillThenDecode) {
  auto s = MakeScheduler(4, 32, 1000);
  ASSERT_TRUE(s->Add(MakeSeq(1, 100, 3)).ok());
  std::vector<std::pair<int, int>> chunks;
  for (int step = 0; step < 4; ++step) {
    ScheduledBatch b = s->Schedule();
    ASSERT_EQ(b.seqs.size(), 1u);
    const ScheduledSeq& ss = b.seqs[0];
    chunks.push_back({ss.start_pos, ss.num_tokens});
    EXPECT_EQ(ss.is_new, step == 0);
    EXPECT_EQ(ss.sample, step == 3);
    RunStep(*s, b);
  }
  EXPECT_EQ(chunks, (std::vector<std::pair<int, int>>{{0, 32}, {32, 32}, {64, 32}, {96, 4}}));
  // Decoding: one token at the next position.
  ScheduledBatch b = s->Schedule();
  ASSERT_EQ(b.seqs.size(), 1u);
  EXPECT_EQ(b.seqs[0].start_pos, 100);
  EXPECT_EQ(b.seqs[0].num_tokens, 1);
  EXPECT_TRUE(b.seqs[0].sample);
  RunStep(*s, b);
  b = s->Schedule();
  ASSERT_EQ(b.seqs.size(), 1u);
  EXPECT_EQ(RunStep(*s, b), std::vector<uint64_t>{1});
  // Finished: the next step only tells workers to drop it; blocks are back.
  b = s->Schedule();
  EXPECT_TRUE(b.seqs.empty());
  EXPECT_EQ(b.released_seq_ids, std::vector<uint64_t>{1});
  EXPECT_EQ(s->kv().Usage(0).num_free, 1000);
  EXPECT_FALSE(s->HasWork());
}

TEST(SchedulerTest, DecodesComeFirstAndPrefillFillsTheBudget) {
  auto s = MakeScheduler(8, 16, 1000);
  ASSERT_TRUE(s->Add(MakeSeq(1, 10, 10)).ok());
  ASSERT_TRUE(s->Add(MakeSeq(2, 10, 10)).ok());
  ScheduledBatch b = s->Schedule();
  // 1 takes 10 tokens, 2 gets the remaining 6.
  ASSERT_EQ(b.seqs.size(), 2u);
  EXPECT_EQ(b.seqs[0].num_tokens, 10);
  EXPECT_TRUE(b.seqs[0].sample);
  EXPECT_EQ(b.seqs[1].num_tokens, 6);
  EXPECT_FALSE(b.seqs[1].sample);
  EXPECT_EQ(b.num_batched_tokens, 16);
  RunStep(*s, b);
  ASSERT_TRUE(s->Add(MakeSeq(3, 40, 10)).ok());
  b = s->Schedule();
  // 1 decodes (1), 2 finishes its prompt (4), 3 starts with the rest (11).
  ASSERT_EQ(b.seqs.size(), 3u);
  EXPECT_EQ(b.seqs[0].seq_id, 1u);
  EXPECT_EQ(b.seqs[0].num_tokens, 1);
  EXPECT_EQ(b.seqs[1].seq_id, 2u);
  EXPECT_EQ(b.seqs[1].num_tokens, 4);
  EXPECT_EQ(b.seqs[2].seq_id, 3u);
  EXPECT_EQ(b.seqs[2].num_tokens, 11);
  EXPECT_EQ(b.num_batched_tokens, 16);
}

TEST(SchedulerTest, MaxNumSeqsLimitsRunning) {
  auto s = MakeScheduler(2, 100, 1000);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(s->Add(MakeSeq(id, 5, 5)).ok());
  ScheduledBatch b = s->Schedule();
  EXPECT_EQ(b.seqs.size(), 2u);
  EXPECT_EQ(s->num_running(), 2u);
  EXPECT_EQ(s->num_waiting(), 2u);
}

TEST(SchedulerTest, WaitingHeadWithoutBlocksHoldsTheQueue) {
  // 1 layer x 3 KV heads = 3 slots; 12 blocks = 4 blocks per slot = 16 positions.
  auto s = MakeScheduler(8, 100, 12);
  ASSERT_TRUE(s->Add(MakeSeq(1, 8, 4)).ok());  // takes 2 blocks per slot (6)
  ScheduledBatch b = s->Schedule();
  ASSERT_EQ(b.seqs.size(), 1u);
  ASSERT_TRUE(s->Add(MakeSeq(2, 12, 4)).ok());  // needs 3 per slot (9 > 6 free)
  ASSERT_TRUE(s->Add(MakeSeq(3, 1, 2)).ok());   // would fit, but FCFS
  RunStep(*s, b);
  b = s->Schedule();
  ASSERT_EQ(b.seqs.size(), 1u);
  EXPECT_EQ(b.seqs[0].seq_id, 1u);
  EXPECT_EQ(s->num_waiting(), 2u);
}

TEST(SchedulerTest, RejectsWhatCanNeverFit) {
  auto s = MakeScheduler(8, 100, 12);  // 16 positions per sequence at most
  Status st = s->Add(MakeSeq(1, 10, 7));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("17 positions"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("16"), std::string::npos) << st.message();
  EXPECT_TRUE(s->Add(MakeSeq(2, 10, 6)).ok());
  EXPECT_EQ(s->Add(MakeSeq(2, 1, 1)).code(), StatusCode::kInvalidArgument);  // duplicate
  EXPECT_EQ(s->kv().Usage(0).num_free, 12);
}

TEST(SchedulerTest, PreemptsInsteadOfDeadlocking) {
  // 16 positions per sequence; two sequences that each grow to 16 cannot
  // both hold their blocks.
  auto s = MakeScheduler(8, 100, 12, 1, true, HashBlockTokens, kFirstChunk);
  ASSERT_TRUE(s->Add(MakeSeq(1, 6, 10)).ok());
  ASSERT_TRUE(s->Add(MakeSeq(2, 6, 10)).ok());
  std::vector<uint64_t> finished;
  for (int step = 0; step < 200 && s->HasWork(); ++step) {
    ScheduledBatch b = s->Schedule();
    ExpectBlockInvariant(*s, {1, 2});
    for (uint64_t id : RunStep(*s, b)) finished.push_back(id);
  }
  EXPECT_EQ(finished.size(), 2u);
  EXPECT_GT(s->num_preemptions(), 0u);
  EXPECT_EQ(s->kv().Usage(0).num_free, 12);
}

TEST(SchedulerTest, PreemptedSequenceRestartsAsNew) {
  auto s = MakeScheduler(8, 100, 12, 1, true, HashBlockTokens, kFirstChunk);
  ASSERT_TRUE(s->Add(MakeSeq(1, 6, 10)).ok());
  ASSERT_TRUE(s->Add(MakeSeq(2, 6, 10)).ok());
  bool saw_release_then_new = false;
  bool released_2 = false;
  for (int step = 0; step < 200 && s->HasWork(); ++step) {
    ScheduledBatch b = s->Schedule();
    for (uint64_t id : b.released_seq_ids) {
      if (id == 2) released_2 = true;
      for (const ScheduledSeq& ss : b.seqs) EXPECT_NE(ss.seq_id, id) << "released and planned in one step";
    }
    for (const ScheduledSeq& ss : b.seqs) {
      if (ss.seq_id == 2 && released_2 && ss.is_new) {
        // From 0, or from its own blocks cached before the preemption.
        EXPECT_EQ(ss.start_pos % kBlockSize, 0);
        EXPECT_EQ(ss.start_pos, s->Find(2)->num_computed());
        saw_release_then_new = true;
      }
    }
    RunStep(*s, b);
  }
  EXPECT_TRUE(saw_release_then_new);
}

TEST(SchedulerTest, RandomWorkloadKeepsInvariants) {
  for (int tp : {1, 3}) {
    std::mt19937 rng(1234 + tp);
    auto s = MakeScheduler(6, 24, 60, tp);
    std::vector<uint64_t> ids;
    uint64_t next_id = 1;
    int finished = 0, removed = 0, admitted = 0;
    for (int step = 0; step < 2000 || (s->HasWork() && step < 100000); ++step) {
      if (step < 2000 && rng() % 5 == 0) {
        int prompt = 1 + int(rng() % 40);
        int max_tokens = 1 + int(rng() % 30);
        uint64_t id = next_id++;
        Status st = s->Add(MakeSeq(id, prompt, max_tokens));
        if (st.ok()) {
          ids.push_back(id);
          ++admitted;
        } else {
          ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
          ASSERT_GT(prompt + max_tokens, s->MaxPositionsPerSequence());
        }
      }
      ScheduledBatch b = s->Schedule();
      ASSERT_LE(b.num_batched_tokens, 24);
      ASSERT_LE(s->num_running(), 6u);
      int total = 0;
      for (const ScheduledSeq& ss : b.seqs) {
        ASSERT_GT(ss.num_tokens, 0);
        total += ss.num_tokens;
        ASSERT_EQ(int(ss.deltas.size()), tp);
        // The blocks cover what the step computes.
        ASSERT_GE(s->kv().NumCoveredPositions(ss.seq_id), ss.start_pos + ss.num_tokens);
      }
      ASSERT_EQ(total, b.num_batched_tokens);
      ExpectBlockInvariant(*s, ids);
      finished += int(RunStep(*s, b).size());
      // Now and then a request is cancelled.
      if (!ids.empty() && rng() % 17 == 0) {
        uint64_t victim = ids[rng() % ids.size()];
        if (s->Remove(victim)) ++removed;
      }
      ExpectBlockInvariant(*s, ids);
    }
    EXPECT_FALSE(s->HasWork()) << "tp " << tp;
    EXPECT_EQ(finished + removed, admitted);
    for (int r = 0; r < tp; ++r) EXPECT_EQ(s->kv().Usage(r).num_free, 60);
    EXPECT_EQ(s->kv().num_sequences(), 0u);
  }
}

// Plays the workers of an instance: mirrors every sequence's rows from the
// deltas (as worker/sequence_state.cc does) and keeps, per rank and block,
// the token each position's "KV" was computed from. A step may only read
// positions whose blocks hold exactly its own tokens: a wrong prefix hit, a
// block freed or evicted while in use, or a write into a shared block shows
// up as a mismatch.
class FakeWorkers {
 public:
  FakeWorkers(int tp_size, int num_blocks)
      : content_(tp_size, std::vector<std::vector<int64_t>>(
                              num_blocks, std::vector<int64_t>(kBlockSize, -1))),
        rows_(tp_size) {}

  void Run(Scheduler& s, const ScheduledBatch& b) {
    for (uint64_t id : b.released_seq_ids) {
      for (auto& rank_rows : rows_) rank_rows.erase(id);
    }
    for (const ScheduledSeq& ss : b.seqs) {
      const Sequence& seq = *s.Find(ss.seq_id);
      for (size_t r = 0; r < rows_.size(); ++r) {
        if (ss.is_new) {
          ASSERT_EQ(rows_[r].count(ss.seq_id), 0u) << "is_new for a known seq";
          rows_[r][ss.seq_id].resize(s.kv().num_slots(int(r)));
        }
        ASSERT_EQ(rows_[r].count(ss.seq_id), 1u) << "unknown seq " << ss.seq_id;
        auto& rows = rows_[r][ss.seq_id];
        for (const SlotBlockDelta& d : ss.deltas[r]) {
          ASSERT_EQ(size_t(d.first_logical), rows[d.slot].size()) << "delta replaces blocks";
          rows[d.slot].insert(rows[d.slot].end(), d.appended.begin(), d.appended.end());
        }
        for (size_t slot = 0; slot < rows.size(); ++slot) {
          ASSERT_EQ(rows[slot], s.kv().TEST_Row(ss.seq_id, int(r), int(slot)));
          // Reads: every position before the chunk, then writes.
          for (int p = 0; p < ss.start_pos + ss.num_tokens; ++p) {
            int64_t& kv = content_[r][rows[slot][p / kBlockSize]][p % kBlockSize];
            if (p < ss.start_pos) {
              ASSERT_EQ(kv, seq.TokenAt(p)) << "seq " << ss.seq_id << " reads wrong KV at " << p;
            } else {
              kv = seq.TokenAt(p);
            }
          }
        }
      }
    }
  }

 private:
  std::vector<std::vector<std::vector<int64_t>>> content_;  // [rank][block][offset]
  std::vector<std::map<uint64_t, std::vector<std::vector<int32_t>>>> rows_;  // [rank][seq][slot]
};

TEST(SchedulerTest, PrefixHitSkipsTheCachedPrefill) {
  auto s = MakeScheduler(8, 100, 60);
  std::vector<int32_t> shared(10);
  for (int i = 0; i < 10; ++i) shared[i] = 300 + i;
  ASSERT_TRUE(s->Add(MakeSeqWithTokens(1, shared, 2)).ok());
  ScheduledBatch b = s->Schedule();
  RunStep(*s, b);
  std::vector<int32_t> longer = shared;
  longer.insert(longer.end(), {1, 2, 3});
  ASSERT_TRUE(s->Add(MakeSeqWithTokens(2, longer, 2)).ok());
  b = s->Schedule();
  ASSERT_EQ(b.seqs.size(), 2u);
  const ScheduledSeq& hit = b.seqs[1];
  EXPECT_EQ(hit.seq_id, 2u);
  EXPECT_TRUE(hit.is_new);
  EXPECT_EQ(hit.start_pos, 8);  // blocks [0,4) and [4,8) of seq 1
  EXPECT_EQ(hit.num_tokens, 5);
  EXPECT_EQ(b.num_batched_tokens, 1 + 5);
  EXPECT_EQ(s->Find(2)->num_cached_tokens(), 8);
  EXPECT_EQ(s->Find(2)->num_computed(), 8);
  for (const SlotBlockDelta& d : hit.deltas[0]) {
    EXPECT_EQ(d.first_logical, 0);
    EXPECT_EQ(d.appended.size(), 4u);
  }
  EXPECT_EQ(s->prefix_cache_stats().num_queried_tokens, 10u + 13u);
  EXPECT_EQ(s->prefix_cache_stats().num_hit_tokens, 8u);
  RunStep(*s, b);
  ExpectBlockInvariant(*s, {1, 2});
}

// A sequence that wants prompt logprobs computes its prompt from position 0
// (a cached position has no logits), at most max_prompt_logprob_rows
// rows a step over all such sequences; others share the step's budget.
TEST(SchedulerTest, PromptLogprobsBypassTheCacheAndCapTheRowsPerStep) {
  const int kRowBudget = SchedulerConfig{}.max_prompt_logprob_rows;
  ASSERT_EQ(kRowBudget, 64);
  auto s = MakeScheduler(8, 200, 200);
  std::vector<int32_t> prompt(100);
  for (int i = 0; i < 100; ++i) prompt[i] = 300 + i;
  ASSERT_TRUE(s->Add(MakeSeqWithTokens(1, prompt, 2)).ok());
  RunStep(*s, s->Schedule());  // prompt cached: 96 positions in whole blocks

  SamplingOptions wants;
  wants.prompt_logprobs = 1;
  StopConditions stop;
  stop.max_tokens = 2;
  ASSERT_TRUE(s->Add(std::make_unique<Sequence>(2, prompt, wants, stop, Clock::now())).ok());
  ASSERT_TRUE(s->Add(std::make_unique<Sequence>(3, prompt, wants, stop, Clock::now())).ok());
  ScheduledBatch b = s->Schedule();
  // seq 1 decodes; seq 2 takes every prompt row of the step; seq 3 waits.
  ASSERT_EQ(b.seqs.size(), 2u);
  EXPECT_EQ(b.seqs[1].seq_id, 2u);
  EXPECT_EQ(b.seqs[1].start_pos, 0);
  EXPECT_EQ(b.seqs[1].num_tokens, kRowBudget);
  EXPECT_EQ(s->Find(2)->num_cached_tokens(), 0);
  EXPECT_EQ(s->Find(3)->status(), SequenceStatus::kWaiting);
  s->Find(2)->AdvancePromptLogprobs(kRowBudget + 1);  // the engine's part
  RunStep(*s, b);
  b = s->Schedule();
  // seq 1 is done; seq 2's last 36 tokens (35 rows: the last token scores
  // nothing); seq 3 starts with the rows left.
  ASSERT_EQ(b.seqs.size(), 2u);
  EXPECT_EQ(b.seqs[0].seq_id, 2u);
  EXPECT_EQ(b.seqs[0].num_tokens, 100 - kRowBudget);
  EXPECT_EQ(b.seqs[1].seq_id, 3u);
  EXPECT_EQ(b.seqs[1].start_pos, 0);
  EXPECT_EQ(b.seqs[1].num_tokens, kRowBudget - 35);
  RunStep(*s, b);
  ExpectBlockInvariant(*s, {2, 3});
}

TEST(SchedulerTest, PreemptedSequenceFindsItsOwnPrefixAgain) {
  // 3 slots, 24 blocks = 8 logical blocks = 32 positions in all.
  auto s = MakeScheduler(8, 100, 24, 1, true, HashBlockTokens, kFirstChunk);
  FakeWorkers workers(1, 24);
  ASSERT_TRUE(s->Add(MakeSeq(1, 12, 12)).ok());  // grows to 24 positions: 6 blocks
  ASSERT_TRUE(s->Add(MakeSeq(2, 9, 7)).ok());    // grows to 16: 4 blocks
  bool restarted_with_hit = false;
  size_t preemptions_seen = 0;
  for (int step = 0; step < 200 && s->HasWork(); ++step) {
    ScheduledBatch b = s->Schedule();
    if (s->num_preemptions() > preemptions_seen) preemptions_seen = s->num_preemptions();
    for (const ScheduledSeq& ss : b.seqs) {
      if (ss.is_new && ss.seq_id == 2 && preemptions_seen > 0 && ss.start_pos > 0) {
        restarted_with_hit = true;
      }
    }
    workers.Run(*s, b);
    ExpectBlockInvariant(*s, {1, 2});
    RunStep(*s, b);
  }
  EXPECT_FALSE(s->HasWork());
  EXPECT_GT(s->num_preemptions(), 0u);
  EXPECT_TRUE(restarted_with_hit);
}

// Three values: almost every lookup meets a collision.
BlockHash WeakHash(BlockHash, std::span<const int32_t> tokens) { return uint64_t(tokens[0]) % 3; }

// Requests with shared prefixes, random lengths and outputs, aborts,
// preemptions and evictions: the block invariant holds after every step and
// every abort, and no step ever reads KV computed from other tokens, even
// when hashes collide all the time.
TEST(SchedulerTest, RandomPrefixCacheWorkloadKeepsInvariants) {
  for (int tp : {1, 3}) {
    for (int seed = 0; seed < 4; ++seed) {
      BlockHasher hasher = seed == 3 ? WeakHash : HashBlockTokens;
      std::mt19937 rng(77 + 10 * tp + seed);
      // 3 slots over tp ranks: 15 logical blocks (60 positions) either way.
      const int kNumBlocks = 45 / tp;
      auto s = MakeScheduler(6, 24, kNumBlocks, tp, true, hasher, kFirstChunk);
      FakeWorkers workers(tp, kNumBlocks);
      // A few shared prefixes with diverging suffixes make hits and duplicates.
      std::vector<std::vector<int32_t>> prefixes(4);
      for (auto& p : prefixes) {
        p.resize(4 + rng() % 20);
        for (int32_t& t : p) t = int32_t(rng() % 6);  // tiny alphabet: more sharing
      }
      std::vector<uint64_t> ids;
      uint64_t next_id = 1;
      int finished = 0, removed = 0, admitted = 0;
      for (int step = 0; step < 1500 || (s->HasWork() && step < 100000); ++step) {
        if (step < 1500 && rng() % 3 == 0) {
          std::vector<int32_t> prompt = prefixes[rng() % prefixes.size()];
          prompt.resize(prompt.size() - rng() % 4);
          int suffix = int(rng() % 12);
          for (int i = 0; i < suffix; ++i) prompt.push_back(int32_t(rng() % 6));
          if (prompt.empty()) prompt.push_back(1);
          int max_tokens = 1 + int(rng() % 20);
          uint64_t id = next_id++;
          Status st = s->Add(MakeSeqWithTokens(id, prompt, max_tokens));
          if (st.ok()) {
            ids.push_back(id);
            ++admitted;
          } else {
            ASSERT_GT(int(prompt.size()) + max_tokens, s->MaxPositionsPerSequence());
          }
        }
        ScheduledBatch b = s->Schedule();
        ASSERT_LE(b.num_batched_tokens, 24);
        workers.Run(*s, b);
        ExpectBlockInvariant(*s, ids);
        // The engine: computed, then a sampled token (random, so outputs
        // differ and later get cached too).
        s->OnStepComputed(b);
        for (const ScheduledSeq& ss : b.seqs) {
          Sequence* seq = s->Find(ss.seq_id);
          if (!ss.sample || seq == nullptr) continue;
          seq->AppendToken(int32_t(rng() % 6), Clock::now());
          if (seq->num_output_tokens() >= seq->stop().max_tokens) {
            s->Remove(ss.seq_id);
            ++finished;
          }
        }
        if (!ids.empty() && rng() % 13 == 0) {
          if (s->Remove(ids[rng() % ids.size()])) ++removed;
        }
        ExpectBlockInvariant(*s, ids);
        if (::testing::Test::HasFatalFailure()) return;
      }
      EXPECT_FALSE(s->HasWork());
      EXPECT_EQ(finished + removed, admitted);
      EXPECT_GT(s->num_preemptions(), 0u) << "tp " << tp;
      EXPECT_GT(s->prefix_cache_stats().num_hit_tokens, 0u) << "tp " << tp;
      EXPECT_GT(s->kv().prefix_cache().num_evicted(), 0u) << "tp " << tp;
      for (int r = 0; r < tp; ++r) {
        EXPECT_EQ(s->kv().Usage(r).num_free, kNumBlocks);
        EXPECT_EQ(s->kv().Usage(r).num_referenced, 0);
      }
      EXPECT_EQ(s->kv().num_sequences(), 0u);
    }
  }
}

TEST(SchedulerTest, WithoutPrefixCachingNothingIsShared) {
  auto s = MakeScheduler(8, 100, 60, 1, /*prefix_caching=*/false);
  std::vector<int32_t> p(9, 3);
  ASSERT_TRUE(s->Add(MakeSeqWithTokens(1, p, 1)).ok());
  RunStep(*s, s->Schedule());
  ASSERT_TRUE(s->Add(MakeSeqWithTokens(2, p, 1)).ok());
  ScheduledBatch b = s->Schedule();
  ASSERT_EQ(b.seqs.size(), 1u);
  EXPECT_EQ(b.seqs[0].start_pos, 0);
  EXPECT_EQ(s->prefix_cache_stats().num_queried_tokens, 0u);
}

}  // namespace
}  // namespace headway
