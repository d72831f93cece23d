// The real headway-coordinator's HTTP hardening (README "Security"): API
// keys from the config, a key file and the flag, and which paths need one;
// each limit's refusal (413, 431, 400 for deep JSON and for prompts that
// cannot fit, 503 past the connection limit); the total request deadline
// and the keep-alive timeout; dribbling and dropped clients next to a real
// completion; HTTPS with the self-signed certificate of tests/data/tls.
#include <gtest/gtest.h>
#include <httplib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/support/test_env.h"

namespace headway {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A TCP connection to 127.0.0.1:`port`; -1 if it cannot connect.
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads from `fd` until the peer closes it or `timeout` passes. *closed
// (when given) tells which.
std::string ReadAll(int fd, milliseconds timeout, bool* closed = nullptr) {
  std::string text;
  const auto deadline = Clock::now() + timeout;
  if (closed) *closed = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return text;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, int(left)) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      if (closed) *closed = true;
      return text;
    }
    text.append(buf, size_t(n));
  }
}

// The exit status of `child`, waiting up to 60 s; -1 if it did not exit.
int ExitCode(testing::ChildProcess& child) {
  const int status = child.WaitExit(milliseconds(60000));
  return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// VmRSS of process `pid` in KiB; -1 if unreadable.
int64_t RssKb(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
  }
  return -1;
}

// The HTTP status of a raw response ("HTTP/1.1 503 ..." -> 503); 0 if none.
int StatusOf(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0 || response.size() < 12) return 0;
  return std::atoi(response.substr(9, 3).c_str());
}

// The JSON body of a raw response; null if none.
json BodyOf(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  if (at == std::string::npos) return nullptr;
  return json::parse(response.substr(at + 4), nullptr, false);
}

void ExpectOpenAiError(int status, const json& body, int expected_status,
                       const std::string& fragment) {
  EXPECT_EQ(status, expected_status) << body.dump();
  ASSERT_TRUE(body.is_object() && body.contains("error")) << body.dump();
  const json& e = body["error"];
  EXPECT_TRUE(e.contains("message") && e.contains("type") && e.contains("param") &&
              e.contains("code"))
      << e.dump();
  EXPECT_NE(e.value("message", "").find(fragment), std::string::npos) << e.dump();
}

class HttpSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_path_ = testing::SmolLm2Path();
    HW_REQUIRE_MODEL(model_path_);
    dir_ = std::make_unique<testing::ScopedTempDir>("http-security");
    http_port_ = testing::FreePort();
    control_address_ = "tcp://127.0.0.1:" + std::to_string(testing::FreePort());
  }

  void TearDown() override {
    worker_.reset();
    if (coordinator_) {
      coordinator_->Stop();
      if (HasFailure()) std::cerr << "coordinator log:\n" << coordinator_->Log();
    }
  }

  // Writes the config with `coordinator_yaml` (lines indented by two
  // spaces) in its coordinator section; returns its path.
  std::string WriteConfig(const std::string& coordinator_yaml) const {
    const std::string path = dir_->path + "/deploy.yaml";
    std::ofstream(path) << "model:\n  path: " << model_path_ << "\n  served_name: smollm2\n"
                        << "coordinator:\n  http_host: 127.0.0.1\n" << coordinator_yaml
                        << "cache:\n  block_size: 16\n  kv_memory_mb: 64\n"
                        << "scheduler:\n  max_num_seqs: 8\n  max_num_batched_tokens: 64\n"
                        << "  max_model_len: 256\n"
                        << "pools:\n  - name: main\n    role: mixed\n    instances:\n"
                        << "      - tp_size: 1\n        device: cpu\n        num_threads: 1\n";
    return path;
  }

  std::unique_ptr<testing::ChildProcess> Launch(const std::string& coordinator_yaml,
                                                std::vector<std::string> extra_args) {
    config_path_ = WriteConfig(coordinator_yaml);
    std::vector<std::string> args = {testing::BinaryPath("headway-coordinator"), "--config",
                                     config_path_, "--http-port", std::to_string(http_port_),
                                     "--control-address", control_address_};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    return std::make_unique<testing::ChildProcess>(args, dir_->path + "/coordinator.log");
  }

  // Starts the coordinator and waits until it answers /live (over HTTPS
  // when `tls`). False if it exits or does not answer within 60 s.
  bool StartCoordinator(const std::string& coordinator_yaml,
                        std::vector<std::string> extra_args = {}, bool tls = false) {
    coordinator_ = Launch(coordinator_yaml, std::move(extra_args));
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline && coordinator_->Running()) {
      if (tls) {
        httplib::SSLClient client("127.0.0.1", http_port_);
        client.enable_server_certificate_verification(false);
        if (auto r = client.Get("/live"); r && r->status == 200) return true;
      } else if (Get("/live").status == 200) {
        return true;
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    return false;
  }

  // A real worker for the config's one instance; waits until /health is 200.
  bool StartWorker() {
    worker_ = std::make_unique<testing::ChildProcess>(
        std::vector<std::string>{testing::BinaryPath("headway-worker"), "--config", config_path_,
                                 "--instance-id", "0", "--tp-rank", "0", "--threads", "1",
                                 "--control-address", control_address_},
        dir_->path + "/worker.log");
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    while (Clock::now() < deadline && worker_->Running()) {
      if (Get("/health").status == 200) return true;
      std::this_thread::sleep_for(milliseconds(100));
    }
    std::cerr << "worker log:\n" << worker_->Log();
    return false;
  }

  struct Reply {
    int status = 0;  // 0: no answer
    json body;
  };

  static Reply ToReply(const httplib::Result& r) {
    Reply reply;
    if (!r) return reply;
    reply.status = r->status;
    reply.body = json::parse(r->body, nullptr, false);
    return reply;
  }

  Reply Get(const std::string& path, const std::string& key = "") const {
    httplib::Client client("127.0.0.1", http_port_);
    client.set_read_timeout(60, 0);
    httplib::Headers headers;
    if (!key.empty()) headers.emplace("Authorization", "Bearer " + key);
    return ToReply(client.Get(path.c_str(), headers));
  }

  Reply Post(const std::string& path, const std::string& body, const std::string& key = "") const {
    httplib::Client client("127.0.0.1", http_port_);
    client.set_read_timeout(60, 0);
    httplib::Headers headers;
    if (!key.empty()) headers.emplace("Authorization", "Bearer " + key);
    return ToReply(client.Post(path.c_str(), headers, body, "application/json"));
  }

  // Sends `request` on a new connection and reads the answer until the
  // server closes or `timeout` passes.
  std::string Exchange(const std::string& request, milliseconds timeout = milliseconds(10000)) const {
    const int fd = Connect(http_port_);
    if (fd < 0) return "";
    (void)!::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    std::string response = ReadAll(fd, timeout);
    ::close(fd);
    return response;
  }

  std::string model_path_;
  std::unique_ptr<testing::ScopedTempDir> dir_;
  std::string config_path_;
  int http_port_ = 0;
  std::string control_address_;
  std::unique_ptr<testing::ChildProcess> coordinator_;
  std::unique_ptr<testing::ChildProcess> worker_;
};

TEST_F(HttpSecurityTest, KeysFromTheConfigTheKeyFileAndTheFlagAllAdmit) {
  std::ofstream(dir_->path + "/keys.txt") << "# one per line\nfile-key\n";
  ASSERT_TRUE(StartCoordinator("  api_key: [cfg-one, cfg-two]\n  api_key_file: keys.txt\n",
                               {"--api-key", "flag-key"}));
  for (const char* key : {"cfg-one", "cfg-two", "file-key", "flag-key"}) {
    Reply r = Get("/v1/models", key);
    EXPECT_EQ(r.status, 200) << key << ": " << r.body.dump();
    EXPECT_EQ(Post("/tokenize", R"({"prompt": "hi"})", key).status, 200) << key;
  }
  for (const char* key : {"", "cfg-on", "cfg-one2", "# one per line"}) {
    Reply r = Get("/v1/models", key);
    ExpectOpenAiError(r.status, r.body, 401, "API key");
    EXPECT_EQ(r.body["error"]["code"], "invalid_api_key");
  }
  Reply r = Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 1})", "wrong");
  ExpectOpenAiError(r.status, r.body, 401, "API key");
  r = Post("/tokenize", R"({"prompt": "hi"})");
  ExpectOpenAiError(r.status, r.body, 401, "API key");
  EXPECT_EQ(Post("/admin/instances/0/drain", "").status, 401);
  // The probes and /metrics stay open: no worker yet, so not ready.
  EXPECT_EQ(Get("/live").status, 200);
  EXPECT_EQ(Get("/ready").status, 503);
  EXPECT_EQ(Get("/health").status, 503);
  EXPECT_EQ(Get("/metrics").status, 200);
}

TEST_F(HttpSecurityTest, MetricsNeedTheKeyWhenTheConfigSaysSo) {
  ASSERT_TRUE(StartCoordinator("  api_key: k\n  metrics_require_api_key: true\n"));
  EXPECT_EQ(Get("/metrics").status, 401);
  EXPECT_EQ(Get("/metrics", "k").status, 200);
  EXPECT_EQ(Get("/live").status, 200);
}

TEST_F(HttpSecurityTest, UnreadableKeyOrCertificateFilesAreConfigErrors) {
  coordinator_ = Launch("  api_key_file: missing-keys.txt\n", {});
  EXPECT_EQ(ExitCode(*coordinator_), 2);
  EXPECT_NE(coordinator_->Log().find("missing-keys.txt"), std::string::npos) << coordinator_->Log();

  coordinator_ = Launch("", {"--ssl-certfile", config_path_, "--ssl-keyfile", config_path_});
  EXPECT_EQ(ExitCode(*coordinator_), 2);
  EXPECT_NE(coordinator_->Log().find("TLS certificate"), std::string::npos) << coordinator_->Log();

  coordinator_ = Launch("", {"--ssl-certfile", testing::TestDataPath("tls/cert.pem")});
  EXPECT_EQ(ExitCode(*coordinator_), 2);
  EXPECT_NE(coordinator_->Log().find("ssl_keyfile"), std::string::npos) << coordinator_->Log();
}

TEST_F(HttpSecurityTest, EachLimitRefusesWithItsCode) {
  ASSERT_TRUE(StartCoordinator("  http_max_body_bytes: 4096\n  http_max_header_bytes: 1024\n"
                               "  http_max_json_depth: 8\n"));
  // Body: 413 from the Content-Length alone.
  const std::string big = R"({"prompt": ")" + std::string(5000, 'a') + R"("})";
  Reply r = Post("/v1/completions", big);
  ExpectOpenAiError(r.status, r.body, 413, "coordinator.http_max_body_bytes = 4096");
  EXPECT_EQ(Post("/tokenize", R"({"prompt": "small"})").status, 200);

  // Headers: 1200 bytes in three lines, each well under httplib's 8 KiB.
  std::string request = "GET /live HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  for (int i = 0; i < 3; ++i) request += "X-Pad-" + std::to_string(i) + ": " + std::string(400, 'p') + "\r\n";
  std::string response = Exchange(request + "\r\n");
  ExpectOpenAiError(StatusOf(response), BodyOf(response), 431, "http_max_header_bytes = 1024");

  // Far over (100 KB): the head stops being read past 8 KiB + 1024 bytes,
  // so it never is all in memory: 400 (or a reset), never 431.
  std::string flood = "GET /live HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  for (int i = 0; i < 100; ++i) flood += "X-Flood-" + std::to_string(i) + ": " + std::string(1000, 'f') + "\r\n";
  response = Exchange(flood + "\r\n", milliseconds(5000));
  EXPECT_TRUE(response.empty() || StatusOf(response) == 400) << response;

  // A body without a Content-Length: refused before it is read.
  response = Exchange("POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                      "5\r\nhello\r\n0\r\n\r\n");
  ExpectOpenAiError(StatusOf(response), BodyOf(response), 411, "Content-Length");

  // JSON depth: 9 levels in a field the parser would otherwise ignore.
  r = Post("/v1/completions", R"({"prompt": "hi", "x": [[[[[[[[1]]]]]]]]})");
  ExpectOpenAiError(r.status, r.body, 400, "coordinator.http_max_json_depth");
  r = Post("/tokenize", R"({"prompt": "[[[[[[[[[[ in a string is text"})");
  EXPECT_EQ(r.status, 200) << r.body.dump();
}

TEST_F(HttpSecurityTest, HugePromptsAreRefusedBeforeTokenizing) {
  ASSERT_TRUE(StartCoordinator(""));
  // 50 MB: over the default body limit (16 MiB).
  const std::string fifty_mb = R"({"prompt": ")" + std::string(50'000'000, 'a') + R"("})";
  auto start = Clock::now();
  Reply r = Post("/v1/completions", fifty_mb);
  const double fifty_mb_s = SecondsSince(start);
  ExpectOpenAiError(r.status, r.body, 413, "http_max_body_bytes");
  // 8 MB of varied text: within the body limit, far beyond 256 tokens.
  std::string text;
  while (text.size() < 8'000'000) text += "The quick brown fox jumps over the lazy dog. ";
  start = Clock::now();
  r = Post("/v1/completions", json{{"prompt", text}, {"max_tokens", 1}}.dump());
  const double eight_mb_s = SecondsSince(start);
  ExpectOpenAiError(r.status, r.body, 400, "at least");
  start = Clock::now();
  r = Post("/v1/chat/completions",
           json{{"messages", {{{"role", "user"}, {"content", text}}}}}.dump());
  const double chat_s = SecondsSince(start);
  ExpectOpenAiError(r.status, r.body, 400, "at least");
  std::printf("refused: 50 MB body %.3f s, 8 MB prompt %.3f s, 8 MB chat message %.3f s\n",
              fifty_mb_s, eight_mb_s, chat_s);
  // Tokenizing 8 MB took 10 s on a 2-core machine; the refusals take
  // a fraction of that even on a busy one.
  EXPECT_LT(fifty_mb_s, 5.0);
  EXPECT_LT(eight_mb_s, 5.0);
  EXPECT_LT(chat_s, 5.0);
  // A prompt whose bytes may fit is tokenized and checked exactly: 2000
  // bytes of words are about 440 tokens.
  r = Post("/v1/completions", json{{"prompt", text.substr(0, 2000)}, {"max_tokens", 1}}.dump());
  EXPECT_EQ(r.status, 400) << r.body.dump();
  EXPECT_EQ(r.body["error"]["message"].get<std::string>().find("at least"), std::string::npos);
}

// The listener counts a connection until its serving thread notices the
// close, so a connection the test closed a moment ago (StartCoordinator's
// /live probe) can still hold a place when the idle ones arrive, and one of
// those is refused instead. The test therefore holds connections until the
// server refuses one while it holds exactly the limit: connections that got
// an answer (a refusal) are dropped, the others count.
TEST_F(HttpSecurityTest, ConnectionsPastTheLimitGet503) {
  constexpr size_t kLimit = 4;
  ASSERT_TRUE(StartCoordinator("  http_max_connections: 4\n"));
  std::vector<int> held;
  // Drops every held connection the server has answered (refused) by now.
  auto drop_refused = [&held] {
    std::vector<int> open;
    for (int fd : held) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 0) == 0) {
        open.push_back(fd);
      } else {
        ::close(fd);
      }
    }
    held = std::move(open);
  };
  std::string refusal;
  int early_refusals = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (refusal.empty() && held.size() <= kLimit && Clock::now() < deadline) {
    const int fd = Connect(http_port_);
    ASSERT_GE(fd, 0);
    // A refusal is written at accept, before the client sends anything.
    std::string response = ReadAll(fd, milliseconds(500));
    drop_refused();
    if (response.empty()) {
      held.push_back(fd);
    } else if (held.size() == kLimit) {
      refusal = std::move(response);
      ::close(fd);
    } else {
      ::close(fd);  // an earlier connection still counted: try again
      ++early_refusals;
    }
  }
  std::printf("refused before the limit was held: %d\n", early_refusals);
  EXPECT_LE(held.size(), kLimit) << "more connections accepted than http_max_connections";
  ASSERT_FALSE(refusal.empty()) << "no refusal while holding " << held.size() << " connections";
  ExpectOpenAiError(StatusOf(refusal), BodyOf(refusal), 503, "http_max_connections");
  for (int fd : held) ::close(fd);
  // The places come back once the connections close.
  const auto back = Clock::now() + std::chrono::seconds(5);
  int status = 0;
  while (Clock::now() < back && (status = Get("/live").status) != 200) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(status, 200);
}

TEST_F(HttpSecurityTest, RequestDeadlineIsTotalAndIdleConnectionsClose) {
  ASSERT_TRUE(StartCoordinator("  http_read_timeout_ms: 1000\n  http_keep_alive_timeout_ms: 500\n"));
  // A byte every 100 ms is progress a per-read timeout would accept for ever.
  const int fd = Connect(http_port_);
  ASSERT_GE(fd, 0);
  const std::string head = "GET /live HTTP/1.1\r\nHost: x\r\nX-Dribble: ";
  const auto start = Clock::now();
  bool closed = false;
  for (size_t i = 0; i < 100 && !closed; ++i) {
    if (::send(fd, i < head.size() ? &head[i] : "z", 1, MSG_NOSIGNAL) != 1) break;
    ReadAll(fd, milliseconds(100), &closed);
  }
  const double cut_after_s = SecondsSince(start);
  ::close(fd);
  EXPECT_TRUE(closed);
  EXPECT_GT(cut_after_s, 0.9);
  EXPECT_LT(cut_after_s, 2.0);

  // Keep-alive: a second request on the connection is served, then the
  // idle connection is closed after about 500 ms.
  const int kept = Connect(http_port_);
  ASSERT_GE(kept, 0);
  const std::string get = "GET /live HTTP/1.1\r\nHost: x\r\n\r\n";
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(::send(kept, get.data(), get.size(), MSG_NOSIGNAL), ssize_t(get.size()));
    EXPECT_EQ(StatusOf(ReadAll(kept, milliseconds(300))), 200);
  }
  const auto idle_start = Clock::now();
  ReadAll(kept, milliseconds(5000), &closed);
  ::close(kept);
  EXPECT_TRUE(closed);
  EXPECT_LT(SecondsSince(idle_start), 1.5);
}

TEST_F(HttpSecurityTest, DribblingAndDroppedClientsDoNotStarveACompletion) {
  constexpr double kReadTimeoutS = 3.0;
  ASSERT_TRUE(StartCoordinator("  http_read_timeout_ms: 3000\n"));
  ASSERT_TRUE(StartWorker());
  const std::string completion = R"({"prompt": "The capital of France is", "max_tokens": 8})";
  auto timed_completion = [&] {
    const auto start = Clock::now();
    Reply r = Post("/v1/completions", completion);
    EXPECT_EQ(r.status, 200) << r.body.dump();
    return SecondsSince(start);
  };
  timed_completion();  // warm-up
  double usual_s = 0;
  for (int i = 0; i < 3; ++i) usual_s = std::max(usual_s, timed_completion());

  // 100 sockets sending header bytes one a second (replaced when the
  // server cuts them off), and 500 clients that drop mid-request.
  std::atomic<bool> stop{false};
  std::atomic<int> cut_off{0};
  std::thread dribblers([&] {
    std::vector<int> fds(100, -1);
    const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Dribble: ";
    for (size_t round = 0; !stop; ++round) {
      for (int& fd : fds) {
        if (fd < 0) fd = Connect(http_port_);
        const char byte = round < head.size() ? head[round] : 'z';
        if (fd >= 0 && ::send(fd, &byte, 1, MSG_NOSIGNAL) != 1) {
          ::close(fd);
          fd = -1;
          ++cut_off;
        }
      }
      for (int i = 0; i < 10 && !stop; ++i) std::this_thread::sleep_for(milliseconds(100));
    }
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  });
  std::atomic<int> dropped{0};
  std::thread droppers([&] {
    const std::string partial = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                "Content-Length: 1000\r\n\r\n{\"prompt\": \"dro";
    for (int i = 0; !stop || i < 500; ++i, ++dropped) {
      std::this_thread::sleep_for(milliseconds(2));
      const int fd = Connect(http_port_);
      if (fd < 0) continue;
      (void)!::send(fd, partial.data(), i % 2 ? partial.size() : partial.size() / 3, MSG_NOSIGNAL);
      if (i % 3 == 0) {
        linger reset{1, 0};  // some leave with a reset, some with a FIN
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
      }
      ::close(fd);
    }
  });
  const int64_t rss_before_kb = RssKb(coordinator_->pid());
  std::this_thread::sleep_for(milliseconds(1500));  // the attack is under way
  double worst_s = 0;
  for (int i = 0; i < 3; ++i) {
    worst_s = std::max(worst_s, timed_completion());
    EXPECT_EQ(Get("/health").status, 200);
  }
  // Past the 3 s deadline, every dribbler must be cut off (a send fails a
  // round or two after the server closed).
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (cut_off < 100 && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(100));
  const int64_t rss_after_kb = RssKb(coordinator_->pid());
  stop = true;
  dribblers.join();
  droppers.join();
  std::printf("completion: usual %.3f s, under 100 dribbling + %d dropping clients %.3f s; "
              "%d dribblers cut off; coordinator RSS %lld -> %lld KiB\n",
              usual_s, dropped.load(), worst_s, cut_off.load(), (long long)rss_before_kb,
              (long long)rss_after_kb);
  // A completion starved of connection threads waits for a dribbler to be
  // cut off, kReadTimeoutS; half of it is far above what the attackers'
  // CPU use adds on a loaded 2-core machine (a bound of 2x the usual
  // latency failed there now and then without starvation).
  EXPECT_LT(worst_s, usual_s + kReadTimeoutS / 2);
  EXPECT_GE(cut_off.load(), 100);
  EXPECT_GE(dropped.load(), 500);
#ifndef __SANITIZE_ADDRESS__
  // Under AddressSanitizer freed memory waits in its quarantine and each
  // connection thread keeps a fake stack (detect_stack_use_after_return),
  // so RSS measures the tool (it grew 0.9 GB there); LeakSanitizer checks
  // the coordinator's memory at exit instead.
  EXPECT_LT(rss_after_kb - rss_before_kb, 100 * 1024);
#endif
}

TEST_F(HttpSecurityTest, ServesHttpsWithATestCertificate) {
  const std::string cert = testing::TestDataPath("tls/cert.pem");
  const std::string key = testing::TestDataPath("tls/key.pem");
  ASSERT_TRUE(StartCoordinator("  api_key: tls-key\n", {"--ssl-certfile", cert, "--ssl-keyfile", key},
                               /*tls=*/true));
  httplib::SSLClient client("127.0.0.1", http_port_);
  client.set_ca_cert_path(cert.c_str());
  client.enable_server_certificate_verification(true);
  auto live = client.Get("/live");
  ASSERT_TRUE(live) << httplib::to_string(live.error());
  EXPECT_EQ(live->status, 200);
  auto models = client.Get("/v1/models", {{"Authorization", "Bearer tls-key"}});
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200) << models->body;
  auto refused = client.Get("/v1/models");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  // Keep-alive over TLS: the same client, again.
  auto again = client.Get("/live");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200);
  // Plain HTTP gets no answer from the HTTPS port.
  EXPECT_EQ(Get("/live").status, 0);
}

TEST_F(HttpSecurityTest, TlsFilesFromTheConfig) {
  const std::string cert = testing::TestDataPath("tls/cert.pem");
  const std::string key = testing::TestDataPath("tls/key.pem");
  ASSERT_TRUE(StartCoordinator("  ssl_certfile: " + cert + "\n  ssl_keyfile: " + key + "\n", {},
                               /*tls=*/true));
  httplib::SSLClient client("localhost", http_port_);
  client.set_ca_cert_path(cert.c_str());
  client.enable_server_certificate_verification(true);
  auto live = client.Get("/live");
  ASSERT_TRUE(live) << httplib::to_string(live.error());
  EXPECT_EQ(live->status, 200);
}

}  // namespace
}  // namespace headway
