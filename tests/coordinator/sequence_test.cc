#include "coordinator/scheduling/sequence.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace headway
