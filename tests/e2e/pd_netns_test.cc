// Disaggregated prefill and decode across a network link: the coordinator
// and the prefill instance in one network namespace, the decode instance in
// another, joined only by a veth pair (tests/support/netns.h). The decode
// worker registers with the coordinator over the link, and the prefill
// worker writes KV blocks into the decode worker's pool with UCX over TCP on
// the veth devices alone: no shared memory, no loopback. This is the
// two-machine deployment of deploy/configs/pd.yaml on one host.
//
// Greedy outputs must equal a colocated deployment's (root namespace, same
// cache and scheduler settings) text for text, and the coordinator's
// counters must show blocks moved and no fallback to local prefill.
//
// Needs root and the model; skips otherwise.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/kv_layout.h"
#include "tests/support/control_keys.h"
#include "tests/support/deployment.h"
#include "tests/support/netns.h"
#include "tests/support/process.h"
#include "tests/support/prometheus_parser.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kMaxTokens = 24;
constexpr int kRounds = 2;  // every prompt alone, then all of them twice, concurrently

// The last `max_chars` of a process log, for failure messages.
std::string Tail(const ChildProcess& p, size_t max_chars = 3000) {
  const std::string log = p.Log();
  return p.log_path() + ":\n" + (log.size() > max_chars ? log.substr(log.size() - max_chars) : log);
}

TEST(PdNetnsTest, PrefillAndDecodeInTwoNamespacesMatchColocated) {
  HW_REQUIRE_MODEL(SmolLm2Path());
  const auto start = Clock::now();
  NetnsPair net("pd");
  HW_SETUP_NETNS_OR_SKIP(net);

  DeploymentOptions options;
  options.model_path = SmolLm2Path();

  std::vector<std::string> colocated;
  {
    std::string error;
    std::unique_ptr<Deployment> local = Deployment::Start(options, &error);
    ASSERT_NE(local, nullptr) << error;
    colocated = GreedyTexts(
        [&](const std::string& body) { return local->Post("/v1/completions", body); },
        SmolLm2TransferPrompts(), kMaxTokens, kRounds);
  }
  const auto colocated_done = Clock::now();

  const std::string host_a = net.address(NetnsSide::kA);
  const std::string host_b = net.address(NetnsSide::kB);
  // A fresh namespace has every port free; FreePort only supplies numbers.
  const int http_port = FreePort();
  const int control_port = FreePort();
  ScopedTempDir dir("headway-pd-netns");
  ASSERT_FALSE(dir.path.empty());
  const std::string config = dir.path + "/pd.yaml";
  DeploymentOptions pd = options;
  pd.pd_decode_tp_size = 1;
  pd.host = host_a;
  pd.decode_host = host_b;
  // Across hosts the control plane is authenticated: keys, as in production.
  std::string keys_error;
  pd.extra_yaml += ControlPlaneKeysYaml(dir.path, &keys_error);
  ASSERT_TRUE(keys_error.empty()) << keys_error;
  std::ofstream(config) << DeploymentYaml(pd, http_port, control_port);

  // Declared after `net`: the processes stop before the namespaces go.
  const std::string worker = BinaryPath("headway-worker");
  ChildProcess coordinator(
      net.ExecArgv(NetnsSide::kA, {BinaryPath("headway-coordinator"), "--config", config}),
      dir.path + "/coordinator.log");
  ChildProcess prefill(
      net.ExecArgv(NetnsSide::kA,
                   {worker, "--config", config, "--instance-id", "0", "--tp-rank", "0"},
                   {"UCX_NET_DEVICES=" + net.device(NetnsSide::kA)}),
      dir.path + "/prefill.log");
  ChildProcess decode(
      net.ExecArgv(NetnsSide::kB,
                   {worker, "--config", config, "--instance-id", "1", "--tp-rank", "0"},
                   {"UCX_NET_DEVICES=" + net.device(NetnsSide::kB)}),
      dir.path + "/decode.log");
  auto logs = [&] { return Tail(coordinator) + "\n" + Tail(prefill) + "\n" + Tail(decode); };

  // Every HTTP call below runs on a thread inside namespace A, the only
  // place the coordinator's address is reachable from.
  bool healthy = false;
  std::vector<std::string> disaggregated;
  std::string metrics_page;
  Status in_ns = net.RunInNamespace(NetnsSide::kA, [&] {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline && coordinator.Running() && prefill.Running() &&
           decode.Running()) {
      if (EveryInstanceReady(HttpGet(host_a, http_port, "/health", 5))) {
        healthy = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    if (!healthy) return;
    disaggregated = GreedyTexts(
        [&](const std::string& body) {
          return HttpPost(host_a, http_port, "/v1/completions", body, 60);
        },
        SmolLm2TransferPrompts(), kMaxTokens, kRounds);
    metrics_page = HttpGet(host_a, http_port, "/metrics", 10).body;
  });
  ASSERT_TRUE(in_ns.ok()) << in_ns.ToString();
  ASSERT_TRUE(healthy) << "the disaggregated deployment never became healthy\n" << logs();

  ASSERT_EQ(disaggregated.size(), colocated.size());
  for (size_t i = 0; i < colocated.size(); ++i) {
    EXPECT_EQ(disaggregated[i], colocated[i]) << "request " << i;
  }
  const double blocks_moved = SumOfSamples(metrics_page, "headway:kv_transfer_blocks_total");
  EXPECT_GT(blocks_moved, 0) << metrics_page;
  // The blocks crossed the veth: the decode side's end received at least
  // their bytes (SmolLM2's head_dim is 64; the default KV cache dtype).
  Result<uint64_t> received = net.ReceivedBytes(NetnsSide::kB);
  ASSERT_TRUE(received.ok()) << received.status().ToString();
  const double block_bytes =
      double(KvCacheLayout{options.block_size, 64, Config().kv_cache_dtype}.BlockBytes());
  EXPECT_GE(double(*received), blocks_moved * block_bytes)
      << "decode side's veth received " << *received << " bytes for " << blocks_moved
      << " blocks";
  EXPECT_EQ(SumOfSamples(metrics_page, "headway:kv_transfer_fallbacks_total"), 0) << metrics_page;
  if (HasFailure()) ADD_FAILURE() << logs();

  const auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  std::printf("[ info     ] colocated %.1f s, disaggregated across namespaces %.1f s, "
              "%.0f blocks moved, %.1f MB received by the decode side's veth\n",
              seconds(colocated_done - start), seconds(Clock::now() - colocated_done),
              blocks_moved, double(*received) / 1e6);
}

}  // namespace
}  // namespace headway::testing
