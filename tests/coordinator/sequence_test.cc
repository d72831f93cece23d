#include "coordinator/sequence.h"

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

TEST(SequenceTest, StopsOnEosUnlessIgnored) {
  StopConditions stop;
  stop.max_tokens = 10;
  stop.eos_id = 2;
  Sequence s = Make(stop);
  s.AppendToken(7, Clock::now());
  EXPECT_FALSE(s.CheckStop("x", Clock::now()));
  s.AppendToken(2, Clock::now());
  EXPECT_TRUE(s.CheckStop("x", Clock::now()));
  EXPECT_EQ(s.finish_reason(), FinishReason::kStop);
  EXPECT_EQ(s.status(), SequenceStatus::kFinished);

  stop.ignore_eos = true;
  Sequence t = Make(stop);
  t.AppendToken(2, Clock::now());
  EXPECT_FALSE(t.CheckStop("", Clock::now()));
}

TEST(SequenceTest, StopsOnLength) {
  StopConditions stop;
  stop.max_tokens = 2;
  Sequence s = Make(stop);
  s.AppendToken(7, Clock::now());
  EXPECT_FALSE(s.CheckStop("a", Clock::now()));
  s.AppendToken(7, Clock::now());
  EXPECT_TRUE(s.CheckStop("aa", Clock::now()));
  EXPECT_EQ(s.finish_reason(), FinishReason::kLength);
  EXPECT_STREQ(FinishReasonName(s.finish_reason()), "length");
}

TEST(SequenceTest, StopStringTrimsTheText) {
  StopConditions stop;
  stop.max_tokens = 10;
  stop.stop_strings = {"END", "\n\n"};
  Sequence s = Make(stop);
  s.AppendToken(7, Clock::now());
  EXPECT_FALSE(s.CheckStop("hello EN", Clock::now()));
  s.AppendToken(8, Clock::now());
  EXPECT_TRUE(s.CheckStop("hello\n\nEND more", Clock::now()));
  EXPECT_EQ(s.output_text(), "hello");  // the earliest stop string wins
  EXPECT_EQ(s.finish_reason(), FinishReason::kStop);
}

}  // namespace
}  // namespace headway

namespace headway {
namespace {

TEST(SequenceTest, StopTokenIdsAndStopReason) {
  StopConditions stop;
  stop.max_tokens = 10;
  stop.eos_id = 2;
  stop.ignore_eos = true;
  stop.stop_token_ids = {9};
  stop.stop_strings = {"zz", "yy"};
  Sequence s = Make(stop);
  s.AppendToken(2, Clock::now());  // EOS ignored
  EXPECT_FALSE(s.CheckStop("a", Clock::now()));
  s.AppendToken(9, Clock::now());  // a stop token stops even with ignore_eos
  EXPECT_TRUE(s.CheckStop("a", Clock::now()));
  EXPECT_EQ(s.finish_reason(), FinishReason::kStop);
  EXPECT_EQ(s.stop_token_id(), 9);
  EXPECT_EQ(s.stop_string(), "");

  Sequence t = Make(stop);
  t.AppendToken(5, Clock::now());
  EXPECT_TRUE(t.CheckStop("abyyczz", Clock::now()));
  EXPECT_EQ(t.output_text(), "ab");  // the earliest match wins
  EXPECT_EQ(t.stop_string(), "yy");
  EXPECT_EQ(t.stop_token_id(), -1);
}

}  // namespace
}  // namespace headway
