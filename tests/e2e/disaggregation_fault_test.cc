// Faults during the KV transfer of a disaggregated deployment (prefill TP 1
// -> decode TP 1, SmolLM2, UCX over TCP): the transfer stalls past its
// timeout, the prefill worker is killed mid-transfer, the client goes away
// during the transfer. Every request must complete (the decode instance
// prefills it itself) or fail with an error in bounded time, with the same
// greedy text as a colocated deployment, and every pool's free blocks must
// return to their values before the request.
//
// The stall comes from the prefill worker's fault-injection hook
// (HEADWAY_FAULT_TRANSFER_STALL_MS: each transfer writes half its blocks,
// logs "injected fault: transfer ...", then sleeps), so a test knows the
// transfer is in progress when it acts.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/deployment.h"
#include "tests/support/process.h"
#include "tests/support/prometheus_parser.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kPrefillInstance = 0;  // pool order: prefill, then decode
constexpr int kDecodeInstance = 1;
constexpr int kMaxTokens = 16;

// About 120 tokens: 7 whole blocks move, 630 block copies (30 layers x 3
// KV heads each).
const std::string& LongPrompt() {
  static const std::string prompt = SmolLm2ChatPrompt(
      "Write a short story about a lighthouse keeper who finds a message in a bottle. The "
      "message is written in an old language that nobody in the village can read, and the "
      "keeper spends the winter learning it from books in the library of the nearby town. "
      "Describe the weather, the sea, the books and what the message finally says.");
  return prompt;
}

bool WaitFor(const std::function<bool()>& done, std::chrono::seconds limit) {
  const Clock::time_point deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return done();
}

class DisaggregationFaultTest : public ::testing::Test {
 protected:
  void SetUp() override { HW_REQUIRE_MODEL(SmolLm2Path()); }

  void TearDown() override {
    prefill_.reset();
    decode_.reset();
    coordinator_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // The greedy text of LongPrompt from a colocated deployment.
  static std::string ColocatedText() {
    DeploymentOptions options;
    options.model_path = SmolLm2Path();
    std::string error;
    std::unique_ptr<Deployment> local = Deployment::Start(options, &error);
    EXPECT_NE(local, nullptr) << error;
    if (local == nullptr) return "";
    HttpReply r = local->PostJson("/v1/completions", Body(false));
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? r.json["choices"][0]["text"].get<std::string>() : "";
  }

  static json Body(bool stream, int max_tokens = kMaxTokens) {
    return {{"model", "smollm2"},
            {"prompt", LongPrompt()},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"stream", stream}};
  }

  // Starts coordinator, prefill worker (stalling each transfer `stall_ms`
  // after half its blocks; 0 = no fault) and decode worker, and waits until
  // every instance is ready.
  void StartDeployment(int stall_ms, int transfer_timeout_ms, int heartbeat_timeout_ms = 0) {
    dir_ = MakeTempDir("headway-pd-fault");
    http_port_ = FreePort();
    DeploymentOptions options;
    options.model_path = SmolLm2Path();
    options.pd_decode_tp_size = 1;
    options.kv_transfer_timeout_ms = transfer_timeout_ms;
    options.heartbeat_timeout_ms = heartbeat_timeout_ms;
    config_ = dir_ + "/deploy.yaml";
    std::ofstream(config_) << DeploymentYaml(options, http_port_, FreePort());
    coordinator_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{BinaryPath("headway-coordinator"), "--config", config_},
        dir_ + "/coordinator.log");
    StartPrefillWorker(stall_ms);
    decode_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{BinaryPath("headway-worker"), "--config", config_,
                                 "--instance-id", std::to_string(kDecodeInstance), "--tp-rank",
                                 "0"},
        dir_ + "/decode.log");
    ASSERT_TRUE(WaitFor([&] { return EveryInstanceReady(HttpGet(http_port_, "/health", 5)); },
                        std::chrono::seconds(120)))
        << coordinator_->Log();
  }

  void StartPrefillWorker(int stall_ms) {
    prefill_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{"/usr/bin/env",
                                 "HEADWAY_FAULT_TRANSFER_STALL_MS=" + std::to_string(stall_ms),
                                 BinaryPath("headway-worker"), "--config", config_,
                                 "--instance-id", std::to_string(kPrefillInstance), "--tp-rank",
                                 "0"},
        dir_ + "/prefill" + std::to_string(++prefill_starts_) + ".log");
  }

  // Free blocks of an instance's rank 0 from /health; -1 while it is not
  // ready or /health cannot be read.
  long FreeBlocks(int instance) const {
    HttpReply h = HttpGet(http_port_, "/health", 5);
    if (!h.json.is_object() || !h.json.contains("instances")) return -1;
    const json& inst = h.json["instances"][size_t(instance)];
    if (!inst.value("ready", false)) return -1;
    return inst["ranks"][0].value("free_blocks", -1L);
  }

  double Metric(const std::string& name) const {
    return SumOfSamples(HttpGet(http_port_, "/metrics", 5).body, name);
  }

  bool PrefillLogged(const std::string& text) const {
    return prefill_->Log().find(text) != std::string::npos;
  }

  std::future<HttpReply> PostAsync(const json& body, int timeout_s = 120) const {
    const int port = http_port_;
    return std::async(std::launch::async, [port, body, timeout_s] {
      return HttpPost(port, "/v1/completions", body.dump(), timeout_s);
    });
  }

  std::string dir_;
  std::string config_;
  int http_port_ = 0;
  int prefill_starts_ = 0;
  std::unique_ptr<ChildProcess> coordinator_;
  std::unique_ptr<ChildProcess> prefill_;
  std::unique_ptr<ChildProcess> decode_;
};

// Each transfer attempt stalls 3 s against a 1 s timeout: the first attempt
// fails, the retry fails, and the decode instance prefills the request.
TEST_F(DisaggregationFaultTest, TransferDelayedPastTimeoutFallsBackToLocalPrefill) {
  const std::string expected = ColocatedText();
  ASSERT_FALSE(expected.empty());
  StartDeployment(/*stall_ms=*/3000, /*transfer_timeout_ms=*/1000);
  const long prefill_free = FreeBlocks(kPrefillInstance);
  const long decode_free = FreeBlocks(kDecodeInstance);

  const Clock::time_point sent = Clock::now();
  HttpReply r = HttpPost(http_port_, "/v1/completions", Body(false).dump(), 120);
  const double seconds = std::chrono::duration<double>(Clock::now() - sent).count();
  ASSERT_EQ(r.status, 200) << r.body << "\n" << coordinator_->Log();
  EXPECT_EQ(r.json["choices"][0]["text"].get<std::string>(), expected);
  // Two attempts of at most timeout + 2 s each, then a local prefill.
  EXPECT_LT(seconds, 2 * (1.0 + 2.0) + 10.0);
  std::printf("answered %.2f s after the request (two failed attempts, then local prefill)\n",
              seconds);
  EXPECT_EQ(Metric("headway:kv_transfer_fallbacks_total"), 1);
  EXPECT_EQ(Metric("headway:kv_transfer_blocks_total"), 0);
  EXPECT_NE(coordinator_->Log().find("retrying"), std::string::npos) << coordinator_->Log();
  // The held receiving blocks go back once the writer answers.
  EXPECT_TRUE(WaitFor([&] { return FreeBlocks(kDecodeInstance) == decode_free; },
                      std::chrono::seconds(15)))
      << "decode free " << FreeBlocks(kDecodeInstance) << " != " << decode_free;
  EXPECT_EQ(FreeBlocks(kPrefillInstance), prefill_free);
}

// SIGKILL of the prefill worker while its transfer is stalled half-way:
// the coordinator notices the instance down (heartbeat timeout 2 s), drops
// the transfer and the decode instance prefills the request. The decode
// worker survives; a restarted prefill worker serves again with its whole
// pool free and transfers work.
TEST_F(DisaggregationFaultTest, PrefillKilledMidTransferFallsBackAndRecovers) {
  const std::string expected = ColocatedText();
  ASSERT_FALSE(expected.empty());
  StartDeployment(/*stall_ms=*/8000, /*transfer_timeout_ms=*/6000, /*heartbeat_timeout_ms=*/2000);
  const long prefill_free = FreeBlocks(kPrefillInstance);
  const long decode_free = FreeBlocks(kDecodeInstance);

  std::future<HttpReply> reply = PostAsync(Body(false));
  ASSERT_TRUE(WaitFor([&] { return PrefillLogged("injected fault: transfer"); },
                      std::chrono::seconds(60)))
      << prefill_->Log();
  const Clock::time_point killed = Clock::now();
  prefill_->Signal(SIGKILL);
  ASSERT_EQ(reply.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  HttpReply r = reply.get();
  const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  ASSERT_EQ(r.status, 200) << r.body << "\n" << coordinator_->Log();
  EXPECT_EQ(r.json["choices"][0]["text"].get<std::string>(), expected);
  std::printf("answered %.2f s after the kill (local prefill on the decode instance)\n", seconds);
  EXPECT_EQ(Metric("headway:kv_transfer_fallbacks_total"), 1);
  EXPECT_TRUE(decode_->Running()) << decode_->Log();
  // The decode instance serves alone: ready, yet not every instance is.
  HttpReply degraded = HttpGet(http_port_, "/health", 5);
  EXPECT_EQ(degraded.status, 200) << degraded.body;
  EXPECT_EQ(degraded.json.value("status", ""), "degraded") << degraded.body;
  EXPECT_EQ(HttpGet(http_port_, "/ready", 5).status, 200);
  EXPECT_TRUE(WaitFor([&] { return FreeBlocks(kDecodeInstance) == decode_free; },
                      std::chrono::seconds(10)))
      << "decode free " << FreeBlocks(kDecodeInstance) << " != " << decode_free;

  // A new prefill worker (no fault) registers; the pool is whole again and
  // the next request's blocks move over UCX.
  StartPrefillWorker(0);
  ASSERT_TRUE(WaitFor([&] { return FreeBlocks(kPrefillInstance) == prefill_free; },
                      std::chrono::seconds(60)))
      << coordinator_->Log();
  json other = Body(false);
  other["prompt"] = SmolLm2ChatPrompt(
      "Explain how the lens of a lighthouse works, step by step, for a child of ten who "
      "likes boats, the sea and asking questions.");
  HttpReply again = HttpPost(http_port_, "/v1/completions", other.dump(), 120);
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_GT(Metric("headway:kv_transfer_blocks_total"), 0);
  EXPECT_TRUE(decode_->Running()) << decode_->Log();
}

// A streaming client closes its connection while the transfer is stalled.
// The transfer still ends (within its timeout), the request reaches the
// decode instance, whose first token cannot be written: the request is
// cancelled and every block returns.
TEST_F(DisaggregationFaultTest, ClientGoneDuringTransferFreesEveryBlock) {
  StartDeployment(/*stall_ms=*/2000, /*transfer_timeout_ms=*/5000);
  const long prefill_free = FreeBlocks(kPrefillInstance);
  const long decode_free = FreeBlocks(kDecodeInstance);

  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(http_port_));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string body = Body(true, /*max_tokens=*/400).dump();
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              "Content-Type: application/json\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(write(fd, request.data(), request.size()), ssize_t(request.size()));
  const bool stalled = WaitFor([&] { return PrefillLogged("injected fault: transfer"); },
                               std::chrono::seconds(60));
  close(fd);
  ASSERT_TRUE(stalled) << prefill_->Log();

  EXPECT_TRUE(WaitFor([&] {
    return FreeBlocks(kDecodeInstance) == decode_free &&
           FreeBlocks(kPrefillInstance) == prefill_free;
  }, std::chrono::seconds(30)))
      << "free blocks: prefill " << FreeBlocks(kPrefillInstance) << " (start " << prefill_free
      << "), decode " << FreeBlocks(kDecodeInstance) << " (start " << decode_free << ")\n"
      << coordinator_->Log();
  // Nothing is left running, and the deployment still serves.
  HttpReply h = HttpGet(http_port_, "/health", 5);
  EXPECT_EQ(h.json["instances"][kDecodeInstance].value("num_running", -1), 0) << h.body;
  HttpReply again = HttpPost(http_port_, "/v1/completions",
                             json{{"model", "smollm2"}, {"prompt", "Hi"}, {"max_tokens", 4}}.dump());
  EXPECT_EQ(again.status, 200) << again.body;
}

}  // namespace
}  // namespace headway::testing
