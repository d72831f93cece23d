// A pool that grows and shrinks under load, with real processes and the
// real model: a mixed pool declared {min: 1, max: 2} starts with instance 0
// (headway-launch); `headway-node --pool main --group-index 1` runs the
// standby slot, which registers and takes requests; a rolling restart of
// instance 0 (POST /admin/instances/0/drain, its node agent starts it
// again); SIGTERM to the second agent drains instance 1 away and the slot
// is vacant again. Clients send requests the whole time: none may fail.
// And a worker killed with SIGKILL under load: its requests start again on
// the other instance (none had streamed), its agent starts it again, and it
// serves again within a stated bound with every block back.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/deployment.h"
#include "tests/support/process.h"
#include "tests/support/prometheus_parser.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

class ScaleTest : public ::testing::Test {
 protected:
  // The pool's `instances:` value.
  virtual std::string Instances() const {
    return "\n      min: 1\n      max: 2\n"
           "      template: {tp_size: 1, hosts: [127.0.0.1], num_threads: 1}\n";
  }

  void SetUp() override {
    const std::string model = SmolLm2Path();
    HW_REQUIRE_MODEL(model);
    dir_ = MakeTempDir("headway-scale");
    http_port_ = FreePort();
    config_ = dir_ + "/deploy.yaml";
    std::ofstream(config_) << "model:\n  path: " << model << "\n  served_name: smollm2\n"
                           << "coordinator:\n  http_host: 127.0.0.1\n  http_port: " << http_port_
                           << "\n  control_address: tcp://127.0.0.1:" << FreePort() << "\n"
                           << "cache:\n  kv_memory_mb: 64\n"
                           << "scheduler:\n  max_model_len: 512\n"
                           << "pools:\n  - name: main\n    role: mixed\n"
                           << "    instances:" << Instances();
  }

  void TearDown() override {
    StopLoad();
    if (agent_) agent_->Stop(std::chrono::seconds(15));
    if (launcher_) launcher_->Stop(std::chrono::seconds(15));
    if (HasFailure()) {
      if (launcher_) std::cerr << "launcher log:\n" << launcher_->Log();
      if (agent_) std::cerr << "second agent log:\n" << agent_->Log();
    }
  }

  json Health() const { return HttpGet(http_port_, "/health", 5).json; }

  std::string StateOf(int instance) const {
    const json h = Health();
    if (!h.is_object() || !h.contains("instances")) return "";
    return h["instances"][size_t(instance)].value("state", "");
  }

  // Waits until `done` or `timeout`; the seconds it took, or -1.
  static double WaitFor(const std::function<bool()>& done, std::chrono::seconds timeout) {
    const Clock::time_point start = Clock::now();
    while (Clock::now() - start < timeout) {
      if (done()) return std::chrono::duration<double>(Clock::now() - start).count();
      std::this_thread::sleep_for(milliseconds(20));
    }
    return -1;
  }

  double Metric(const std::string& name, int instance) const {
    Result<PromExposition> m = ParsePrometheusText(HttpGet(http_port_, "/metrics", 5).body);
    if (!m.ok()) return -1;
    std::optional<double> v =
        m->Value(name, {{"model_name", "smollm2"}, {"instance", std::to_string(instance)}});
    return v.value_or(-1);
  }

  // Two clients, each sending one greedy completion after another.
  void StartLoad() {
    for (int c = 0; c < 2; ++c) {
      clients_.emplace_back([this, c] {
        for (int i = 0; !stop_load_; ++i) {
          const json body = {{"model", "smollm2"},
                             {"prompt", "Client " + std::to_string(c) + " asks question " +
                                            std::to_string(i) + ": what is a lighthouse?"},
                             {"max_tokens", 8},
                             {"temperature", 0}};
          HttpReply r = HttpPost(http_port_, "/v1/completions", body.dump(), 60);
          ++num_sent_;
          if (r.status != 200) {
            ++num_failed_;
            std::lock_guard<std::mutex> lock(mu_);
            failures_.push_back(std::to_string(r.status) + " " + r.body);
          }
        }
      });
    }
  }

  void StopLoad() {
    stop_load_ = true;
    for (std::thread& t : clients_) t.join();
    clients_.clear();
  }

  std::string dir_;
  std::string config_;
  int http_port_ = 0;
  std::unique_ptr<ChildProcess> launcher_;
  std::unique_ptr<ChildProcess> agent_;
  std::vector<std::thread> clients_;
  std::atomic<bool> stop_load_{false};
  std::atomic<int> num_sent_{0};
  std::atomic<int> num_failed_{0};
  std::mutex mu_;
  std::vector<std::string> failures_;
};

TEST_F(ScaleTest, APoolGrowsRestartsAndShrinksUnderLoadWithoutAFailedRequest) {
  launcher_ = std::make_unique<ChildProcess>(
      std::vector<std::string>{BinaryPath("headway-launch"), config_}, dir_ + "/launch.log");
  ASSERT_GE(WaitFor([&] { return EveryInstanceReady(HttpGet(http_port_, "/health", 5)); },
                    std::chrono::seconds(120)),
            0);
  EXPECT_EQ(StateOf(1), "vacant");  // a standby slot does not hold up "ok"
  StartLoad();

  // Grow: the standby slot's agent, as a scaled-up pod would run it.
  agent_ = std::make_unique<ChildProcess>(
      std::vector<std::string>{BinaryPath("headway-node"), "--config", config_, "--pool", "main",
                               "--group-index", "1", "--worker-index", "0"},
      dir_ + "/agent1.log");
  const double joined = WaitFor([&] { return StateOf(1) == "ready"; }, std::chrono::seconds(60));
  ASSERT_GE(joined, 0) << Health().dump();
  EXPECT_GE(WaitFor([&] { return Metric("headway:generation_tokens_total", 1) > 0; },
                    std::chrono::seconds(30)),
            0)
      << "the new instance took no request";

  // Rolling restart of instance 0: drained, released, started again by its
  // agent, ready again; instance 1 serves meanwhile.
  const Clock::time_point restart = Clock::now();
  HttpReply drain = HttpPost(http_port_, "/admin/instances/0/drain", "", 5);
  ASSERT_EQ(drain.status, 202) << drain.body;
  ASSERT_GE(WaitFor([&] { return StateOf(0) != "ready" && StateOf(0) != "draining"; },
                    std::chrono::seconds(40)),
            0);
  ASSERT_GE(WaitFor([&] { return StateOf(0) == "ready"; }, std::chrono::seconds(60)), 0);
  const double restarted = std::chrono::duration<double>(Clock::now() - restart).count();

  // Shrink: SIGTERM drains instance 1; its agent exits 0 and the slot is
  // vacant again.
  const Clock::time_point shrink = Clock::now();
  agent_->Signal(SIGTERM);
  const int status = agent_->WaitExit(std::chrono::seconds(60));
  const double left = std::chrono::duration<double>(Clock::now() - shrink).count();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << agent_->Log();
  EXPECT_GE(WaitFor([&] { return StateOf(1) == "vacant"; }, std::chrono::seconds(10)), 0)
      << Health().dump();
  // A little more load on the one instance left.
  std::this_thread::sleep_for(milliseconds(500));
  StopLoad();

  EXPECT_EQ(num_failed_.load(), 0) << (failures_.empty() ? "" : failures_.front());
  EXPECT_GT(num_sent_.load(), 10);
  EXPECT_TRUE(EveryInstanceReady(HttpGet(http_port_, "/health", 5))) << Health().dump();
  std::printf("requests %d, failed %d; instance 1 ready %.2f s after its agent started; "
              "instance 0 rolled (drain, restart, ready) in %.2f s; instance 1 left in %.2f s\n",
              num_sent_.load(), num_failed_.load(), joined, restarted, left);
}

class KillTest : public ScaleTest {
 protected:
  std::string Instances() const override {
    return " {count: 2, template: {tp_size: 1, hosts: [127.0.0.1], num_threads: 1}}\n";
  }

  long FreeBlocks() const {
    const json h = Health();
    long total = 0;
    for (const json& inst : h["instances"]) {
      for (const json& r : inst["ranks"]) total += r.value("free_blocks", 0L);
    }
    return total;
  }
};

TEST_F(KillTest, AKilledWorkersRequestsFinishElsewhereAndItServesAgain) {
  launcher_ = std::make_unique<ChildProcess>(
      std::vector<std::string>{BinaryPath("headway-launch"), config_}, dir_ + "/launch.log");
  ASSERT_GE(WaitFor([&] { return EveryInstanceReady(HttpGet(http_port_, "/health", 5)); },
                    std::chrono::seconds(120)),
            0);
  const long free_at_start = FreeBlocks();
  StartLoad();
  ASSERT_GE(WaitFor([&] { return Metric("headway:generation_tokens_total", 1) > 0; },
                    std::chrono::seconds(30)),
            0);
  // The worker of instance 1, a child of the node agent. The bracketed 1
  // keeps the pattern from matching the shell that runs pgrep, which pgrep
  // would list first once pids wrap around.
  const std::string pgrep = "pgrep -f -- '" + BinaryPath("headway-worker") + " --config " +
                            config_ + " .*--instance-id [1] '";
  FILE* p = popen(pgrep.c_str(), "r");
  ASSERT_NE(p, nullptr);
  int pid = 0;
  const int found = fscanf(p, "%d", &pid);
  pclose(p);
  ASSERT_EQ(found, 1) << "no worker of instance 1";
  const Clock::time_point killed = Clock::now();
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_GE(WaitFor([&] { return StateOf(1) != "ready"; }, std::chrono::seconds(10)), 0);
  const double noticed = std::chrono::duration<double>(Clock::now() - killed).count();
  // The agent's first restart waits 1 s; loading and registering follow.
  const double back = WaitFor([&] { return StateOf(1) == "ready"; }, std::chrono::seconds(30));
  ASSERT_GE(back, 0) << Health().dump();
  const double serving_again = std::chrono::duration<double>(Clock::now() - killed).count();
  EXPECT_LT(serving_again, 10.0);
  const double tokens_before = Metric("headway:generation_tokens_total", 1);
  EXPECT_GE(WaitFor([&] { return Metric("headway:generation_tokens_total", 1) > tokens_before; },
                    std::chrono::seconds(30)),
            0)
      << "the restarted instance took no request";
  StopLoad();

  EXPECT_EQ(num_failed_.load(), 0) << (failures_.empty() ? "" : failures_.front());
  EXPECT_TRUE(EveryInstanceReady(HttpGet(http_port_, "/health", 5))) << Health().dump();
  EXPECT_GE(WaitFor([&] { return FreeBlocks() == free_at_start; }, std::chrono::seconds(10)), 0)
      << "free blocks " << FreeBlocks() << ", at start " << free_at_start;
  std::printf("requests %d, failed %d, moved %.0f; killed instance noticed after %.3f s, "
              "serving again after %.2f s\n",
              num_sent_.load(), num_failed_.load(),
              [&] {
                Result<PromExposition> m =
                    ParsePrometheusText(HttpGet(http_port_, "/metrics", 5).body);
                std::optional<double> v =
                    m.ok() ? m->Value("headway:requests_moved_total", {{"model_name", "smollm2"}})
                           : std::nullopt;
                return v.value_or(-1);
              }(),
              noticed, serving_again);
}

}  // namespace
}  // namespace headway::testing
