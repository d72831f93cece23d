#include "coordinator/scheduling/sequence.h"

#include <gtest/gtest.h>

#include "common/step_limits.h"

namespace headway {
namespace {

Sequence Make(StopConditions stop) {
  return Sequence(1, {10, 11, 12}, SamplingOptions{}, std::move(stop), Clock::now());
}

TEST(SequenceTest, CountsAndTokens) {
  StopConditions stop;
  stop.max_tokens = 5;
  Sequence s = Make(stop);
  EXPECT_EQ(s.num_tokens(), 3);
  EXPECT_FALSE(s.IsDecoding());
  s.AdvanceComputed(3);
  s.AppendToken(20, Clock::now());
  EXPECT_TRUE(s.first_token_time().has_value());
  EXPECT_TRUE(s.IsDecoding());
  EXPECT_EQ(s.TokenAt(3), 20);
  s.ResetComputed();
  EXPECT_EQ(s.num_uncomputed(), 4);
  EXPECT_FALSE(s.on_worker());
}

TEST(SequenceTest, APrefillOnlySequenceIsDoneWhenItsPromptIsComputed) {
  Sequence s(1, {10, 11, 12}, SamplingOptions{}, StopConditions{}, Clock::now(),
             SequenceKind::kPrefillOnly);
  EXPECT_EQ(s.kind(), SequenceKind::kPrefillOnly);
  s.AdvanceComputed(2);
  EXPECT_FALSE(s.IsPrefillDone());
  s.AdvanceComputed(1);
  EXPECT_TRUE(s.IsPrefillDone());
  EXPECT_FALSE(Make(StopConditions{}).IsPrefillDone());
}

// As many rows as 64 MiB of f32 logits hold, at least 16.
TEST(SequenceTest, PromptLogprobRowsPerStepFollowTheVocabulary) {
  EXPECT_EQ(MaxPromptLogprobRowsPerStep(262144), 64);   // Gemma 3
  EXPECT_EQ(MaxPromptLogprobRowsPerStep(49152), 341);   // SmolLM2
  EXPECT_EQ(MaxPromptLogprobRowsPerStep(1 << 24), 16);
}

// Row q of a chunk scores prompt token q + 1: the rows of a prompt of L
// tokens are [0, L - 1), each once, whatever the chunks and preemptions.
TEST(SequenceTest, PromptLogprobRowsCoverEachPromptTokenOnce) {
  SamplingOptions sampling;
  sampling.prompt_logprobs = 2;
  Sequence s(1, {10, 11, 12, 13, 14, 15}, sampling, StopConditions{}, Clock::now());
  EXPECT_TRUE(s.NeedsPromptLogprobs());
  EXPECT_EQ(s.prompt_logprobs_end(), 1);
  Sequence::PromptRows r = s.PromptLogprobRows(0, 4);  // positions 0..3 score 1..4
  EXPECT_EQ(r.first, 0);
  EXPECT_EQ(r.count, 4);
  s.AdvancePromptLogprobs(5);
  r = s.PromptLogprobRows(4, 2);  // row 4 scores 5; row 5 is the last prompt token
  EXPECT_EQ(r.first, 0);
  EXPECT_EQ(r.count, 1);
  // A recompute from 0 (preemption) computes only what is still missing.
  r = s.PromptLogprobRows(0, 6);
  EXPECT_EQ(r.first, 4);
  EXPECT_EQ(r.count, 1);
  s.AdvancePromptLogprobs(6);
  EXPECT_FALSE(s.NeedsPromptLogprobs());
  EXPECT_EQ(s.PromptLogprobRows(0, 6).count, 0);

  // Not asked for, or a one-token prompt: no rows.
  Sequence plain(2, {10, 11, 12}, SamplingOptions{}, StopConditions{}, Clock::now());
  EXPECT_FALSE(plain.NeedsPromptLogprobs());
  EXPECT_EQ(plain.PromptLogprobRows(0, 3).count, 0);
  Sequence one(3, {10}, sampling, StopConditions{}, Clock::now());
  EXPECT_FALSE(one.NeedsPromptLogprobs());
}

}  // namespace
}  // namespace headway
