// headway-launch over ssh, with network namespaces as the hosts
// (tests/support/ssh_hosts.h: each runs its own sshd; the launcher runs in
// a namespace of its own). Deployments come up, answer as they do on one
// machine, run each worker in its host's namespace and leave nothing behind
// when stopped; the preflight refuses hosts it must refuse.
//
// Needs the model, root (network namespaces, sshd) and openssh-server;
// skips, saying which, without them.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/deployment.h"
#include "tests/support/netns_lan.h"
#include "tests/support/process.h"
#include "tests/support/prometheus_parser.h"
#include "tests/support/ssh_hosts.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxTokens = 16;

std::string Tail(const ChildProcess& p, size_t max_chars = 4000) {
  const std::string log = p.Log();
  return p.log_path() + ":\n" + (log.size() > max_chars ? log.substr(log.size() - max_chars) : log);
}

std::vector<nlohmann::json> Prompts() {
  const std::vector<std::string>& all = SmolLm2TestPrompts();
  return {all[0], all[1], all[2]};
}

// `pools_of(host_of)`: a pools list, with host_of(i) naming host i.
using PoolsOf = std::function<std::string(const std::function<std::string(int)>&)>;

// Greedy texts of headway-launch running `pools` all on this machine.
std::vector<std::string> LocalTexts(const std::string& pools, bool kv_transfer,
                                    const std::string& dir, std::string* error) {
  const int http_port = FreePort();
  const std::string config = dir + "/local.yaml";
  std::ofstream(config) << SshDeploymentYaml(pools, "127.0.0.1", http_port, FreePort(),
                                             kv_transfer, dir);
  ChildProcess launcher({BinaryPath("headway-launch"), config, "--model-dir",
                         std::filesystem::path(SmolLm2Path()).parent_path().string()},
                        dir + "/local-launch.log");
  const auto deadline = Clock::now() + std::chrono::seconds(90);
  while (Clock::now() < deadline && launcher.Running() &&
         !EveryInstanceReady(HttpGet(http_port, "/health", 5))) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (!EveryInstanceReady(HttpGet(http_port, "/health", 5))) {
    *error = "the local run never became ready\n" + Tail(launcher);
    return {};
  }
  std::vector<std::string> texts = GreedyTexts(
      [&](const std::string& body) { return HttpPost(http_port, "/v1/completions", body, 60); },
      Prompts(), kMaxTokens, 1);
  launcher.Signal(SIGINT);
  launcher.WaitExit(std::chrono::seconds(30));
  return texts;
}

// "ready at ... in 3.21 s" from the launcher's log; -1 if absent.
double ReadySeconds(const std::string& log) {
  const size_t at = log.find("headway: ready at ");
  if (at == std::string::npos) return -1;
  const size_t in = log.find(" in ", at);
  return in == std::string::npos ? -1 : std::atof(log.c_str() + in + 4);
}

// Bytes sent by member `i`'s network interfaces (loopback left out) so
// far, from /proc/net/dev as a thread in its namespace sees it; -1 if
// unreadable.
long long TxBytes(const NetnsLan& lan, int i) {
  long long total = -1;
  const Status joined = lan.RunInNamespace(i, [&] {
    std::istringstream dev(ReadText("/proc/thread-self/net/dev"));
    std::string line;
    while (std::getline(dev, line)) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos || line.find('|') != std::string::npos) continue;
      std::string name = line.substr(0, colon);
      name.erase(0, name.find_first_not_of(' '));
      if (name == "lo") continue;
      std::istringstream fields(line.substr(colon + 1));
      long long value = 0;
      for (int field = 0; field < 9 && fields >> value; ++field) {
      }
      total = std::max(total, 0LL) + value;  // the 9th field: transmitted bytes
    }
  });
  return joined.ok() ? total : -1;
}

// A deployment over ssh for RunOverSsh.
struct SshRun {
  int num_hosts = 1;
  // The pools list, with host_of(i) naming host i (1-based) — 127.0.0.1
  // for the local reference run, hostI over ssh.
  PoolsOf pools_of;
  // The local reference run's pools; "" = pools_of on 127.0.0.1.
  std::string reference_pools;
  // kv_transfer over UCX TCP; instance 0 is then the prefill instance.
  bool kv_transfer = false;
  // Which host (1-based) runs instance i's rank r.
  std::function<int(int instance, int rank)> host_of_worker;
  int stop_signal = SIGINT;
};

// The deployment `run` describes over ssh: it comes up, answers as the
// local reference run does, every worker runs in its host's namespace, a
// disaggregated one moves its KV blocks across hosts (the prefill host
// sends at least as many bytes as the coordinator counts moved) with no
// fallback to local prefill, and `stop_signal` to the launcher leaves
// nothing of Headway anywhere: SIGINT is a stop (exit status 0); after
// SIGKILL the ssh sessions die with the launcher and each remote agent sees
// its stdin end.
void RunOverSsh(const SshRun& run) {
  HW_REQUIRE_MODEL(SmolLm2Path());
  HW_SKIP_WITHOUT_SSHD();
  ScopedTempDir dir("headway-ssh-hosts");
  ASSERT_FALSE(dir.path.empty());
  std::string error;
  const std::string reference_pools =
      !run.reference_pools.empty() ? run.reference_pools
                                   : run.pools_of([](int) { return std::string("127.0.0.1"); });
  const std::vector<std::string> expected = LocalTexts(
      reference_pools, run.kv_transfer && run.reference_pools.empty(), dir.path, &error);
  ASSERT_FALSE(expected.empty()) << error;

  SshHosts hosts(dir.path, std::vector<HostState>(size_t(run.num_hosts), HostState::kServing));
  HW_SETUP_NETNS_LAN_OR_SKIP(hosts.lan());
  hosts.Start();
  if (::testing::Test::HasFatalFailure()) return;
  NetnsLan& lan = hosts.lan();

  const int http_port = FreePort();
  const std::string config = dir.path + "/ssh.yaml";
  std::ofstream(config) << SshDeploymentYaml(
                               run.pools_of([](int i) { return SshHosts::HostName(i); }),
                               "launchhost", http_port, FreePort(), run.kv_transfer, dir.path) +
                               hosts.LaunchSection();
  // The launcher's model dir is the real one; each host finds its own.
  const Clock::time_point launched = Clock::now();
  ChildProcess launcher(
      lan.ExecArgv(0, {BinaryPath("headway-launch"), config, "--model-dir",
                       std::filesystem::path(SmolLm2Path()).parent_path().string()}),
      dir.path + "/launch.log");

  bool ready = false;
  double ready_s = -1;
  Status in_ns = lan.RunInNamespace(0, [&] {
    const auto deadline = Clock::now() + std::chrono::seconds(90);
    while (Clock::now() < deadline && launcher.Running()) {
      if (EveryInstanceReady(HttpGet(http_port, "/health", 5))) {
        ready = true;
        ready_s = std::chrono::duration<double>(Clock::now() - launched).count();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  ASSERT_TRUE(in_ns.ok()) << in_ns.ToString();
  ASSERT_TRUE(ready) << "never ready over ssh\n" << Tail(launcher) << hosts.Logs();
  // The launcher's "ready" is its first /health 200 (possibly degraded),
  // probed every 1.2 s at most, so its line may come after the test saw
  // every instance ready; every instance ready is the test's own measure.
  const auto said_ready_by = Clock::now() + std::chrono::seconds(5);
  while (ReadySeconds(launcher.Log()) < 0 && Clock::now() < said_ready_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::printf("[ info     ] over ssh on %d hosts: headway-launch said ready after %.2f s, every "
              "instance ready after %.2f s (preflight included)\n",
              run.num_hosts, ReadySeconds(launcher.Log()), ready_s);

  const int prefill_host = run.kv_transfer ? run.host_of_worker(0, 0) : 0;
  const long long tx_before = run.kv_transfer ? TxBytes(lan, prefill_host) : 0;
  std::vector<std::string> got;
  std::string metrics_page;
  in_ns = lan.RunInNamespace(0, [&] {
    got = GreedyTexts(
        [&](const std::string& body) { return HttpPost(http_port, "/v1/completions", body, 60); },
        Prompts(), kMaxTokens, 1);
    metrics_page = HttpGet(http_port, "/metrics", 10).body;
  });
  ASSERT_TRUE(in_ns.ok()) << in_ns.ToString();
  if (run.kv_transfer) {
    // UCX runs on TCP alone (kv_transfer.transports); the bytes it moved
    // left the prefill host through its network interface.
    const long long tx_bytes = TxBytes(lan, prefill_host) - tx_before;
    const double kv_bytes = SumOfSamples(metrics_page, "headway:kv_transfer_bytes_total");
    EXPECT_GT(SumOfSamples(metrics_page, "headway:kv_transfer_blocks_total"), 0) << metrics_page;
    EXPECT_GT(kv_bytes, 0) << metrics_page;
    EXPECT_GE(double(tx_bytes), kv_bytes) << "the prefill host sent less than the KV bytes moved";
    EXPECT_EQ(SumOfSamples(metrics_page, "headway:kv_transfer_fallbacks_total"), 0) << metrics_page;
    std::printf("[ info     ] KV bytes moved %.0f (%.0f blocks); %s sent %lld bytes meanwhile\n",
                kv_bytes, SumOfSamples(metrics_page, "headway:kv_transfer_blocks_total"),
                SshHosts::HostName(prefill_host).c_str(), tx_bytes);
  }
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_FALSE(IsErrorText(got[i])) << got[i];
    EXPECT_EQ(got[i], expected[i]) << "prompt " << i;
  }

  // Every worker and agent runs in its host's namespace; the coordinator
  // beside the launcher.
  int num_workers = 0;
  for (const ProcInfo& p : HeadwayProcessesOf(dir.path)) {
    if (p.cmdline.find("headway-coordinator") != std::string::npos) {
      EXPECT_EQ(p.net_ns, NamespaceInode(lan.name(0))) << p.cmdline;
      continue;
    }
    if (p.cmdline.find("headway-worker") == std::string::npos) continue;
    const int instance = FlagValue(p.cmdline, "--instance-id");
    const int rank = FlagValue(p.cmdline, "--tp-rank");
    const int host = run.host_of_worker(instance, rank);
    EXPECT_EQ(p.net_ns, NamespaceInode(lan.name(host)))
        << "worker i" << instance << "r" << rank << " (pid " << p.pid << ") should run on "
        << SshHosts::HostName(host);
    ++num_workers;
  }
  EXPECT_GT(num_workers, 0);

  const int stop_signal = run.stop_signal;
  launcher.Signal(stop_signal);
  const int status = launcher.WaitExit(std::chrono::seconds(60));
  if (stop_signal == SIGINT) {
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << Tail(launcher);
  } else {
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == stop_signal) << Tail(launcher);
  }
  // Nothing of Headway is left in any namespace.
  std::vector<ino_t> namespaces;
  for (int i = 0; i < lan.num_members(); ++i) namespaces.push_back(NamespaceInode(lan.name(i)));
  const auto deadline = Clock::now() + std::chrono::seconds(stop_signal == SIGINT ? 10 : 30);
  std::vector<std::string> left;
  do {
    left.clear();
    for (const ProcInfo& p : Processes()) {
      const bool in_lan =
          std::find(namespaces.begin(), namespaces.end(), p.net_ns) != namespaces.end();
      if ((in_lan || p.cmdline.find(dir.path) != std::string::npos) &&
          (IsHeadwayProcess(p) || p.cmdline.find("bin/headway-launch") != std::string::npos)) {
        left.push_back(std::to_string(p.pid) + ": " + p.cmdline);
      }
    }
    if (left.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } while (Clock::now() < deadline);
  for (const std::string& p : left) {
    ADD_FAILURE() << "still running after " << strsignal(stop_signal) << ": " << p;
  }
  if (::testing::Test::HasFailure()) ADD_FAILURE() << Tail(launcher) << hosts.Logs();
}

// A prefill instance on host1 and a decode instance on host2: the KV blocks
// cross between hosts over UCX on TCP. A few seconds: the default suite's
// multi-host test.
TEST(SshHostsTest, DisaggregatedPairOnTwoHostsServesAsLocalRun) {
  RunOverSsh({.num_hosts = 2,
              .pools_of =
                  [](const std::function<std::string(int)>& host) {
                    return "pools:\n"
                           "  - name: prefill\n    role: prefill\n    instances:\n"
                           "      - {tp_size: 1, device: cpu, hosts: [" + host(1) +
                           "], num_threads: 1}\n"
                           "  - name: decode\n    role: decode\n    instances:\n"
                           "      - {tp_size: 1, device: cpu, hosts: [" + host(2) +
                           "], num_threads: 1}\n";
                  },
              .kv_transfer = true,
              .host_of_worker = [](int instance, int) { return instance + 1; }});
}

// deploy/configs/pd-hetero.yaml across three hosts: prefill at TP 1 on
// host1, decode at TP 3 on host2 (rank 0) and host3 (ranks 1 and 2, Gloo
// between the hosts). Each KV head goes from host1 to the host of the
// decode rank that owns it. Greedy outputs equal a colocated (mixed TP 1)
// run's. About 50 s on two cores, the local reference run included.
TEST(SshHostsTest, PdHeteroAcrossThreeHostsServesAsColocatedRun) {
  RunOverSsh({.num_hosts = 3,
              .pools_of =
                  [](const std::function<std::string(int)>& host) {
                    return "pools:\n"
                           "  - name: prefill\n    role: prefill\n    instances:\n"
                           "      - {tp_size: 1, device: cpu, hosts: [" + host(1) +
                           "], num_threads: 1}\n"
                           "  - name: decode\n    role: decode\n    instances:\n"
                           "      - {tp_size: 3, device: cpu, hosts: [" + host(2) + ", " +
                           host(3) + ", " + host(3) + "], num_threads: 1, collective: gloo}\n";
                  },
              .reference_pools = "pools:\n  - name: main\n    role: mixed\n    instances:\n"
                                 "      - {tp_size: 1, device: cpu, hosts: [127.0.0.1], "
                                 "num_threads: 1}\n",
              .kv_transfer = true,
              .host_of_worker = [](int instance, int rank) {
                return instance == 0 ? 1 : rank == 0 ? 2 : 3;
              }});
}

// One TP group of 3 ranks, a rank per host, all-reducing over Gloo across
// the bridge. About 30 s on two cores: labelled slow.
TEST(SshHostsTest, TpGroupAcrossThreeHostsServesAsLocalRunSlow) {
  RunOverSsh({.num_hosts = 3,
              .pools_of =
                  [](const std::function<std::string(int)>& host) {
                    return "pools:\n  - name: main\n    role: mixed\n    instances:\n"
                           "      - {tp_size: 3, device: cpu, hosts: [" + host(1) + ", " +
                           host(2) + ", " + host(3) + "], num_threads: 1, collective: gloo}\n";
                  },
              .host_of_worker = [](int, int rank) { return rank + 1; }});
}

// The launcher killed outright (no chance to stop anything itself): its
// ssh sessions die with it (PR_SET_PDEATHSIG), and every remote agent,
// its stdin ended, stops its workers. Labelled slow.
TEST(SshHostsTest, KilledLauncherLeavesNothingOnAnyHostSlow) {
  RunOverSsh({.num_hosts = 2,
              .pools_of =
                  [](const std::function<std::string(int)>& host) {
                    return "pools:\n  - name: main\n    role: mixed\n    instances:\n"
                           "      - {tp_size: 1, device: cpu, hosts: [" + host(1) +
                           "], num_threads: 1}\n"
                           "      - {tp_size: 1, device: cpu, hosts: [" + host(2) +
                           "], num_threads: 1}\n";
                  },
              .host_of_worker = [](int instance, int) { return instance + 1; },
              .stop_signal = SIGKILL});
}

// A launch that the preflight on host2 refuses: exit status 2, a message
// naming host2 and containing `problem`, and nothing started anywhere.
// `spoil`, when given, changes the test's directory before the launch; the
// hosts share the file system, so then host1 must be refused as well.
void ExpectRefused(HostState host2, const std::string& problem,
                   const std::function<void(const std::string& dir)>& spoil = nullptr) {
  HW_REQUIRE_MODEL(SmolLm2Path());
  HW_SKIP_WITHOUT_SSHD();
  ScopedTempDir dir("headway-ssh-hosts");
  ASSERT_FALSE(dir.path.empty());
  SshHosts hosts(dir.path, {HostState::kServing, host2});
  HW_SETUP_NETNS_LAN_OR_SKIP(hosts.lan());
  hosts.Start();
  if (::testing::Test::HasFatalFailure()) return;
  const std::string config = dir.path + "/ssh.yaml";
  const std::string pools =
      "pools:\n  - name: main\n    role: mixed\n    instances:\n"
      "      - {tp_size: 1, device: cpu, hosts: [host1], num_threads: 1}\n"
      "      - {tp_size: 1, device: cpu, hosts: [host2], num_threads: 1}\n";
  std::ofstream(config) << SshDeploymentYaml(pools, "launchhost", FreePort(), FreePort(), false,
                                             dir.path) +
                               hosts.LaunchSection();
  if (spoil) spoil(dir.path);
  ChildProcess launcher(
      hosts.lan().ExecArgv(0, {BinaryPath("headway-launch"), config, "--model-dir",
                               std::filesystem::path(SmolLm2Path()).parent_path().string()}),
      dir.path + "/launch.log");
  const int status = launcher.WaitExit(std::chrono::seconds(60));
  ASSERT_TRUE(WIFEXITED(status)) << Tail(launcher);
  EXPECT_EQ(WEXITSTATUS(status), 2) << Tail(launcher);
  const std::string log = launcher.Log();
  EXPECT_NE(log.find("preflight: host host2: "), std::string::npos) << log;
  EXPECT_NE(log.find(problem), std::string::npos) << log;
  if (spoil) {
    // Each line names its host, then the key.
    EXPECT_NE(log.find("preflight: host host2: " + problem), std::string::npos) << log;
    EXPECT_NE(log.find("preflight: host host1: " + problem), std::string::npos) << log;
  } else {
    EXPECT_EQ(log.find("preflight: host host1"), std::string::npos) << log;
  }
  EXPECT_EQ(log.find("headway: started"), std::string::npos) << log;
  EXPECT_TRUE(HeadwayProcessesOf(dir.path).empty());
  std::printf("[ info     ] %s", log.c_str());
}

TEST(SshHostsTest, PreflightRefusesAHostWithoutTheModel) {
  ExpectRefused(HostState::kNoModel, "not found (copy the model there, or set launch.model_dir)");
}

TEST(SshHostsTest, PreflightRefusesAHostWithADifferentModelFile) {
  ExpectRefused(HostState::kWrongModel, "has checksum xxh64:");
}

TEST(SshHostsTest, PreflightRefusesAnUnreachableHost) {
  ExpectRefused(HostState::kNoSshd, "cannot run a command there over ssh");
}

// The workers' secret key readable by every user, and then their copy of
// the coordinator's public key missing: refused before anything starts,
// naming the host, the config key and the path.
TEST(SshHostsTest, PreflightRefusesWorkerKeyFilesThatAreMissingOrNotPrivate) {
  ExpectRefused(HostState::kServing, "security.client_key = ", [](const std::string& dir) {
    ASSERT_EQ(chmod((dir + "/keys/worker.key_secret").c_str(), 0644), 0);
  });
  // (ScopedTempDir made a fresh directory, with fresh keys, for this one.)
  ExpectRefused(HostState::kServing, "security.coordinator_public_key = ", [](const std::string& dir) {
    ASSERT_EQ(std::remove((dir + "/keys/coordinator.key").c_str()), 0);
  });
}

}  // namespace
}  // namespace headway::testing
