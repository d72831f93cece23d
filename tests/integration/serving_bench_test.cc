// headway-bench against a fake OpenAI server run by this test: the fake
// streams deterministic SSE for /v1/completions and /v1/chat/completions,
// records what it was sent, and fails chosen requests; the test checks the
// requests, the result JSON's fields and counts, and the exit codes.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/support/test_env.h"

namespace headway {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

constexpr char kFakeModel[] = "org/fake-model";
// The fake counts a chat prompt as its words plus this many template tokens.
constexpr int kChatTemplateTokens = 10;

struct FakeServerOptions {
  bool send_usage = true;
  // Request numbers (0-based, in arrival order) that fail, and how.
  std::set<int> http_500;
  std::set<int> no_done;      // stream ends without data: [DONE]
  std::set<int> error_event;  // an `error` event mid-stream
};

struct SeenRequest {
  std::string path;
  std::string authorization;
  json body;
};

// An OpenAI-compatible server on 127.0.0.1 that streams max_tokens content
// chunks " t0", " t1", ... per request.
class FakeOpenAiServer {
 public:
  explicit FakeOpenAiServer(FakeServerOptions options) : options_(std::move(options)) {
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      json body = {{"object", "list"},
                   {"data", json::array({{{"id", kFakeModel}, {"object", "model"}}})}};
      res.set_content(body.dump(), "application/json");
    });
    for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
      server_.Post(path, [this](const httplib::Request& req, httplib::Response& res) {
        Handle(req, res);
      });
    }
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (port_ > 0 && !server_.is_running()) std::this_thread::sleep_for(1ms);
  }
  ~FakeOpenAiServer() {
    server_.stop();
    thread_.join();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int peak_in_flight() const { return peak_in_flight_; }
  std::vector<SeenRequest> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  void Handle(const httplib::Request& req, httplib::Response& res) {
    json body = json::parse(req.body, nullptr, false);
    int number;
    {
      std::lock_guard<std::mutex> lock(mu_);
      number = int(requests_.size());
      requests_.push_back({req.path, req.get_header_value("Authorization"), body});
    }
    int now = ++in_flight_;
    int peak = peak_in_flight_;
    while (now > peak && !peak_in_flight_.compare_exchange_weak(peak, now)) {
    }
    if (options_.http_500.count(number)) {
      --in_flight_;
      res.status = 500;
      json error = {{"error",
                     {{"message", "fake failure"}, {"type", "InternalServerError"},
                      {"param", nullptr}, {"code", 500}}}};
      res.set_content(error.dump(), "application/json");
      return;
    }
    const bool chat = req.path == "/v1/chat/completions";
    const int max_tokens = body.value("max_tokens", 1);
    int prompt_tokens = 0;
    if (chat) {
      std::string text = body["messages"][0]["content"];
      prompt_tokens = int(std::count(text.begin(), text.end(), ' ')) + 1 + kChatTemplateTokens;
    } else {
      prompt_tokens = int(body["prompt"].size());
    }
    const bool usage = options_.send_usage && body["stream_options"].value("include_usage", false);
    const bool no_done = options_.no_done.count(number) > 0;
    const bool error_event = options_.error_event.count(number) > 0;
    res.set_chunked_content_provider(
        "text/event-stream", [=, this](size_t, httplib::DataSink& sink) {
          auto send = [&](const std::string& data) {
            std::string event = "data: " + data + "\n\n";
            sink.write(event.data(), event.size());
          };
          const std::string object = chat ? "chat.completion.chunk" : "text_completion";
          auto chunk = [&](json choices) {
            return json{{"id", "cmpl-fake"}, {"object", object}, {"created", 0},
                        {"model", kFakeModel}, {"choices", std::move(choices)}};
          };
          if (chat) {
            send(chunk(json::array({{{"index", 0},
                                     {"delta", {{"role", "assistant"}, {"content", ""}}},
                                     {"finish_reason", nullptr}}}))
                     .dump());
          }
          for (int i = 0; i < max_tokens; ++i) {
            std::this_thread::sleep_for(2ms);
            if (error_event && i == 1) {
              --in_flight_;
              send(json{{"error", {{"message", "fake mid-stream error"}, {"code", 500}}}}.dump());
              sink.done();
              return true;
            }
            std::string piece = " t" + std::to_string(i);
            json finish = i + 1 == max_tokens ? json("length") : json(nullptr);
            json choice = chat ? json{{"index", 0}, {"delta", {{"content", piece}}},
                                      {"finish_reason", finish}}
                               : json{{"index", 0}, {"text", piece}, {"logprobs", nullptr},
                                      {"finish_reason", finish}};
            send(chunk(json::array({choice})).dump());
          }
          if (usage) {
            json last = chunk(json::array());
            last["usage"] = {{"prompt_tokens", prompt_tokens},
                             {"completion_tokens", max_tokens},
                             {"total_tokens", prompt_tokens + max_tokens}};
            send(last.dump());
          }
          // Leave the in-flight count before the client can see the end, so
          // its next request cannot overlap this one in the count.
          --in_flight_;
          if (!no_done) send("[DONE]");
          sink.done();
          return true;
        });
  }

  const FakeServerOptions options_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<int> in_flight_{0};
  std::atomic<int> peak_in_flight_{0};
  mutable std::mutex mu_;
  std::vector<SeenRequest> requests_;  // guarded by mu_
};

struct BenchRun {
  int exit_code = -1;
  std::string log;
  json result;  // null unless a result file was written
};

// Runs headway-bench with `args`, OPENAI_API_KEY set to `api_key` (unset
// when empty), writing its JSON into a fresh directory.
BenchRun RunBench(std::vector<std::string> args, const std::string& api_key = "") {
  std::string dir = testing::MakeTempDir("headway_bench");
  std::string result_path = dir + "/result.json";
  std::vector<std::string> argv = {"/usr/bin/env", "-u", "OPENAI_API_KEY"};
  if (!api_key.empty()) argv.push_back("OPENAI_API_KEY=" + api_key);
  argv.push_back(testing::BinaryPath("headway-bench"));
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--result-filename");
  argv.push_back(result_path);
  testing::ChildProcess child(argv, dir + "/bench.log");
  BenchRun run;
  int status = child.WaitExit(60s);
  run.log = child.Log();
  if (status != -1 && WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  if (fs::exists(result_path)) {
    std::ifstream in(result_path);
    run.result = json::parse(in, nullptr, false);
  }
  return run;
}

class ServingBenchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(testing::BinaryPath("headway-bench"))) {
      GTEST_SKIP() << "headway-bench is not built at " << testing::BinaryPath("headway-bench");
    }
  }
};

void ExpectVllmMetricFields(const json& r) {
  for (const char* key : {"date", "backend", "model_id", "num_prompts", "request_rate",
                          "max_concurrency", "duration", "completed", "failed",
                          "total_input_tokens", "total_output_tokens", "request_throughput",
                          "output_throughput", "total_token_throughput", "input_lens",
                          "output_lens", "ttfts", "itls", "errors", "generated_texts"}) {
    EXPECT_TRUE(r.contains(key)) << key;
  }
  for (const char* metric : {"ttft", "tpot", "itl", "e2el"}) {
    for (const char* stat : {"mean", "median", "std", "p99"}) {
      std::string key = std::string(stat) + "_" + metric + "_ms";
      ASSERT_TRUE(r.contains(key)) << key;
      EXPECT_TRUE(r[key].is_number()) << key;
      EXPECT_GE(r[key].get<double>(), 0.0) << key;
    }
  }
}

TEST_F(ServingBenchTest, CompletionsStreamMeasuredWithVllmFields) {
  FakeOpenAiServer server({});
  BenchRun run = RunBench({"--base-url", server.url(), "--num-prompts", "8", "--random-input-len",
                           "32", "--random-prefix-len", "16", "--random-output-len", "5",
                           "--max-concurrency", "2", "--ignore-eos", "--seed", "7"},
                          "secret-key");
  ASSERT_EQ(run.exit_code, 0) << run.log;
  EXPECT_NE(run.log.find("============ Serving Benchmark Result ============"), std::string::npos)
      << run.log;
  const json& r = run.result;
  ASSERT_TRUE(r.is_object()) << run.log;
  ExpectVllmMetricFields(r);
  EXPECT_EQ(r["backend"], "headway");
  EXPECT_EQ(r["model_id"], kFakeModel);
  EXPECT_EQ(r["num_prompts"], 8);
  EXPECT_EQ(r["request_rate"], "inf");
  EXPECT_EQ(r["max_concurrency"], 2);
  EXPECT_EQ(r["completed"], 8);
  EXPECT_EQ(r["failed"], 0);
  EXPECT_EQ(r["total_input_tokens"], 8 * 48);
  EXPECT_EQ(r["total_output_tokens"], 8 * 5);
  EXPECT_EQ(r["input_lens"], json(std::vector<int>(8, 48)));
  EXPECT_EQ(r["output_lens"], json(std::vector<int>(8, 5)));
  ASSERT_EQ(r["ttfts"].size(), 8u);
  ASSERT_EQ(r["itls"].size(), 8u);
  for (const json& itl : r["itls"]) EXPECT_EQ(itl.size(), 4u);
  for (const json& ttft : r["ttfts"]) EXPECT_GT(ttft.get<double>(), 0.0);
  for (const json& error : r["errors"]) EXPECT_EQ(error, "");
  for (const json& text : r["generated_texts"]) EXPECT_EQ(text, " t0 t1 t2 t3 t4");
  double duration = r["duration"];
  EXPECT_GT(duration, 0.0);
  EXPECT_NEAR(r["request_throughput"].get<double>(), 8 / duration, 1e-6);
  EXPECT_NEAR(r["output_throughput"].get<double>(), 40 / duration, 1e-6);
  EXPECT_NEAR(r["total_token_throughput"].get<double>(), (8 * 48 + 40) / duration, 1e-6);
  // Five chunks 2 ms apart: every gap is at least 2 ms, TPOT too.
  EXPECT_GE(r["mean_itl_ms"].get<double>(), 1.9);
  EXPECT_GE(r["mean_tpot_ms"].get<double>(), 1.9);
  EXPECT_GE(r["mean_e2el_ms"].get<double>(), r["mean_ttft_ms"].get<double>());

  std::vector<SeenRequest> seen = server.requests();
  ASSERT_EQ(seen.size(), 8u);
  EXPECT_LE(server.peak_in_flight(), 2);
  std::set<std::vector<int>> distinct_tails;
  for (const SeenRequest& s : seen) {
    EXPECT_EQ(s.path, "/v1/completions");
    EXPECT_EQ(s.authorization, "Bearer secret-key");
    const json& b = s.body;
    EXPECT_EQ(b["model"], kFakeModel);
    EXPECT_EQ(b["stream"], true);
    EXPECT_EQ(b["stream_options"]["include_usage"], true);
    EXPECT_EQ(b["max_tokens"], 5);
    EXPECT_EQ(b["ignore_eos"], true);
    EXPECT_EQ(b["temperature"], 0.0);
    std::vector<int> ids = b["prompt"];
    ASSERT_EQ(ids.size(), 48u);
    for (int id : ids) {
      EXPECT_GE(id, 1000);
      EXPECT_LT(id, 40000);
    }
    // The shared prefix is the same in every prompt; the rest differs.
    std::vector<int> first_prefix = seen[0].body["prompt"];
    EXPECT_TRUE(std::equal(ids.begin(), ids.begin() + 16, first_prefix.begin()));
    distinct_tails.insert(std::vector<int>(ids.begin() + 16, ids.end()));
  }
  EXPECT_EQ(distinct_tails.size(), 8u);
}

TEST_F(ServingBenchTest, ChatCompletionsWithoutUsageCountsChunks) {
  FakeServerOptions options;
  options.send_usage = false;
  FakeOpenAiServer server(options);
  BenchRun run = RunBench({"--base-url", server.url(), "--endpoint", "/v1/chat/completions",
                           "--num-prompts", "3", "--random-input-len", "10",
                           "--random-output-len", "4", "--model", "chosen-model",
                           "--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,99.9"});
  ASSERT_EQ(run.exit_code, 0) << run.log;
  const json& r = run.result;
  ASSERT_TRUE(r.is_object()) << run.log;
  EXPECT_EQ(r["model_id"], "chosen-model");
  EXPECT_EQ(r["completed"], 3);
  // No usage chunk: the intended prompt length and the content chunks count.
  EXPECT_EQ(r["input_lens"], json(std::vector<int>(3, 10)));
  EXPECT_EQ(r["output_lens"], json(std::vector<int>(3, 4)));
  // The empty role chunk is not a token: three gaps after the first content.
  for (const json& itl : r["itls"]) EXPECT_EQ(itl.size(), 3u);
  EXPECT_TRUE(r.contains("p50_ttft_ms"));
  EXPECT_TRUE(r.contains("p99.9_itl_ms"));
  EXPECT_FALSE(r.contains("mean_tpot_ms"));
  EXPECT_FALSE(r.contains("p99_ttft_ms"));
  for (const SeenRequest& s : server.requests()) {
    EXPECT_EQ(s.path, "/v1/chat/completions");
    EXPECT_EQ(s.authorization, "");
    EXPECT_EQ(s.body["model"], "chosen-model");
    ASSERT_TRUE(s.body["messages"].is_array());
    EXPECT_EQ(s.body["messages"][0]["role"], "user");
    std::string text = s.body["messages"][0]["content"];
    EXPECT_EQ(std::count(text.begin(), text.end(), ' '), 9);
    EXPECT_EQ(s.body["ignore_eos"], false);
  }
}

TEST_F(ServingBenchTest, ChatUsageGivesServerPromptLength) {
  FakeOpenAiServer server({});
  BenchRun run = RunBench({"--base-url", server.url(), "--endpoint", "/v1/chat/completions",
                           "--num-prompts", "2", "--random-input-len", "6",
                           "--random-prefix-len", "4", "--random-output-len", "3"});
  ASSERT_EQ(run.exit_code, 0) << run.log;
  EXPECT_EQ(run.result["input_lens"], json(std::vector<int>(2, 10 + kChatTemplateTokens)));
  EXPECT_EQ(run.result["total_output_tokens"], 6);
}

TEST_F(ServingBenchTest, FailedRequestsAreCountedNotFatal) {
  FakeServerOptions options;
  options.http_500 = {1};
  options.no_done = {4};
  options.error_event = {6};
  FakeOpenAiServer server(options);
  BenchRun run = RunBench({"--base-url", server.url(), "--num-prompts", "9", "--random-input-len",
                           "8", "--random-output-len", "3", "--max-concurrency", "1"});
  ASSERT_EQ(run.exit_code, 0) << run.log;
  const json& r = run.result;
  ASSERT_TRUE(r.is_object()) << run.log;
  EXPECT_EQ(r["completed"], 6);
  EXPECT_EQ(r["failed"], 3);
  EXPECT_EQ(r["total_output_tokens"], 18);
  EXPECT_EQ(r["total_input_tokens"], 48);
  ASSERT_EQ(r["errors"].size(), 9u);
  // With one request in flight, request i is the fake's request number i.
  EXPECT_NE(r["errors"][1].get<std::string>().find("HTTP 500: fake failure"), std::string::npos);
  EXPECT_NE(r["errors"][4].get<std::string>().find("[DONE]"), std::string::npos);
  EXPECT_NE(r["errors"][6].get<std::string>().find("fake mid-stream error"), std::string::npos);
  for (int i : {0, 2, 3, 5, 7, 8}) EXPECT_EQ(r["errors"][i], "") << i;
  EXPECT_EQ(r["output_lens"][1], 0);
  EXPECT_EQ(r["error_samples"].size(), 3u);
  EXPECT_TRUE(std::regex_search(run.log, std::regex("Failed requests: +3 *\n"))) << run.log;
  EXPECT_LE(server.peak_in_flight(), 1);
}

TEST_F(ServingBenchTest, SeedFixesPromptsAndPoissonRateRuns) {
  auto prompts_of = [](const FakeOpenAiServer& server) {
    std::vector<json> prompts;
    for (const SeenRequest& s : server.requests()) prompts.push_back(s.body["prompt"]);
    std::sort(prompts.begin(), prompts.end());
    return prompts;
  };
  std::vector<std::string> args = {"--num-prompts", "6", "--random-input-len", "12",
                                   "--random-output-len", "2", "--request-rate", "200"};
  FakeOpenAiServer a({}), b({}), c({});
  auto with = [&](const FakeOpenAiServer& s, const char* seed) {
    std::vector<std::string> v = args;
    v.insert(v.end(), {"--base-url", s.url(), "--seed", seed});
    return v;
  };
  BenchRun run_a = RunBench(with(a, "3"));
  BenchRun run_b = RunBench(with(b, "3"));
  BenchRun run_c = RunBench(with(c, "4"));
  for (const BenchRun* run : {&run_a, &run_b, &run_c}) {
    ASSERT_EQ(run->exit_code, 0) << run->log;
    EXPECT_EQ(run->result["completed"], 6);
    EXPECT_EQ(run->result["request_rate"], 200.0);
    EXPECT_EQ(run->result["max_concurrency"], nullptr);
  }
  EXPECT_EQ(prompts_of(a), prompts_of(b));
  EXPECT_NE(prompts_of(a), prompts_of(c));
}

TEST_F(ServingBenchTest, BadFlagsAndUnreachableServerExitNonZero) {
  BenchRun bad = RunBench({"--num-prompts", "0"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.log.find("--num-prompts"), std::string::npos) << bad.log;
  EXPECT_NE(RunBench({"--percentile-metrics", "ttft,nope"}).exit_code, 0);
  EXPECT_NE(RunBench({"--request-rate", "-1"}).exit_code, 0);
  EXPECT_NE(RunBench({"--base-url", "https://example.com"}).exit_code, 0);

  std::string nobody = "http://127.0.0.1:" + std::to_string(testing::FreePort());
  BenchRun unreachable = RunBench({"--base-url", nobody, "--num-prompts", "2"});
  EXPECT_NE(unreachable.exit_code, 0);
  EXPECT_NE(unreachable.exit_code, -1) << "timed out";
  EXPECT_NE(unreachable.log.find("cannot reach"), std::string::npos) << unreachable.log;
  EXPECT_TRUE(unreachable.result.is_null());
}

}  // namespace
}  // namespace headway
