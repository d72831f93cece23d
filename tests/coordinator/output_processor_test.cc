#include "coordinator/engine/output_processor.h"

#include <gtest/gtest.h>

#include <random>

namespace headway {
namespace {

// Appends `text` as the n-th output token `token` of a 3-token prompt.
bool Append(StopChecker& c, int32_t token, std::string_view text, int n) {
  return c.Append(token, text, n, 3 + n);
}

TEST(StopCheckerTest, StopsOnEosUnlessIgnored) {
  StopConditions stop;
  stop.max_tokens = 10;
  stop.eos_id = 2;
  StopChecker s(stop);
  EXPECT_FALSE(Append(s, 7, "x", 1));
  EXPECT_TRUE(s.IsStopToken(2));
  EXPECT_TRUE(Append(s, 2, "", 2));
  EXPECT_EQ(s.finish_reason(), FinishReason::kStop);
  EXPECT_TRUE(s.done());

  stop.ignore_eos = true;
  StopChecker t(stop);
  EXPECT_FALSE(t.IsStopToken(2));
  EXPECT_FALSE(Append(t, 2, "", 1));
}

TEST(StopCheckerTest, NothingButTheContextStopsBeforeMinTokens) {
  StopConditions stop;
  stop.max_tokens = 10;
  stop.min_tokens = 3;
  stop.eos_id = 2;
  stop.stop_strings = {"END"};
  StopChecker s(stop);
  EXPECT_FALSE(Append(s, 7, "END", 1));
  EXPECT_FALSE(Append(s, 2, "", 2));
  EXPECT_FALSE(s.done());
  EXPECT_EQ(s.text(), "END");
  // The third token's text is not searched either (vLLM looks for stop
  // strings only after min_tokens tokens); the fourth's is.
  EXPECT_FALSE(Append(s, 8, "END", 3));
  EXPECT_TRUE(Append(s, 9, "END", 4));
  EXPECT_EQ(s.finish_reason(), FinishReason::kStop);
  EXPECT_EQ(s.text(), "ENDEND");  // cut at the new match; those before stay

  stop.max_model_len = 5;  // 3 prompt tokens + 2
  StopChecker t(stop);
  EXPECT_FALSE(Append(t, 7, "a", 1));
  EXPECT_TRUE(Append(t, 7, "a", 2));
  EXPECT_EQ(t.finish_reason(), FinishReason::kLength);
}

TEST(StopCheckerTest, StopsOnLength) {
  StopConditions stop;
  stop.max_tokens = 2;
  StopChecker s(stop);
  EXPECT_FALSE(Append(s, 7, "a", 1));
  EXPECT_TRUE(Append(s, 7, "a", 2));
  EXPECT_EQ(s.finish_reason(), FinishReason::kLength);
  EXPECT_STREQ(FinishReasonName(s.finish_reason()), "length");
  EXPECT_EQ(s.text(), "aa");

  stop.max_tokens = 100;
  stop.max_model_len = 5;  // 3 prompt tokens + 2
  StopChecker t(stop);
  EXPECT_FALSE(Append(t, 7, "a", 1));
  EXPECT_TRUE(Append(t, 7, "a", 2));
  EXPECT_EQ(t.finish_reason(), FinishReason::kLength);
}

TEST(StopCheckerTest, StopStringTrimsTheText) {
  StopConditions stop;
  stop.max_tokens = 10;
  stop.stop_strings = {"END", "\n\n"};
  StopChecker s(stop);
  EXPECT_FALSE(Append(s, 7, "hello", 1));
  EXPECT_TRUE(Append(s, 8, "\n\nEND more", 2));
  EXPECT_EQ(s.text(), "hello");  // the earliest stop string wins
  EXPECT_EQ(s.finish_reason(), FinishReason::kStop);
  EXPECT_EQ(s.stop_string(), "\n\n");
}

TEST(StopCheckerTest, StopTokenIdsAndStopReason) {
  StopConditions stop;
  stop.max_tokens = 10;
  stop.eos_id = 2;
  stop.ignore_eos = true;
  stop.stop_token_ids = {9};
  stop.stop_strings = {"zz", "yy"};
  StopChecker s(stop);
  EXPECT_FALSE(Append(s, 2, "a", 1));  // EOS ignored
  EXPECT_TRUE(Append(s, 9, "", 2));    // a stop token stops even with ignore_eos
  EXPECT_EQ(s.finish_reason(), FinishReason::kStop);
  EXPECT_EQ(s.stop_token_id(), 9);
  EXPECT_EQ(s.stop_string(), "");

  StopChecker t(stop);
  EXPECT_TRUE(Append(t, 5, "abyyczz", 1));
  EXPECT_EQ(t.text(), "ab");  // the earliest match wins
  EXPECT_EQ(t.stop_string(), "yy");
  EXPECT_EQ(t.stop_token_id(), -1);
}

TEST(StopCheckerTest, AStopStringAcrossTokensIsFound) {
  StopConditions stop;
  stop.max_tokens = 100;
  stop.stop_strings = {"STOP"};
  StopChecker s(stop);
  EXPECT_FALSE(Append(s, 1, "say S", 1));
  EXPECT_EQ(s.StreamableLength(), 4u);  // "S" may begin the stop string
  EXPECT_FALSE(Append(s, 1, "T", 2));
  EXPECT_FALSE(Append(s, 1, "O", 3));
  EXPECT_TRUE(Append(s, 1, "Pped", 4));
  EXPECT_EQ(s.text(), "say ");
  EXPECT_EQ(s.stop_string(), "STOP");
}

// Searching only the tail finds what a search of the whole text finds, for
// random texts split into random tokens.
TEST(StopCheckerTest, TailSearchEqualsWholeTextSearch) {
  std::mt19937 rng(11);
  const std::vector<std::string> stops = {"ab", "bab", "c", "aaa"};
  for (int trial = 0; trial < 500; ++trial) {
    StopConditions stop;
    stop.max_tokens = 1000;
    std::vector<std::string> chosen;
    for (const std::string& s : stops) {
      if (rng() % 2) chosen.push_back(s);
    }
    if (chosen.empty()) chosen.push_back("bab");
    stop.stop_strings = chosen;
    StopChecker checker(stop);
    std::string text;
    size_t expected_cut = std::string::npos;
    for (int n = 1; n <= 30 && !checker.done(); ++n) {
      std::string piece;
      for (int k = int(rng() % 4); k > 0; --k) piece += "abcd"[rng() % (chosen.size() > 2 ? 4 : 3)];
      text += piece;
      size_t cut = std::string::npos;
      for (const std::string& s : chosen) cut = std::min(cut, text.find(s));
      const bool done = Append(checker, 1, piece, n);
      EXPECT_EQ(done, cut != std::string::npos) << text;
      if (done) expected_cut = cut;
    }
    if (expected_cut != std::string::npos) {
      EXPECT_EQ(checker.text(), text.substr(0, expected_cut));
    }
  }
}

}  // namespace
}  // namespace headway
