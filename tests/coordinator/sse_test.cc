// SSE framing, stop-string hold-back, the engine -> HTTP output queue, and
// the chunks a streaming response sends.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "common/gguf.h"
#include "coordinator/engine/request_output.h"
#include "coordinator/http/sse.h"
#include "coordinator/http/stream_renderer.h"
#include "tests/support/test_env.h"

namespace headway {
namespace {

using nlohmann::json;

TEST(SseTest, EventFramingAndParsing) {
  EXPECT_EQ(SseEvent(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  // Invalid UTF-8 never breaks the stream.
  EXPECT_EQ(SseEvent(json{{"t", std::string("\xff")}}), "data: {\"t\":\"\xEF\xBF\xBD\"}\n\n");
  std::string body = SseEvent(json{{"x", "a\nb"}}) + ": comment\n\n" + std::string(kSseDone);
  auto events = ParseSse(body);
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ(json::parse((*events)[0])["x"], "a\nb");
  EXPECT_EQ((*events)[1], "[DONE]");
  EXPECT_FALSE(ParseSse("data: 1\n").ok());              // no blank line
  EXPECT_FALSE(ParseSse("data: 1\ndata: 2\n\n").ok());   // two data lines
  EXPECT_FALSE(ParseSse("event: x\n\n").ok());
  EXPECT_FALSE(ParseSse("data: 1").ok());
}

TEST(SseTest, StreamableLengthHoldsBackStopPrefixes) {
  const std::vector<std::string> stops = {"STOP", "\n\n"};
  EXPECT_EQ(StreamableLength("hello", stops), 5u);
  EXPECT_EQ(StreamableLength("hello S", stops), 6u);
  EXPECT_EQ(StreamableLength("hello ST", stops), 6u);
  EXPECT_EQ(StreamableLength("hello STO", stops), 6u);
  EXPECT_EQ(StreamableLength("hello STX", stops), 9u);
  EXPECT_EQ(StreamableLength("a\n", stops), 1u);
  EXPECT_EQ(StreamableLength("", stops), 0u);
  EXPECT_EQ(StreamableLength("abc", {}), 3u);
  EXPECT_EQ(StreamableLength("abc", {""}), 3u);
  // The longest held-back suffix wins over a shorter one.
  EXPECT_EQ(StreamableLength("xabab", {"ababc", "b"}), 1u);
  // A multi-byte stop string: never cut inside the text's last character.
  EXPECT_EQ(StreamableLength("caf\xC3\xA9", {"\xC3\xA9t\xC3\xA9"}), 3u);
}

// Whatever the tokens, the streamed prefix never contains text that the
// final stop-string cut removes.
TEST(SseTest, StreamedTextIsAlwaysAPrefixOfTheAnswer) {
  const std::vector<std::string> stops = {"abc", "bcd", "cc"};
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text, streamed;
    size_t num_streamed = 0;
    std::string answer;
    for (int step = 0; step < 12; ++step) {
      text += char('a' + rng() % 4);
      size_t cut = std::string::npos;
      for (const std::string& s : stops) cut = std::min(cut, text.find(s));
      if (cut != std::string::npos) {
        answer = text.substr(0, cut);
        break;
      }
      size_t safe = std::max(StreamableLength(text, stops), num_streamed);
      streamed += text.substr(num_streamed, safe - num_streamed);
      num_streamed = safe;
      answer = text;
    }
    ASSERT_EQ(answer.compare(0, streamed.size(), streamed), 0) << text << " streamed " << streamed;
  }
}

TEST(SseTest, OutputStreamHandsOverWithoutBlockingTheProducer) {
  OutputStream stream;
  EXPECT_TRUE(stream.Take(std::chrono::milliseconds(1)).text.empty());
  stream.Push("ab", GeneratedToken{1, 0.0f, {}});
  stream.Push("c", GeneratedToken{2, 0.0f, {}});
  OutputStream::Update u = stream.Take(std::chrono::milliseconds(1));
  EXPECT_EQ(u.text, "abc");  // coalesced for a slow reader
  EXPECT_EQ(u.tokens.size(), 2u);
  EXPECT_FALSE(u.final);
  std::thread producer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CompletionOutcome done;
    done.finish_reason = FinishReason::kLength;
    stream.Close("end", done);
    stream.Push("ignored", GeneratedToken{3, 0.0f, {}});
  });
  u = stream.Take(std::chrono::seconds(5));
  producer.join();
  if (!u.final) {
    OutputStream::Update more = stream.Take(std::chrono::seconds(1));
    u.text += more.text;
    u.final = more.final;
  }
  EXPECT_EQ(u.text, "end");
  ASSERT_TRUE(u.final);
  EXPECT_EQ(u.final->finish_reason, FinishReason::kLength);
}

class StreamRendererTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HW_REQUIRE_MODEL(testing::SmolLm2Path());
    auto gguf = GgufFile::Open(testing::SmolLm2Path());
    ASSERT_TRUE(gguf.ok());
    auto t = Tokenizer::FromGguf(**gguf);
    ASSERT_TRUE(t.ok());
    tokenizer_ = std::move(t).value();
  }
  static OutputStream::Update Text(std::string text, std::vector<GeneratedToken> tokens = {}) {
    OutputStream::Update u;
    u.text = std::move(text);
    u.tokens = std::move(tokens);
    return u;
  }
  static OutputStream::Update Final(std::string text, CompletionOutcome o) {
    OutputStream::Update u;
    u.text = std::move(text);
    u.final = std::move(o);
    return u;
  }
  static std::vector<json> Events(const std::string& sse) {
    auto events = ParseSse(sse);
    EXPECT_TRUE(events.ok()) << events.status().ToString();
    std::vector<json> out;
    for (const std::string& e : *events) out.push_back(e == "[DONE]" ? json("[DONE]") : json::parse(e));
    return out;
  }
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(StreamRendererTest, ChatChunksUsageAndDone) {
  StreamRenderer r(StreamKind::kChat, {"chatcmpl-1", 42, "m"}, /*include_usage=*/true,
                   /*logprobs=*/false, *tokenizer_);
  std::string sse = r.Render(Text("Hel"));
  sse += r.Render(Text(""));  // nothing new: nothing sent
  sse += r.Render(Text("lo"));
  CompletionOutcome o;
  o.finish_reason = FinishReason::kStop;
  o.stop_reason = "!";
  o.num_prompt_tokens = 7;
  o.num_output_tokens = 3;
  o.num_cached_tokens = 4;
  sse += r.Render(Final("", o));
  EXPECT_TRUE(r.done());
  EXPECT_EQ(r.Render(Text("late")), "");
  std::vector<json> ev = Events(sse);
  ASSERT_EQ(ev.size(), 6u) << sse;
  EXPECT_EQ(ev[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(ev[0]["id"], "chatcmpl-1");
  EXPECT_EQ(ev[0]["created"], 42);
  EXPECT_EQ(ev[0]["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(ev[0]["usage"].is_null());
  EXPECT_EQ(ev[1]["choices"][0]["delta"]["content"], "Hel");
  EXPECT_TRUE(ev[1]["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(ev[2]["choices"][0]["delta"]["content"], "lo");
  EXPECT_EQ(ev[3]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(ev[3]["choices"][0]["stop_reason"], "!");
  EXPECT_EQ(ev[3]["choices"][0]["delta"], json::object());
  EXPECT_TRUE(ev[4]["choices"].empty());
  EXPECT_EQ(ev[4]["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(ev[4]["usage"]["completion_tokens"], 3);
  EXPECT_EQ(ev[4]["usage"]["total_tokens"], 10);
  EXPECT_EQ(ev[4]["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(ev[5], "[DONE]");
}

TEST_F(StreamRendererTest, CompletionChunksWithLogprobs) {
  int32_t a = tokenizer_->Encode("a", false)[0];
  int32_t b = tokenizer_->Encode("b", false)[0];
  StreamRenderer r(StreamKind::kCompletion, {"cmpl-1", 1, "m"}, false, true, *tokenizer_);
  std::string sse = r.Render(Text("a", {GeneratedToken{a, -0.5f, {{a, -0.5f}, {b, -1.5f}}}}));
  CompletionOutcome o;
  o.finish_reason = FinishReason::kLength;
  OutputStream::Update last = Final("b", o);
  last.tokens = {GeneratedToken{b, -0.25f, {{b, -0.25f}, {a, -2.0f}}}};
  sse += r.Render(last);
  std::vector<json> ev = Events(sse);
  ASSERT_EQ(ev.size(), 3u) << sse;
  EXPECT_EQ(ev[0]["object"], "text_completion");
  EXPECT_FALSE(ev[0].contains("usage"));
  const json& lp = ev[0]["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json::array({"a"}));
  EXPECT_FLOAT_EQ(lp["token_logprobs"][0].get<float>(), -0.5f);
  EXPECT_FLOAT_EQ(lp["top_logprobs"][0]["b"].get<float>(), -1.5f);
  EXPECT_EQ(lp["text_offset"], json::array({0}));
  EXPECT_EQ(ev[1]["choices"][0]["text"], "b");
  EXPECT_EQ(ev[1]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(ev[1]["choices"][0]["logprobs"]["text_offset"], json::array({1}));
  EXPECT_EQ(ev[2], "[DONE]");
}

TEST_F(StreamRendererTest, SeveralChoicesEndTogether) {
  // Two prompts, n = 2: four choices; usage counts each prompt once.
  StreamRenderer r(StreamKind::kCompletion, {"cmpl-1", 1, "m"}, true, false, *tokenizer_, 4, 2);
  std::string sse = r.Render(2, Text("c"));
  sse += r.Render(0, Text("a"));
  CompletionOutcome o;
  o.finish_reason = FinishReason::kLength;
  o.num_output_tokens = 1;
  for (int i : {3, 1, 0}) {
    o.num_prompt_tokens = i < 2 ? 5 : 7;
    o.num_cached_tokens = i % 2 == 0 ? 0 : 4;
    sse += r.Render(i, Final("", o));
    EXPECT_FALSE(r.done());
  }
  EXPECT_EQ(r.Render(3, Text("late")), "");  // that choice has finished
  o.num_prompt_tokens = 7;
  o.num_cached_tokens = 0;
  sse += r.Render(2, Final("", o));
  EXPECT_TRUE(r.done());
  std::vector<json> ev = Events(sse);
  ASSERT_EQ(ev.size(), 8u) << sse;
  EXPECT_EQ(ev[0]["choices"][0]["index"], 2);
  EXPECT_EQ(ev[0]["choices"][0]["text"], "c");
  EXPECT_EQ(ev[1]["choices"][0]["index"], 0);
  EXPECT_EQ(ev[2]["choices"][0]["index"], 3);
  EXPECT_EQ(ev[2]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(ev[5]["choices"][0]["index"], 2);
  EXPECT_EQ(ev[6]["usage"]["prompt_tokens"], 12);
  EXPECT_EQ(ev[6]["usage"]["completion_tokens"], 4);
  EXPECT_EQ(ev[6]["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(ev[7], "[DONE]");
}

// With echo, each choice's first chunk is its prompt: text, logprobs
// (token 0 null) and prompt_logprobs, those of choice i*n for all its
// prompt's choices; the generated tokens' offsets follow the prompt's.
TEST_F(StreamRendererTest, EchoedPromptComesFirst) {
  int32_t a = tokenizer_->Encode("a", false)[0];
  int32_t b = tokenizer_->Encode("b", false)[0];
  PromptEcho echo{true, {"ab"}, {a}, 1};
  StreamRenderer r(StreamKind::kCompletion, {"cmpl-1", 1, "m"}, false, true, *tokenizer_, 2, 2,
                   echo);
  // Nothing can be said before the prompt logprobs arrive.
  EXPECT_EQ(r.Render(0, Text("")), "");
  OutputStream::Update first = Text("a", {GeneratedToken{a, -0.5f, {}}});
  first.prompt_logprobs = {GeneratedToken{b, -3.0f, {{a, -0.1f}}, 7}};
  std::string sse = r.Render(0, first);
  sse += r.Render(1, Text("b", {GeneratedToken{b, -0.7f, {}}}));
  std::vector<json> ev = Events(sse);
  ASSERT_EQ(ev.size(), 4u) << sse;
  for (int c : {0, 1}) {
    const json& prompt = ev[size_t(2 * c)]["choices"][0];
    EXPECT_EQ(prompt["index"], c);
    EXPECT_EQ(prompt["text"], "ab");
    EXPECT_EQ(prompt["logprobs"]["tokens"], json::array({"a", "b"}));
    EXPECT_TRUE(prompt["logprobs"]["token_logprobs"][0].is_null());
    EXPECT_FLOAT_EQ(prompt["logprobs"]["token_logprobs"][1].get<float>(), -3.0f);
    EXPECT_EQ(prompt["prompt_logprobs"][1][std::to_string(b)]["rank"], 7);
    EXPECT_EQ(prompt["prompt_logprobs"][1].size(), 2u);
    const json& generated = ev[size_t(2 * c + 1)]["choices"][0];
    EXPECT_FALSE(generated.contains("prompt_logprobs"));
    EXPECT_EQ(generated["logprobs"]["text_offset"], json::array({2}));
  }
}

TEST_F(StreamRendererTest, ErrorMidStream) {
  StreamRenderer r(StreamKind::kCompletion, {"cmpl-1", 1, "m"}, true, false, *tokenizer_);
  CompletionOutcome o;
  o.status = Status::Unavailable("instance 0 is down");
  std::string sse = r.Render(Text("x"));
  sse += r.Render(Final("", o));
  std::vector<json> ev = Events(sse);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[1]["error"]["message"], "instance 0 is down");
  EXPECT_EQ(ev[1]["error"]["code"], 503);
  EXPECT_EQ(ev[2], "[DONE]");
}

}  // namespace
}  // namespace headway
