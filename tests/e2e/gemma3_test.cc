// Gemma 3 270M served end to end: a real sliding-window model (15 of 18
// layers see 512 positions). Its sliding layers recycle blocks as they leave
// the window; greedy output must not change for it, past the window, nor
// when the prefix cache serves a long prompt again or to two copies of it at
// once (the shape of known engine bugs, where a prefix hit reads sliding
// blocks that were already freed).
#include <gtest/gtest.h>

#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/deployment.h"
#include "tests/support/prometheus_parser.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using nlohmann::json;

constexpr char kServedName[] = "gemma3";
constexpr int kLongPromptTokens = 1500;

json GreedyBody(const json& prompt, int max_tokens, bool ignore_eos) {
  return {{"model", kServedName},
          {"prompt", prompt},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", ignore_eos}};
}

std::unique_ptr<Deployment> StartGemmaWithPool(bool recycling, bool prefix_caching,
                                               int kv_memory_mb,
                                               const std::string& sliding_dtype = "");

std::unique_ptr<Deployment> StartGemma(bool recycling, bool prefix_caching) {
  return StartGemmaWithPool(recycling, prefix_caching, 256);
}

std::unique_ptr<Deployment> StartGemmaWithPool(bool recycling, bool prefix_caching,
                                               int kv_memory_mb,
                                               const std::string& sliding_dtype) {
  DeploymentOptions options;
  options.kv_cache_dtype_sliding = sliding_dtype;
  options.model_path = Gemma3Path();
  options.served_name = kServedName;
  options.kv_memory_mb = kv_memory_mb;
  options.max_model_len = 2048;
  options.enable_recycling = recycling;
  options.enable_prefix_caching = prefix_caching;
  std::string error;
  std::unique_ptr<Deployment> d = Deployment::Start(options, &error);
  EXPECT_NE(d, nullptr) << error;
  return d;
}

double CounterSum(const Deployment& d, const std::string& name) {
  Result<PromExposition> m = ParsePrometheusText(d.Get("/metrics").body);
  EXPECT_TRUE(m.ok());
  double sum = 0;
  if (m.ok()) {
    for (const PromSample* s : m->Samples(name)) sum += s->value;
  }
  return sum;
}

// The first kLongPromptTokens ids (BOS first) of an English passage
// repeated: the perplexity passage, Alice's Adventures in Wonderland.
std::vector<int32_t> LongPromptIds(const Deployment& d) {
  std::ifstream in(TestDataPath("perplexity/passage.txt"));
  std::stringstream passage;
  passage << in.rdbuf();
  std::string text;
  for (int i = 0; i < 8; ++i) text += passage.str() + "\n\n";
  HttpReply t = d.PostJson("/tokenize", {{"model", kServedName}, {"prompt", text}});
  EXPECT_EQ(t.status, 200) << t.body;
  if (t.status != 200) return {};
  std::vector<int32_t> ids = t.json["tokens"].get<std::vector<int32_t>>();
  EXPECT_GE(ids.size(), size_t(kLongPromptTokens));
  EXPECT_EQ(ids.at(0), 2);  // <bos>
  ids.resize(std::min(ids.size(), size_t(kLongPromptTokens)));
  return ids;
}

// What a deployment answers to the long greedy requests of the serving
// tests below: 600 tokens after a short prompt (past the sliding layers'
// 512-position window), then a 1,500-token prompt alone and, with
// `twice_at_once`, twice more at once (the second pair hits the cache).
struct LongTexts {
  std::string long_decode;
  std::vector<std::string> long_prompt;
};

LongTexts ServeLongRequests(const Deployment& d, bool twice_at_once) {
  LongTexts texts;
  HttpReply r = d.PostJson("/v1/completions",
                           GreedyBody("The history of the lighthouse begins", 600, true));
  texts.long_decode = CompletionText(r);
  if (r.status == 200) {
    EXPECT_EQ(r.json["usage"]["completion_tokens"], 600);
  }
  const std::vector<int32_t> ids = LongPromptIds(d);
  auto complete = [&] {
    return CompletionText(d.PostJson("/v1/completions", GreedyBody(ids, 24, true)));
  };
  texts.long_prompt.push_back(complete());
  if (twice_at_once) {
    auto a = std::async(std::launch::async, complete);
    auto b = std::async(std::launch::async, complete);
    texts.long_prompt.push_back(a.get());
    texts.long_prompt.push_back(b.get());
  }
  return texts;
}

// `on` (recycling and prefix caching on, the prompt three times) answers as
// `off` (both off, the prompt once), and neither answer is an error.
void ExpectSameLongTexts(const LongTexts& on, const LongTexts& off) {
  EXPECT_FALSE(IsErrorText(on.long_decode)) << on.long_decode;
  EXPECT_EQ(on.long_decode, off.long_decode);
  ASSERT_EQ(on.long_prompt.size(), 3u);
  ASSERT_EQ(off.long_prompt.size(), 1u);
  for (const std::string& text : on.long_prompt) {
    EXPECT_FALSE(IsErrorText(text)) << text;
    EXPECT_EQ(text, off.long_prompt[0]);
  }
}

class Gemma3ServingTest : public ::testing::Test {
 protected:
  void SetUp() override { HW_REQUIRE_MODEL(Gemma3Path()); }
};

// The base model continues plain English sensibly: the counting prompt goes
// on counting, as llama.cpp's greedy continuation does
// (tests/data/reference/gemma3_greedy.json).
TEST_F(Gemma3ServingTest, ContinuesPlainEnglish) {
  std::unique_ptr<Deployment> d = StartGemma(true, true);
  ASSERT_NE(d, nullptr);
  const std::string counting = CompletionText(
      d->PostJson("/v1/completions", GreedyBody("One, two, three, four, five,", 8, false)));
  EXPECT_EQ(counting.rfind(" six, seven, eight, nine", 0), 0u) << counting;
  // No chat template in the base model's GGUF: the chat API says so.
  HttpReply chat = d->PostJson(
      "/v1/chat/completions",
      {{"model", kServedName}, {"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}});
  EXPECT_GE(chat.status, 400) << chat.body;
  EXPECT_TRUE(chat.json.contains("error")) << chat.body;
}

// 600 greedy tokens after a short prompt: positions past 512, where the
// sliding layers start recycling, with recycling on and off; the same text
// both ways, and every block back in the pool at the end. Then a
// 1,500-token prompt alone, and twice at once with the prefix cache on
// (hits cut to what the windows kept), equals caching off.
TEST_F(Gemma3ServingTest, RecyclingAndPrefixCachingKeepGreedyOutput) {
  struct Run {
    LongTexts texts;
    double recycled = 0;
    long free_at_start = 0, free_at_end = 0;
  };
  auto serve = [](bool recycling, bool prefix_caching) {
    Run run;
    std::unique_ptr<Deployment> d = StartGemma(recycling, prefix_caching);
    if (d == nullptr) return run;
    run.free_at_start = d->FreeBlocks();
    run.texts = ServeLongRequests(*d, /*twice_at_once=*/recycling);
    run.recycled = CounterSum(*d, "headway:kv_blocks_recycled_total");
    run.free_at_end = d->FreeBlocks();
    return run;
  };
  const Run on = serve(/*recycling=*/true, /*prefix_caching=*/true);
  const Run off = serve(/*recycling=*/false, /*prefix_caching=*/false);
  ExpectSameLongTexts(on.texts, off.texts);
  EXPECT_GT(on.recycled, 0);
  EXPECT_EQ(off.recycled, 0);
  EXPECT_EQ(on.free_at_end, on.free_at_start);
  EXPECT_EQ(off.free_at_end, off.free_at_start);
}

// cache.kv_cache_dtype_sliding: q8_0: the sliding layers' blocks are 17/32
// of the full layers' (float16, the default), both in one arena of chunks
// (common/kv_arena.h) that recycling returns to and the prefix cache keeps.
// Workers register the arena; a long decode past the window and a
// 1,500-token prompt, twice at once from the cache, give the same text as
// with recycling and caching off, and every block is free (or cached) at
// the end.
TEST_F(Gemma3ServingTest, SlidingLayersInQ8_0KeepGreedyOutputUnderRecyclingAndCaching) {
  struct Run {
    LongTexts texts;
    // /health's free and total blocks of the rank at the end: the total
    // counts each chunk's blocks in the dtype it is lent to, so it moves as
    // chunks are lent; every block is free (or cached) once requests end.
    long free_at_end = 0, total_at_end = -1;
  };
  auto serve = [](bool recycling, bool prefix_caching) {
    Run run;
    std::unique_ptr<Deployment> d = StartGemmaWithPool(recycling, prefix_caching, 256, "q8_0");
    if (d == nullptr) return run;
    run.texts = ServeLongRequests(*d, /*twice_at_once=*/recycling);
    const json health = d->Get("/health").json;
    if (health.contains("instances") && health["instances"].size() == 1 &&
        health["instances"][0]["ranks"].size() == 1) {
      const json& rank = health["instances"][0]["ranks"][0];
      run.free_at_end = rank["free_blocks"].get<long>();
      run.total_at_end = rank["total_blocks"].get<long>();
    }
    return run;
  };
  const Run on = serve(/*recycling=*/true, /*prefix_caching=*/true);
  const Run off = serve(/*recycling=*/false, /*prefix_caching=*/false);
  ExpectSameLongTexts(on.texts, off.texts);
  EXPECT_EQ(on.free_at_end, on.total_at_end);
  EXPECT_EQ(off.free_at_end, off.total_at_end);
}

// A completion's text and usage (prompt and cached tokens).
struct Reply {
  std::string text;
  int prompt_tokens = -1;
  int cached_tokens = -1;
};

Reply CompleteGreedy(const Deployment& d, const json& prompt, int max_tokens) {
  HttpReply r = d.PostJson("/v1/completions", GreedyBody(prompt, max_tokens, true));
  Reply out;
  out.text = CompletionText(r);
  if (r.status != 200) return out;
  out.prompt_tokens = r.json["usage"]["prompt_tokens"].get<int>();
  out.cached_tokens = r.json["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  return out;
}

// Requests sharing a prefix longer than the sliding window: two diverge
// right after it, two inside its last block. A second, identical wave after
// the first has finished must find each whole prompt in the cache (the
// prompt's last window was retained when decode moved past it), and every
// output equals prefix caching off.
TEST_F(Gemma3ServingTest, SecondWaveReusesPromptsWhoseWindowDecodeLeft) {
  constexpr int kShared = 800, kBlock = 16, kMaxTokens = 40;
  auto prompts_of = [](const std::vector<int32_t>& ids) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 4; ++i) {
      const int shared = i < 2 ? kShared : kShared - 5;
      std::vector<int32_t> p(ids.begin(), ids.begin() + shared);
      p.insert(p.end(), ids.begin() + 1000 + 40 * i, ids.begin() + 1030 + 40 * i);
      prompts.push_back(std::move(p));
    }
    return prompts;
  };
  auto wave = [](const Deployment& d, const std::vector<std::vector<int32_t>>& prompts) {
    std::vector<std::future<Reply>> futures;
    for (const auto& p : prompts) {
      futures.push_back(std::async(std::launch::async, [&d, &p] {
        return CompleteGreedy(d, p, kMaxTokens);
      }));
    }
    std::vector<Reply> replies;
    for (auto& f : futures) replies.push_back(f.get());
    return replies;
  };
  std::vector<std::string> off_texts;
  {
    std::unique_ptr<Deployment> off = StartGemma(true, false);
    ASSERT_NE(off, nullptr);
    for (const Reply& r : wave(*off, prompts_of(LongPromptIds(*off)))) {
      off_texts.push_back(r.text);
    }
  }
  std::unique_ptr<Deployment> d = StartGemma(true, true);
  ASSERT_NE(d, nullptr);
  const std::vector<std::vector<int32_t>> prompts = prompts_of(LongPromptIds(*d));
  const std::vector<Reply> first = wave(*d, prompts);
  const std::vector<Reply> second = wave(*d, prompts);
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "request " << i);
    EXPECT_FALSE(IsErrorText(first[i].text)) << first[i].text;
    EXPECT_EQ(first[i].text, off_texts[i]);
    EXPECT_EQ(second[i].text, off_texts[i]);
    EXPECT_EQ(second[i].cached_tokens, int(prompts[i].size() - 1) / kBlock * kBlock);
  }
  EXPECT_GT(CounterSum(*d, "headway:kv_blocks_recycled_total"), 0);
}

// A conversation whose every turn extends the last (its prompt, its answer
// and a new message, as text): each turn finds at least the whole previous
// prompt cached, although the previous answer moved the window past the
// prompt's end.
TEST_F(Gemma3ServingTest, ConversationTurnsReuseThePreviousTurn) {
  constexpr int kBlock = 16, kMaxTokens = 40;
  std::unique_ptr<Deployment> d = StartGemma(true, true);
  ASSERT_NE(d, nullptr);
  std::ifstream in(TestDataPath("perplexity/passage.txt"));
  std::stringstream passage;
  passage << in.rdbuf();
  std::string text;
  for (int i = 0; i < 6; ++i) text += passage.str() + "\n\n";
  std::string conversation = text.substr(0, 2 * (passage.str().size() + 2));
  int previous_prompt_tokens = 0;
  for (int turn = 0; turn < 3; ++turn) {
    SCOPED_TRACE(::testing::Message() << "turn " << turn);
    const Reply r = CompleteGreedy(*d, conversation, kMaxTokens);
    ASSERT_FALSE(IsErrorText(r.text)) << r.text;
    ASSERT_GT(r.prompt_tokens, 512 + kBlock);  // longer than the window
    if (turn > 0) {
      EXPECT_GE(r.cached_tokens, previous_prompt_tokens / kBlock * kBlock);
    }
    previous_prompt_tokens = r.prompt_tokens;
    conversation += r.text + "\n\nQuestion: " + text.substr(3000 + 200 * size_t(turn), 150);
  }
}

}  // namespace
}  // namespace headway::testing
