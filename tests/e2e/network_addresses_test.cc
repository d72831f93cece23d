// Bind vs advertise on loopback: a coordinator bound to every interface (or
// to a name) that workers reach by name, and workers told by their node agent to bind
// 0.0.0.0 and advertise `localhost`, serve requests: TP ranks over Gloo,
// and prefill and decode instances over UCX. Names that do not resolve stop
// the process that needs them with the key and the value.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/deployment.h"
#include "tests/support/process.h"
#include "tests/support/prometheus_parser.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using Clock = std::chrono::steady_clock;

// `options`' config, with workers dialing the coordinator by name.
std::string WriteConfig(const std::string& dir, const DeploymentOptions& options, int http_port,
                        int control_port) {
  std::string yaml = DeploymentYaml(options, http_port, control_port);
  const std::string dial = "tcp://127.0.0.1:" + std::to_string(control_port);
  yaml.replace(yaml.find(dial), dial.size(), "tcp://localhost:" + std::to_string(control_port));
  // These tests are about where sockets listen, on one machine; the
  // authenticated control plane has tests of its own (coordinator_auth_test).
  yaml += "security:\n  insecure: true\n";
  const std::string path = dir + "/deploy.yaml";
  std::ofstream(path) << yaml;
  return path;
}

DeploymentOptions GlooTp3() {
  DeploymentOptions options;
  options.model_path = SmolLm2Path();
  options.tp_size = 3;
  options.num_threads = 1;
  options.collective = "gloo";
  return options;
}

size_t Count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// A coordinator whose HTTP API binds every interface and whose control
// ROUTER binds `control_bind_host`, and a node agent whose workers bind
// 0.0.0.0 and advertise `localhost`, serving `options`' deployment on
// loopback; stopped on every path out of a test.
class AddressesDeployment {
 public:
  AddressesDeployment(const DeploymentOptions& options, const std::string& control_bind_host)
      : dir_(MakeTempDir("headway-addresses")),
        http_port_(FreePort()),
        control_port_(FreePort()),
        config_(WriteConfig(dir_, options, http_port_, control_port_)),
        coordinator_({BinaryPath("headway-coordinator"), "--config", config_, "--http-host",
                      "0.0.0.0", "--control-bind",
                      "tcp://" + control_bind_host + ":" + std::to_string(control_port_)},
                     dir_ + "/coordinator.log"),
        node_({BinaryPath("headway-node"), "--config", config_, "--host", "127.0.0.1",
               "--bind-host", "0.0.0.0", "--advertise-host", "localhost"},
              dir_ + "/node.log") {}

  // Waits up to 90 s for /health to answer 200.
  // Every instance ready (a 200 alone may be a decode instance serving
  // while its prefill instance still loads).
  bool WaitReady() {
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(90);
    while (!EveryInstanceReady(HttpGet(http_port_, "/health", 5)) && Clock::now() < deadline &&
           coordinator_.Running() && node_.Running()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return EveryInstanceReady(HttpGet(http_port_, "/health", 5));
  }
  std::string Logs() const { return coordinator_.Log() + "\n---- node:\n" + node_.Log(); }
  int http_port() const { return http_port_; }
  std::string CoordinatorLog() const { return coordinator_.Log(); }
  std::string NodeLog() const { return node_.Log(); }

 private:
  std::string dir_;
  int http_port_;
  int control_port_;
  std::string config_;
  ChildProcess coordinator_;
  ChildProcess node_;
};

TEST(NetworkAddressesE2eTest, RanksBoundToEveryInterfaceAndAdvertisingLocalhostServe) {
  HW_REQUIRE_MODEL(SmolLm2Path());
  AddressesDeployment d(GlooTp3(), "0.0.0.0");
  ASSERT_TRUE(d.WaitReady()) << d.Logs();
  HttpReply reply = HttpPost(d.http_port(), "/v1/completions",
                             GreedyCompletionBody("The capital of France is", 4).dump(), 60);
  EXPECT_EQ(reply.status, 200) << reply.body;
  EXPECT_FALSE(IsErrorText(CompletionText(reply))) << reply.body;
  // Each rank resolved `localhost` and listens on, and publishes to its
  // peers, 127.0.0.1 (tests/comm/communicator_test.cc's GlooAddressTest
  // reads what is published).
  EXPECT_EQ(Count(d.NodeLog(), "listening on and advertising 127.0.0.1, bind host 0.0.0.0"), 3u)
      << d.NodeLog();
  EXPECT_NE(d.CoordinatorLog().find("control bound to tcp://0.0.0.0:"), std::string::npos)
      << d.CoordinatorLog();
}

TEST(NetworkAddressesE2eTest, KvEndpointsOnTheAdvertisedInterfaceTransferBlocks) {
  HW_REQUIRE_MODEL(SmolLm2Path());
  DeploymentOptions options;
  options.model_path = SmolLm2Path();
  options.pd_decode_tp_size = 1;
  // A name to bind: the coordinator resolves it (ZeroMQ binds no names).
  AddressesDeployment d(options, "localhost");
  ASSERT_TRUE(d.WaitReady()) << d.Logs();
  // More than one block of prompt, so that the decode instance receives it.
  HttpReply reply = HttpPost(
      d.http_port(), "/v1/completions",
      GreedyCompletionBody(SmolLm2ChatPrompt("What is the capital of France? Answer in one word, "
                                             "then name its river."),
                           4)
          .dump(),
      60);
  EXPECT_EQ(reply.status, 200) << reply.body;
  EXPECT_FALSE(IsErrorText(CompletionText(reply))) << reply.body;
  // Both workers publish only loopback's address (UCX advertises its
  // devices' own addresses; tests/comm/kv_transfer_test.cc checks the
  // published bytes), and the prompt's blocks crossed.
  EXPECT_EQ(Count(d.NodeLog(), "KV endpoint on network device lo (advertise 127.0.0.1)"), 2u)
      << d.NodeLog();
  const std::string metrics = HttpGet(d.http_port(), "/metrics", 10).body;
  Result<PromExposition> parsed = ParsePrometheusText(metrics);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  std::vector<const PromSample*> blocks = parsed->Samples("headway:kv_transfer_blocks_total");
  ASSERT_FALSE(blocks.empty()) << metrics;
  EXPECT_GT(blocks[0]->value, 0.0) << metrics;
  EXPECT_NE(d.CoordinatorLog().find("control bound to tcp://localhost:"), std::string::npos)
      << d.CoordinatorLog();
}

TEST(NetworkAddressesE2eTest, AddressesThatDoNotResolveNameTheirKey) {
  HW_REQUIRE_MODEL(SmolLm2Path());
  const std::string dir = MakeTempDir("headway-addresses");
  const std::string config = WriteConfig(dir, GlooTp3(), FreePort(), FreePort());

  ChildProcess worker({BinaryPath("headway-worker"), "--config", config, "--instance-id", "0",
                       "--tp-rank", "1", "--advertise-host", "no-such-host.invalid"},
                      dir + "/worker.log");
  const int worker_status = worker.WaitExit(std::chrono::seconds(30));
  ASSERT_NE(worker_status, -1) << worker.Log();
  EXPECT_TRUE(WIFEXITED(worker_status) && WEXITSTATUS(worker_status) != 0) << worker.Log();
  EXPECT_NE(worker.Log().find("`--advertise-host` = \"no-such-host.invalid\" does not resolve"),
            std::string::npos)
      << worker.Log();

  ChildProcess coordinator({BinaryPath("headway-coordinator"), "--config", config,
                            "--control-bind", "tcp://no-such-host.invalid:5557"},
                           dir + "/coordinator.log");
  const int coordinator_status = coordinator.WaitExit(std::chrono::seconds(30));
  ASSERT_NE(coordinator_status, -1) << coordinator.Log();
  EXPECT_TRUE(WIFEXITED(coordinator_status) && WEXITSTATUS(coordinator_status) == 2)
      << coordinator.Log();
  EXPECT_NE(coordinator.Log().find("`--control-bind` = \"no-such-host.invalid\" does not resolve"),
            std::string::npos)
      << coordinator.Log();
}

}  // namespace
}  // namespace headway::testing
