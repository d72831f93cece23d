// The real headway-coordinator process against a fake worker implemented
// here: a DEALER that speaks proto/control.proto, answers every step with
// the token of "a", and checks that the block-table deltas it receives are
// consistent (appended at the end of each row, never a block owned by two
// sequences, rows covering every computed position).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/control_channel.h"
#include "common/gguf.h"
#include "common/model_spec.h"
#include "coordinator/tokenizer.h"
#include "tests/support/process.h"
#include "tests/support/test_env.h"

namespace headway {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 3000;
constexpr int kMaxModelLen = 256;
constexpr int kHeartbeatTimeoutMs = 1000;

struct FakeWorkerOptions {
  std::string address;
  ModelSpec spec;
  int32_t token_id = 0;           // answered for every sampled sequence
  int silent_after_plans = -1;    // >= 0: stop all traffic after this many plans
};

class FakeWorker {
 public:
  explicit FakeWorker(FakeWorkerOptions options) : options_(std::move(options)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~FakeWorker() {
    stop_ = true;
    thread_.join();
  }

  bool registered() const { return registered_; }
  bool got_shutdown() const { return got_shutdown_; }
  int num_plans() const { return num_plans_; }
  void GoSilent() { silent_ = true; }
  std::vector<std::string> errors() const {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_;
  }
  size_t num_live_sequences() const {
    std::lock_guard<std::mutex> lock(mu_);
    return seqs_.size();
  }

 private:
  struct Seq {
    std::vector<std::vector<int32_t>> rows;  // [slot][logical]
    int num_positions = 0;
  };

  void Error(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu_);
    errors_.push_back(e);
  }

  void Run() {
    auto client = ControlClient::Connect(options_.address, PeerName(0, 0));
    if (!client.ok()) return Error(client.status().ToString());
    const ModelSpec& spec = options_.spec;
    proto::Envelope reg;
    proto::RegisterRequest* r = reg.mutable_register_request();
    r->set_instance_id(0);
    r->set_tp_rank(0);
    r->set_tp_size(1);
    r->set_model_name(spec.name);
    r->set_num_layers(spec.num_layers);
    r->set_num_local_kv_heads(spec.num_kv_heads);
    r->set_head_dim(spec.head_dim);
    r->set_block_size(kBlockSize);
    r->set_block_bytes(uint64_t(2) * kBlockSize * spec.head_dim * 4);
    r->set_num_blocks(kNumBlocks);
    r->set_vocab_size(spec.vocab_size);
    r->set_pid(getpid());
    if (!(*client)->Send(reg).ok()) return Error("cannot send RegisterRequest");
    Clock::time_point last_sent = Clock::now();
    while (!stop_) {
      if (!silent_ && Clock::now() - last_sent > milliseconds(100)) {
        proto::Envelope hb;
        hb.mutable_heartbeat()->set_sent_unix_ms(0);
        (void)(*client)->Send(hb);
        last_sent = Clock::now();
      }
      std::optional<proto::Envelope> env = (*client)->Receive(milliseconds(10));
      if (!env || silent_) continue;
      if (env->has_register_response()) {
        if (!env->register_response().accepted()) Error("rejected: " + env->register_response().error());
        registered_ = env->register_response().accepted();
      } else if (env->has_shutdown()) {
        got_shutdown_ = true;
      } else if (env->has_step_plan()) {
        if (options_.silent_after_plans >= 0 && num_plans_ >= options_.silent_after_plans) {
          silent_ = true;
          continue;
        }
        ++num_plans_;
        proto::Envelope reply;
        *reply.mutable_step_result() = Apply(env->step_plan());
        if (!(*client)->Send(reply).ok()) Error("cannot send StepResult");
        last_sent = Clock::now();
      }
    }
  }

  proto::StepResult Apply(const proto::StepPlan& plan) {
    std::lock_guard<std::mutex> lock(mu_);
    auto error = [&](const std::string& e) {
      errors_.push_back("step " + std::to_string(plan.step_id()) + ": " + e);
    };
    if (plan.step_id() <= last_step_id_) error("step_id did not increase");
    last_step_id_ = plan.step_id();
    for (uint64_t id : plan.released_seq_ids()) {
      auto it = seqs_.find(id);
      if (it == seqs_.end()) {
        error("release of unknown sequence " + std::to_string(id));
        continue;
      }
      for (const auto& row : it->second.rows) {
        for (int32_t b : row) used_blocks_.erase(b);
      }
      seqs_.erase(it);
    }
    const int num_slots = options_.spec.num_layers * options_.spec.num_kv_heads;
    proto::StepResult result;
    result.set_step_id(plan.step_id());
    result.set_tp_rank(0);
    for (const proto::SequenceStep& step : plan.seqs()) {
      std::string who = "seq " + std::to_string(step.seq_id()) + ": ";
      bool known = seqs_.count(step.seq_id()) > 0;
      if (step.is_new() == known) error(who + "is_new disagrees with the worker's state");
      Seq& seq = seqs_[step.seq_id()];
      if (seq.rows.empty()) seq.rows.resize(num_slots);
      if (int(step.start_pos()) != seq.num_positions) {
        error(who + "start_pos " + std::to_string(step.start_pos()) + " but " +
              std::to_string(seq.num_positions) + " computed");
      }
      if (step.token_ids().empty()) error(who + "no tokens");
      for (const proto::SlotDelta& d : step.deltas()) {
        if (int(d.slot()) >= num_slots) {
          error(who + "slot out of range");
          continue;
        }
        auto& row = seq.rows[d.slot()];
        if (d.first_logical() != row.size()) error(who + "delta does not append at the row's end");
        for (int32_t b : d.appended()) {
          if (b < 0 || b >= kNumBlocks) error(who + "block id out of range");
          if (!used_blocks_.insert(b).second) error(who + "block " + std::to_string(b) + " already in use");
          row.push_back(b);
        }
      }
      seq.num_positions = int(step.start_pos()) + step.token_ids_size();
      for (const auto& row : seq.rows) {
        if (int(row.size()) * kBlockSize < seq.num_positions) error(who + "row does not cover the positions");
      }
      if (step.sample()) {
        proto::SampledToken* t = result.add_tokens();
        t->set_seq_id(step.seq_id());
        t->set_token_id(options_.token_id);
      }
    }
    return result;
  }

  const FakeWorkerOptions options_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> silent_{false};
  std::atomic<bool> registered_{false};
  std::atomic<bool> got_shutdown_{false};
  std::atomic<int> num_plans_{0};
  mutable std::mutex mu_;
  std::vector<std::string> errors_;
  std::map<uint64_t, Seq> seqs_;
  std::set<int32_t> used_blocks_;
  uint64_t last_step_id_ = 0;
};

struct Reply {
  int status = 0;
  json body;
};

class CoordinatorFakeWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_path_ = testing::SmolLm2Path();
    HW_REQUIRE_MODEL(model_path_);
    auto gguf = GgufFile::Open(model_path_);
    ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
    auto spec = LoadModelSpec(**gguf);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    spec_ = *spec;
    auto tokenizer = Tokenizer::FromGguf(**gguf);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
    tokenizer_ = std::move(tokenizer).value();
    std::vector<int32_t> a = tokenizer_->Encode("a", false);
    ASSERT_EQ(a.size(), 1u);
    token_a_ = a[0];

    dir_ = testing::MakeTempDir("coordinator-fake-worker");
    http_port_ = testing::FreePort();
    control_address_ = "tcp://127.0.0.1:" + std::to_string(testing::FreePort());
    std::string config = dir_ + "/deploy.yaml";
    std::ofstream(config) << "model:\n  path: " << model_path_ << "\n  served_name: smollm2\n"
                          << "coordinator:\n  http_host: 127.0.0.1\n  http_port: 1\n"
                          << "  heartbeat_interval_ms: 100\n  heartbeat_timeout_ms: "
                          << kHeartbeatTimeoutMs << "\n"
                          << "cache:\n  block_size: " << kBlockSize << "\n  kv_memory_mb: 64\n"
                          << "scheduler:\n  max_num_seqs: 8\n  max_num_batched_tokens: 64\n"
                          << "  max_model_len: " << kMaxModelLen << "\n"
                          << "pools:\n  - name: main\n    role: mixed\n    instances:\n"
                          << "      - tp_size: 1\n        device: cpu\n";
    coordinator_ = std::make_unique<testing::ChildProcess>(
        std::vector<std::string>{testing::BinaryPath("headway-coordinator"), "--config", config,
                                 "--http-port", std::to_string(http_port_),
                                 "--control-address", control_address_},
        dir_ + "/coordinator.log");
    ASSERT_GT(coordinator_->pid(), 0);
  }

  void TearDown() override {
    worker_.reset();
    if (coordinator_) coordinator_->Stop();
    if (HasFailure() && coordinator_) std::cerr << "coordinator log:\n" << coordinator_->Log();
  }

  void StartWorker(int silent_after_plans = -1) {
    worker_ = std::make_unique<FakeWorker>(
        FakeWorkerOptions{control_address_, spec_, token_a_, silent_after_plans});
  }

  // Waits for /health == `status`.
  bool WaitHealth(int status, milliseconds timeout = milliseconds(30000)) {
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (!coordinator_->Running()) return false;
      if (Get("/health").status == status) return true;
      std::this_thread::sleep_for(milliseconds(50));
    }
    return false;
  }

  Reply Get(const std::string& path) const {
    httplib::Client client("127.0.0.1", http_port_);
    client.set_read_timeout(60, 0);
    return ToReply(client.Get(path.c_str()));
  }

  Reply Post(const std::string& body) const {
    httplib::Client client("127.0.0.1", http_port_);
    client.set_read_timeout(60, 0);
    return ToReply(client.Post("/v1/completions", body, "application/json"));
  }

  static Reply ToReply(const httplib::Result& r) {
    Reply reply;
    if (!r) return reply;
    reply.status = r->status;
    reply.body = json::parse(r->body, nullptr, false);
    return reply;
  }

  // Free blocks of instance 0 rank 0 from /health; -1 if unreadable.
  int FreeBlocks() const {
    Reply r = Get("/health");
    try {
      return r.body.at("instances").at(0).at("ranks").at(0).at("free_blocks").get<int>();
    } catch (...) {
      return -1;
    }
  }

  void ExpectError(const Reply& r, int status, const std::string& fragment) {
    EXPECT_EQ(r.status, status) << r.body.dump();
    ASSERT_TRUE(r.body.is_object()) << r.body.dump();
    ASSERT_TRUE(r.body.contains("error")) << r.body.dump();
    const json& e = r.body["error"];
    EXPECT_TRUE(e.contains("message") && e.contains("type") && e.contains("param") &&
                e.contains("code"))
        << e.dump();
    EXPECT_NE(e.value("message", "").find(fragment), std::string::npos) << e.dump();
  }

  std::string model_path_;
  ModelSpec spec_;
  std::unique_ptr<Tokenizer> tokenizer_;
  int32_t token_a_ = 0;
  std::string dir_;
  int http_port_ = 0;
  std::string control_address_;
  std::unique_ptr<testing::ChildProcess> coordinator_;
  std::unique_ptr<FakeWorker> worker_;
};

TEST_F(CoordinatorFakeWorkerTest, CompletionsRunAndBlocksComeBack) {
  // Not ready before a worker registers.
  ASSERT_TRUE(WaitHealth(503));
  Reply health = Get("/health");
  EXPECT_EQ(health.body["status"], "unavailable");
  StartWorker();
  ASSERT_TRUE(WaitHealth(200)) << "the fake worker never made the instance ready";
  EXPECT_TRUE(worker_->registered());
  const int free_at_start = FreeBlocks();
  EXPECT_EQ(free_at_start, kNumBlocks);

  Reply models = Get("/v1/models");
  EXPECT_EQ(models.status, 200);
  EXPECT_EQ(models.body["object"], "list");
  EXPECT_EQ(models.body["data"][0]["id"], "smollm2");
  EXPECT_EQ(models.body["data"][0]["max_model_len"], kMaxModelLen);

  int prompt_tokens = int(tokenizer_->Encode("Hello, my name is", true).size());
  Reply r = Post(R"({"model": "smollm2", "prompt": "Hello, my name is", "max_tokens": 5})");
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(r.body["object"], "text_completion");
  EXPECT_EQ(r.body["model"], "smollm2");
  EXPECT_EQ(r.body["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_TRUE(r.body["created"].is_number_integer());
  ASSERT_EQ(r.body["choices"].size(), 1u);
  EXPECT_EQ(r.body["choices"][0]["index"], 0);
  EXPECT_EQ(r.body["choices"][0]["text"], "aaaaa");
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(r.body["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 5);
  EXPECT_EQ(r.body["usage"]["total_tokens"], prompt_tokens + 5);

  // A stop string ends generation early, "stop", without the stop text.
  r = Post(R"({"prompt": [1, 2, 3], "max_tokens": 10, "stop": "aaa"})");
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(r.body["choices"][0]["text"], "");
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 3);

  // 16 concurrent requests of different lengths (prompts longer than a
  // step's token budget are prefilled in chunks).
  std::vector<Reply> replies(16);
  std::vector<std::thread> clients;
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] {
      std::string prompt;
      for (int w = 0; w <= i * 6; ++w) prompt += " word";
      json body = {{"prompt", prompt}, {"max_tokens", 3 + i}, {"temperature", 0}};
      replies[i] = Post(body.dump());
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < 16; ++i) {
    ASSERT_EQ(replies[i].status, 200) << i << ": " << replies[i].body.dump();
    EXPECT_EQ(replies[i].body["usage"]["completion_tokens"], 3 + i);
    EXPECT_EQ(replies[i].body["choices"][0]["text"], std::string(3 + i, 'a'));
  }

  // Every block is back.
  auto deadline = Clock::now() + milliseconds(5000);
  while (FreeBlocks() != free_at_start && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ(FreeBlocks(), free_at_start);
  EXPECT_TRUE(worker_->errors().empty()) << worker_->errors().front();

  // SIGTERM: workers are told to shut down, the coordinator exits cleanly.
  coordinator_->Signal(SIGTERM);
  int status = coordinator_->WaitExit(milliseconds(10000));
  ASSERT_NE(status, -1) << "the coordinator did not exit on SIGTERM";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  deadline = Clock::now() + milliseconds(2000);
  while (!worker_->got_shutdown() && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_TRUE(worker_->got_shutdown());
}

TEST_F(CoordinatorFakeWorkerTest, BadRequestsGetOpenAiErrors) {
  StartWorker();
  ASSERT_TRUE(WaitHealth(200));
  const int free_at_start = FreeBlocks();

  ExpectError(Post("{not json"), 400, "not valid JSON");
  ExpectError(Post(R"({"prompt": "a", "max_tokens": "five"})"), 400, "max_tokens");
  ExpectError(Post(R"({"prompt": "a", "max_tokens": 0})"), 400, "max_tokens");
  ExpectError(Post(R"({"prompt": ""})"), 400, "empty");
  ExpectError(Post(R"({"prompt": "a", "n": 2})"), 400, "'n'");
  ExpectError(Post(R"({"prompt": "a", "echo": true})"), 400, "echo");
  ExpectError(Post(R"({"prompt": "a", "stream": true})"), 400, "not supported yet");
  ExpectError(Post(R"({"prompt": [1, 99999999]})"), 400, "vocabulary");
  Reply r = Post(R"({"model": "nope", "prompt": "a"})");
  ExpectError(r, 404, "The model `nope` does not exist.");

  std::string long_prompt;
  for (int i = 0; i < kMaxModelLen + 10; ++i) long_prompt += " a";
  int n = int(tokenizer_->Encode(long_prompt, true).size());
  ExpectError(Post(json{{"prompt", long_prompt}}.dump()), 400,
              "maximum context length is " + std::to_string(kMaxModelLen) +
                  " tokens. However, your request has " + std::to_string(n) + " input tokens");
  ExpectError(Post(R"({"prompt": [1, 2, 3, 4], "max_tokens": 253})"), 400,
              "you requested 257 tokens (4 in the messages, 253 in the completion)");

  EXPECT_EQ(FreeBlocks(), free_at_start);
  EXPECT_EQ(worker_->num_plans(), 0);  // nothing reached the worker
}

TEST_F(CoordinatorFakeWorkerTest, SilentWorkerFailsInFlightRequests) {
  StartWorker(/*silent_after_plans=*/3);
  ASSERT_TRUE(WaitHealth(200));
  auto start = Clock::now();
  Reply r = Post(R"({"prompt": "Tell me a story", "max_tokens": 100})");
  auto elapsed = Clock::now() - start;
  ExpectError(r, 503, "down");
  EXPECT_EQ(r.body["error"]["type"], "server_error");
  EXPECT_LT(elapsed, milliseconds(kHeartbeatTimeoutMs + 3000));
  Reply health = Get("/health");
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(health.body["instances"][0]["ready"], false);
  // A new request is refused while the instance is down.
  ExpectError(Post(R"({"prompt": "hi", "max_tokens": 2})"), 503, "ready");
  EXPECT_TRUE(worker_->errors().empty()) << worker_->errors().front();
}

}  // namespace
}  // namespace headway
