#include "coordinator/scheduler.h"

#include <gtest/gtest.h>

#include <random>

#include "tests/coordinator/fake_model_spec.h"

namespace headway {
namespace {

using testing::FakeLlamaSpec;

constexpr int kBlockSize = 4;

std::unique_ptr<Scheduler> MakeScheduler(int max_num_seqs, int max_batched, int num_blocks,
                                         int tp_size = 1) {
  auto kv = std::make_unique<KvCacheManager>(FakeLlamaSpec(1), tp_size, kBlockSize,
                                             std::vector<int>(tp_size, num_blocks));
  return std::make_unique<Scheduler>(SchedulerConfig{max_num_seqs, max_batched}, std::move(kv));
}

std::unique_ptr<Sequence> MakeSeq(uint64_t id, int prompt_len, int max_tokens) {
  StopConditions stop;
  stop.max_tokens = max_tokens;
  stop.ignore_eos = true;
  return std::make_unique<Sequence>(id, std::vector<int32_t>(prompt_len, 5), SamplingOptions{},
                                    stop, Clock::now());
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

// free + allocated = total on every rank, and allocated = the blocks the
// sequences' tables hold.
void ExpectBlockInvariant(const Scheduler& s, const std::vector<uint64_t>& live_ids) {
  const KvCacheManager& kv = s.kv();
  for (int r = 0; r < kv.tp_size(); ++r) {
    int held = 0;
    for (uint64_t id : live_ids) {
      if (!kv.Contains(id)) continue;
      for (int slot = 0; slot < kv.num_slots(r); ++slot) held += int(kv.TEST_Row(id, r, slot).size());
    }
    RankBlockUsage u = kv.Usage(r);
    ASSERT_EQ(u.num_total - u.num_free, held) << "rank " << r;
    ASSERT_GE(u.num_free, 0);
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
  auto s = MakeScheduler(8, 100, 12);
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
  auto s = MakeScheduler(8, 100, 12);
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
        EXPECT_EQ(ss.start_pos, 0);
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
          ASSERT_GT(prompt + max_tokens, s->kv().MaxPositionsPerSequence());
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

}  // namespace
}  // namespace headway
