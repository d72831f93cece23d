// Prompt-boundary retention of sliding-window blocks and the admission
// floor (coordinator/scheduling/scheduler.h), as properties over block
// sizes, prompt lengths and chunkings: the commit keeps one window per
// sliding slot, a later request with the prompt finds it, a pool sized to
// the floor runs a full batch without preemption, and random traffic keeps
// every block accounted for exactly once.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "coordinator/scheduling/scheduler.h"
#include "tests/coordinator/fake_model_spec.h"

namespace headway {
namespace {

using testing::FakeLlamaSpec;
using Admission = SchedulerConfig::Admission;

constexpr int kWindow = 32;

// 2 layers x 3 KV heads; on every layer KV head 0 slides over kWindow.
ModelSpec SlidingSpec() {
  ModelSpec spec = FakeLlamaSpec(2);
  for (int layer = 0; layer < spec.num_layers; ++layer) {
    spec.slot_specs[size_t(layer) * spec.num_kv_heads].window = kWindow;
  }
  return spec;
}

struct PoolSetup {
  int block_size = 16;
  int chunk = 24;
  int max_num_seqs = 4;
  int num_blocks = 4000;
  Admission admission = Admission::kGuaranteedNoEvict;
};

std::unique_ptr<Scheduler> MakeScheduler(const PoolSetup& setup) {
  auto kv = std::make_unique<KvCacheManager>(SlidingSpec(), 1, setup.block_size,
                                             std::vector<int>{setup.num_blocks});
  SchedulerConfig config{setup.max_num_seqs, setup.chunk};
  config.admission = setup.admission;
  return std::make_unique<Scheduler>(config, std::move(kv));
}

std::vector<int32_t> Tokens(int32_t first, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = first + i;
  return t;
}

std::unique_ptr<Sequence> MakeSeq(uint64_t id, std::vector<int32_t> prompt, int max_tokens) {
  StopConditions stop;
  stop.max_tokens = max_tokens;
  stop.ignore_eos = true;
  return std::make_unique<Sequence>(id, std::move(prompt), SamplingOptions{}, stop,
                                    Clock::now());
}

// Plays workers and engine until no work is left or `max_steps` pass:
// sampled sequences get a token, finished ones are removed. Checks the
// manager's accounting after every step. Returns the most sequences that
// ran at once.
size_t RunToEnd(Scheduler& s, int max_steps = 100000) {
  size_t most_running = 0;
  for (int step = 0; step < max_steps && s.HasWork(); ++step) {
    ScheduledBatch batch = s.Schedule();
    most_running = std::max(most_running, s.num_running());
    s.OnStepComputed(batch);
    for (const ScheduledSeq& planned : batch.seqs) {
      Sequence* seq = s.Find(planned.seq_id);
      if (seq == nullptr || !planned.sample) continue;
      seq->AppendToken(7, Clock::now());
      if (seq->num_output_tokens() >= seq->stop().max_tokens) s.Remove(planned.seq_id);
    }
    const Status consistent = s.kv().CheckConsistency();
    EXPECT_TRUE(consistent.ok()) << consistent.ToString();
    if (!consistent.ok()) break;
  }
  EXPECT_FALSE(s.HasWork()) << "did not finish in " << max_steps << " steps";
  return most_running;
}

// The cached tokens a new request with `prompt` starts from.
int CachedTokensOf(Scheduler& s, uint64_t id, std::vector<int32_t> prompt) {
  EXPECT_TRUE(s.Add(MakeSeq(id, std::move(prompt), 1)).ok());
  (void)s.Schedule();
  const Sequence* seq = s.Find(id);
  const int cached = seq != nullptr ? seq->num_cached_tokens() : -1;
  s.Remove(id);
  return cached;
}

TEST(PromptRetentionTest, CommitKeepsOneWindowAndServesTheNextRequest) {
  for (int block_size : {1, 16, kWindow}) {
    const int gap_bound = (kWindow + block_size - 1) / block_size + 1;
    // Prompt lengths over a whole chunk cover every residue of prompt %
    // chunk, a final chunk of one token (shorter than any gap) included.
    for (int prompt_len = 2 * kWindow; prompt_len < 2 * kWindow + 24; ++prompt_len) {
      SCOPED_TRACE(::testing::Message() << "block " << block_size << ", prompt " << prompt_len);
      PoolSetup setup;
      setup.block_size = block_size;
      auto s = MakeScheduler(setup);
      const std::vector<int32_t> prompt = Tokens(100, prompt_len);
      // Decode well past the prompt's window, so recycling would drop it.
      ASSERT_TRUE(s->Add(MakeSeq(1, prompt, 3 * kWindow)).ok());
      RunToEnd(*s);

      const KvCacheManager& kv = s->kv();
      const int committed = prompt_len / block_size;
      const PrefixMatch all = kv.MatchPrefix(TokenIds{prompt, {}}, prompt_len);
      ASSERT_EQ(int(all.entries.size()), committed);
      for (int slot : {0, 3}) {  // the sliding slots
        int kept = 0;
        for (CacheEntryId e : all.entries) kept += kv.prefix_cache().blocks(e)[0][size_t(slot)] >= 0;
        EXPECT_LE(kept, gap_bound) << "slot " << slot;
        EXPECT_GE(kept, std::min(committed, kWindow / block_size)) << "slot " << slot;
      }
      // The same prompt again: every whole block it may reuse.
      EXPECT_EQ(CachedTokensOf(*s, 2, prompt), (prompt_len - 1) / block_size * block_size);
      // A prompt that leaves the committed length inside its last block.
      std::vector<int32_t> diverging(prompt.begin(), prompt.begin() + committed * block_size);
      diverging.back() = -5;
      diverging.push_back(1);
      EXPECT_EQ(CachedTokensOf(*s, 3, diverging), (committed - 1) * block_size);
      EXPECT_TRUE(kv.CheckConsistency().ok());
    }
  }
}

TEST(PromptRetentionTest, RetainedBlocksWaitForEvictionOnceUnreferenced) {
  PoolSetup setup;
  auto s = MakeScheduler(setup);
  const std::vector<int32_t> prompt = Tokens(100, 80);
  ASSERT_TRUE(s->Add(MakeSeq(1, prompt, 3 * kWindow)).ok());
  // Run the prompt and part of the decode: the window left the prompt, the
  // sequence still references the prompt's entries, so they are retained.
  while (s->Find(1) == nullptr || s->Find(1)->num_output_tokens() < 2 * kWindow) {
    ScheduledBatch batch = s->Schedule();
    s->OnStepComputed(batch);
    for (const ScheduledSeq& planned : batch.seqs) {
      if (planned.sample) s->Find(planned.seq_id)->AppendToken(7, Clock::now());
    }
  }
  RankBlockUsage running = s->kv().Usage(0);
  EXPECT_GT(running.num_retained, 0);
  EXPECT_LE(running.num_retained, running.num_referenced);
  s->Remove(1);
  RankBlockUsage done = s->kv().Usage(0);
  EXPECT_EQ(done.num_retained, 0);  // now evictable
  EXPECT_GE(done.num_evictable, running.num_retained);
  EXPECT_TRUE(s->kv().CheckConsistency().ok());
}

// The floor of `setup` for requests of `max_positions`.
int64_t FloorOf(PoolSetup setup, int64_t max_positions) {
  return MakeScheduler(setup)->FloorShares(0, max_positions);
}

TEST(PromptRetentionTest, DecodeCompletesForEveryPromptLengthOnTheFloor) {
  constexpr int kMaxLen = 160;
  PoolSetup setup;
  setup.max_num_seqs = 1;
  setup.num_blocks = int(FloorOf(setup, kMaxLen));
  for (int prompt_len = 1; prompt_len < kMaxLen; prompt_len += 3) {
    SCOPED_TRACE(::testing::Message() << "prompt " << prompt_len);
    auto s = MakeScheduler(setup);
    ASSERT_TRUE(s->Add(MakeSeq(1, Tokens(100, prompt_len), kMaxLen - prompt_len)).ok());
    RunToEnd(*s);
    EXPECT_EQ(s->num_preemptions(), 0u);
  }
}

TEST(PromptRetentionTest, FullBatchOnTheFloorDecodesWithoutPreemption) {
  constexpr int kMaxLen = 200;
  for (int block_size : {1, 16, kWindow}) {
    SCOPED_TRACE(::testing::Message() << "block " << block_size);
    PoolSetup setup;
    setup.block_size = block_size;
    setup.max_num_seqs = 4;
    setup.num_blocks = int(FloorOf(setup, kMaxLen));
    auto s = MakeScheduler(setup);
    EXPECT_EQ(s->MaxConcurrentAt(kMaxLen), 4);
    for (int i = 0; i < 4; ++i) {
      const int prompt_len = 37 + 29 * i;
      ASSERT_TRUE(s->Add(MakeSeq(uint64_t(i + 1), Tokens(1000 * (i + 1), prompt_len),
                                 kMaxLen - prompt_len))
                      .ok());
    }
    EXPECT_EQ(RunToEnd(*s), 4u);
    EXPECT_EQ(s->num_preemptions(), 0u);
  }
}

TEST(PromptRetentionTest, APoolForOneFootprintRunsOneAtATimeAndSaysSo) {
  constexpr int kMaxLen = 200;
  PoolSetup setup;
  setup.max_num_seqs = 1;
  const int64_t one = FloorOf(setup, kMaxLen);
  setup.max_num_seqs = 4;
  setup.num_blocks = int(one);
  auto s = MakeScheduler(setup);
  EXPECT_EQ(s->MaxConcurrentAt(kMaxLen), 1);
  EXPECT_GT(s->FloorShares(0, kMaxLen), one);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(s->Add(MakeSeq(uint64_t(i + 1), Tokens(1000 * (i + 1), 120), kMaxLen - 120)).ok());
  }
  EXPECT_EQ(RunToEnd(*s), 1u);
  EXPECT_EQ(s->num_preemptions(), 0u);
}

TEST(PromptRetentionTest, FirstChunkAdmissionPreemptsWhereReservationDoesNot) {
  // The same traffic on the same small pool: admission by first chunk
  // starts requests whose later chunks do not fit and recomputes them.
  constexpr int kMaxLen = 200;
  PoolSetup setup;
  setup.max_num_seqs = 4;
  setup.num_blocks = int(FloorOf(setup, kMaxLen) / 2);
  size_t preemptions[2];
  for (Admission admission : {Admission::kGuaranteedNoEvict, Admission::kMaxUtilization}) {
    setup.admission = admission;
    auto s = MakeScheduler(setup);
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(s->Add(MakeSeq(uint64_t(i + 1), Tokens(1000 * (i + 1), 150), 50)).ok());
    }
    RunToEnd(*s);
    preemptions[admission == Admission::kGuaranteedNoEvict ? 0 : 1] = s->num_preemptions();
  }
  EXPECT_EQ(preemptions[0], 0u);
  EXPECT_GT(preemptions[1], 0u);
}

TEST(PromptRetentionTest, RandomTrafficKeepsEveryBlockAccountedFor) {
  // Shared prefixes, cancellations, preemption and eviction on a small
  // pool; CheckConsistency after every step proves free + evictable +
  // retained + held = total with no block held twice.
  std::mt19937 rng(7);
  for (Admission admission : {Admission::kGuaranteedNoEvict, Admission::kMaxUtilization}) {
    for (int block_size : {1, 4, 16}) {
      SCOPED_TRACE(::testing::Message() << "block " << block_size << " admission "
                                      << int(admission));
      PoolSetup setup;
      setup.block_size = block_size;
      setup.max_num_seqs = 6;
      setup.chunk = 40;
      setup.admission = admission;
      setup.num_blocks = int(FloorOf(setup, 160) / 3);
      auto s = MakeScheduler(setup);
      const std::vector<int32_t> shared = Tokens(5000, 120);
      uint64_t next_id = 1;
      for (int step = 0; step < 3000; ++step) {
        if (rng() % 4 == 0) {
          const int keep = int(rng() % 120);
          std::vector<int32_t> prompt(shared.begin(), shared.begin() + keep);
          const int extra = 1 + int(rng() % 30);
          for (int i = 0; i < extra; ++i) prompt.push_back(int32_t(rng() % 3));
          (void)s->Add(MakeSeq(next_id++, std::move(prompt), 1 + int(rng() % 20)));
        }
        if (rng() % 9 == 0 && next_id > 1) s->Remove(1 + rng() % (next_id - 1));
        ScheduledBatch batch = s->Schedule();
        s->OnStepComputed(batch);
        for (const ScheduledSeq& planned : batch.seqs) {
          Sequence* seq = s->Find(planned.seq_id);
          if (seq == nullptr || !planned.sample) continue;
          seq->AppendToken(int32_t(rng() % 3), Clock::now());
          if (seq->num_output_tokens() >= seq->stop().max_tokens) s->Remove(planned.seq_id);
        }
        const Status consistent = s->kv().CheckConsistency();
        ASSERT_TRUE(consistent.ok()) << "step " << step << ": " << consistent.ToString();
        const RankBlockUsage u = s->kv().Usage(0);
        ASSERT_LE(u.num_retained, u.num_referenced);
        ASSERT_EQ(u.num_free + u.num_referenced, u.num_total);
      }
      RunToEnd(*s);
    }
  }
}

}  // namespace
}  // namespace headway
