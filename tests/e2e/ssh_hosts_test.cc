// headway-launch over ssh, with network namespaces as the hosts: one
// namespace is the machine the launcher (and so the coordinator) runs on,
// each of the others runs its own sshd (Debian's openssh-server) on port 22
// of its address, all on one bridge (tests/support/netns_lan.h) with an
// /etc/hosts naming every host. The test makes a throwaway host key and
// client key, lists the host key in a known_hosts file and points the
// config's `launch:` section at both, so ssh runs with BatchMode and strict
// host key checking as it would between machines. Each sshd sets
// HEADWAY_MODEL_DIR for its sessions (sshd_config SetEnv): that host's
// model directory, so one host can lack the model or hold a different file.
//
// What a real cluster adds and this does not: separate file systems (all
// hosts here see the same binaries and config at the same paths, which is
// what the preflight checks for anyway), separate kernels and clocks, and
// real network latency.
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
#include <memory>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/control_keys.h"
#include "tests/support/deployment.h"
#include "tests/support/netns_lan.h"
#include "tests/support/process.h"
#include "tests/support/prometheus_parser.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxTokens = 16;
constexpr char kSshd[] = "/usr/sbin/sshd";
constexpr char kSshKeygen[] = "/usr/bin/ssh-keygen";

std::string Tail(const ChildProcess& p, size_t max_chars = 4000) {
  const std::string log = p.Log();
  return p.log_path() + ":\n" + (log.size() > max_chars ? log.substr(log.size() - max_chars) : log);
}

// The first sample of `name` in a Prometheus text page; -1 if absent.
double Metric(const std::string& page, const std::string& name) {
  Result<PromExposition> metrics = ParsePrometheusText(page);
  if (!metrics.ok()) return -1;
  std::vector<const PromSample*> samples = metrics->Samples(name);
  return samples.empty() ? -1 : samples[0]->value;
}

std::vector<nlohmann::json> Prompts() {
  const std::vector<std::string>& all = SmolLm2TestPrompts();
  return {all[0], all[1], all[2]};
}

// Runs `argv` to completion; true when it exits 0.
bool RunToEnd(const std::vector<std::string>& argv, const std::string& log) {
  ChildProcess p(argv, log);
  const int status = p.WaitExit(std::chrono::seconds(30));
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// A process as /proc shows it.
struct ProcInfo {
  pid_t pid = 0;
  std::string cmdline;  // arguments joined with spaces
  ino_t net_ns = 0;     // inode of its network namespace
};

std::vector<ProcInfo> Processes() {
  std::vector<ProcInfo> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    ProcInfo info;
    info.pid = pid_t(std::stol(name));
    std::string raw = ReadText(entry.path().string() + "/cmdline");
    for (char& c : raw) {
      if (c == '\0') c = ' ';
    }
    info.cmdline = raw;
    struct stat st;
    if (stat((entry.path().string() + "/ns/net").c_str(), &st) == 0) info.net_ns = st.st_ino;
    out.push_back(info);
  }
  return out;
}

ino_t NamespaceInode(const std::string& netns_name) {
  struct stat st;
  return stat(("/run/netns/" + netns_name).c_str(), &st) == 0 ? st.st_ino : 0;
}

// What one remote host does when the launcher calls.
enum class HostState { kServing, kNoModel, kWrongModel, kNoSshd };

// Member 0 of the LAN is the launch host ("launchhost"); member i >= 1 is
// "host<i>", running sshd unless its state is kNoSshd.
class SshHosts {
 public:
  SshHosts(const std::string& dir, std::vector<HostState> states)
      : dir_(dir), states_(std::move(states)), lan_("ssh", int(states_.size()) + 1) {}
  ~SshHosts() { sshd_.clear(); }  // before the LAN goes

  NetnsLan& lan() { return lan_; }
  static std::string HostName(int i) { return "host" + std::to_string(i); }
  int num_hosts() const { return int(states_.size()); }

  // Keys, /etc/hosts, known_hosts, one sshd per serving host; waits until
  // each listens. Fails the test on any error.
  void Start() {
    ASSERT_TRUE(RunToEnd({kSshKeygen, "-q", "-t", "ed25519", "-N", "", "-f", dir_ + "/host_key"},
                         dir_ + "/keygen.log"));
    ASSERT_TRUE(RunToEnd({kSshKeygen, "-q", "-t", "ed25519", "-N", "", "-f", dir_ + "/client_key"},
                         dir_ + "/keygen.log"));
    std::filesystem::copy_file(dir_ + "/client_key.pub", dir_ + "/authorized_keys");
    std::istringstream host_pub(ReadText(dir_ + "/host_key.pub"));
    std::string key_type, key_body;
    host_pub >> key_type >> key_body;
    std::string hosts = "127.0.0.1 localhost\n" + lan_.address(0) + " launchhost\n";
    std::ofstream known(dir_ + "/known_hosts");
    for (int i = 1; i <= num_hosts(); ++i) {
      hosts += lan_.address(i) + " " + HostName(i) + "\n";
      known << HostName(i) << "," << lan_.address(i) << " " << key_type << " " << key_body << "\n";
    }
    known.close();
    ASSERT_TRUE(lan_.WriteHosts(hosts).ok());
    // sshd's privilege separation directory (the ssh.service unit makes it).
    std::error_code ec;
    std::filesystem::create_directories("/run/sshd", ec);

    const std::string model_dir = std::filesystem::path(SmolLm2Path()).parent_path().string();
    for (int i = 1; i <= num_hosts(); ++i) {
      const HostState state = states_[size_t(i - 1)];
      if (state == HostState::kNoSshd) continue;
      std::string host_models = model_dir;
      if (state != HostState::kServing) {
        host_models = dir_ + "/models-" + HostName(i);
        std::filesystem::create_directories(host_models);
      }
      if (state == HostState::kWrongModel) {
        // Same name and size, other bytes: only the checksum tells.
        const std::string path = host_models + "/" +
                                 std::filesystem::path(SmolLm2Path()).filename().string();
        std::ofstream(path, std::ios::binary).close();
        std::filesystem::resize_file(path, std::filesystem::file_size(SmolLm2Path()));
      }
      const std::string config = dir_ + "/sshd_config-" + HostName(i);
      std::ofstream(config) << "ListenAddress " << lan_.address(i) << ":22\n"
                            << "HostKey " << dir_ << "/host_key\n"
                            << "AuthorizedKeysFile " << dir_ << "/authorized_keys\n"
                            << "PidFile none\n"
                            << "UsePAM no\n"
                            << "StrictModes no\n"
                            << "PermitRootLogin prohibit-password\n"
                            << "PubkeyAuthentication yes\n"
                            << "PasswordAuthentication no\n"
                            << "KbdInteractiveAuthentication no\n"
                            << "SetEnv HEADWAY_MODEL_DIR=" << host_models << "\n";
      sshd_.push_back(std::make_unique<ChildProcess>(
          lan_.ExecArgv(i, {kSshd, "-D", "-e", "-f", config}),
          dir_ + "/sshd-" + HostName(i) + ".log"));
    }
    for (int i = 1; i <= num_hosts(); ++i) {
      if (states_[size_t(i - 1)] == HostState::kNoSshd) continue;
      bool listening = false;
      const std::string address = lan_.address(i);
      const Status joined = lan_.RunInNamespace(0, [&] {
        const auto deadline = Clock::now() + std::chrono::seconds(10);
        while (!listening && Clock::now() < deadline) {
          const int fd = socket(AF_INET, SOCK_STREAM, 0);
          sockaddr_in sa{};
          sa.sin_family = AF_INET;
          sa.sin_port = htons(22);
          inet_pton(AF_INET, address.c_str(), &sa.sin_addr);
          listening = connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
          close(fd);
          if (!listening) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      });
      ASSERT_TRUE(joined.ok()) << joined.ToString();
      ASSERT_TRUE(listening) << HostName(i) << "'s sshd does not listen\n" << Logs();
    }
  }

  // The `launch:` section pointing at the test's keys.
  std::string LaunchSection() const {
    return "launch:\n  user: root\n  port: 22\n  key: " + dir_ + "/client_key\n  known_hosts: " +
           dir_ + "/known_hosts\n  connect_timeout_s: 5\n";
  }

  std::string Logs() const {
    std::string all;
    for (const auto& p : sshd_) all += Tail(*p, 1500) + "\n";
    return all;
  }

 private:
  std::string dir_;
  std::vector<HostState> states_;
  NetnsLan lan_;
  std::vector<std::unique_ptr<ChildProcess>> sshd_;
};

bool Skipping(std::string* why) {
  if (geteuid() != 0) {
    *why = "needs root (network namespaces, sshd)";
    return true;
  }
  if (access(kSshd, X_OK) != 0 || access(kSshKeygen, X_OK) != 0) {
    *why = std::string(kSshd) + " not found: install openssh-server (deploy/setup.sh)";
    return true;
  }
  return false;
}

#define SKIP_WITHOUT_SSHD()                      \
  do {                                           \
    std::string why_;                            \
    if (Skipping(&why_)) GTEST_SKIP() << why_;   \
  } while (0)

// The deployment's YAML: `pools` (a `pools:` list naming hosts), the
// coordinator on `coordinator_host` (the launch host's name, or 127.0.0.1),
// its control port authenticated with keys made in `dir` (the hosts share
// the file system).
std::string ConfigYaml(const std::string& pools, const std::string& coordinator_host,
                       int http_port, int control_port, bool kv_transfer, const std::string& dir) {
  std::string keys_error;
  const std::string security = ControlPlaneKeysYaml(dir, &keys_error);
  EXPECT_TRUE(keys_error.empty()) << keys_error;
  std::string yaml = "model:\n  path: " +
                     std::filesystem::path(SmolLm2Path()).filename().string() +
                     "\n  served_name: smollm2\n"
                     "coordinator:\n  http_host: 0.0.0.0\n  http_port: " +
                     std::to_string(http_port) + "\n  control_address: tcp://" +
                     coordinator_host + ":" + std::to_string(control_port) +
                     "\n  control_bind: tcp://0.0.0.0:" + std::to_string(control_port) +
                     "\ncache:\n  block_size: 16\n  kv_memory_mb: 64\n"
                     "scheduler:\n  max_num_seqs: 8\n  max_num_batched_tokens: 256\n"
                     "  max_model_len: 1024\n";
  if (kv_transfer) yaml += "kv_transfer:\n  transports: tcp\n  timeout_ms: 5000\n";
  return yaml + security + pools;
}

// `pools_of(host_of)`: the pools list, with host_of(i) naming host i
// (1-based) — 127.0.0.1 for the local reference run, hostI over ssh.
using PoolsOf = std::function<std::string(const std::function<std::string(int)>&)>;

// Greedy texts of headway-launch running `pools` all on this machine.
std::vector<std::string> LocalTexts(const PoolsOf& pools_of, bool kv_transfer,
                                    const std::string& dir, std::string* error) {
  const int http_port = FreePort();
  const std::string config = dir + "/local.yaml";
  std::ofstream(config) << ConfigYaml(pools_of([](int) { return std::string("127.0.0.1"); }),
                                      "127.0.0.1", http_port, FreePort(), kv_transfer, dir);
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

// A Headway binary (build/bin/headway-...) other than the launcher, or an
// ssh client or shell running one.
bool IsHeadwayProcess(const ProcInfo& p) {
  return p.cmdline.find("bin/headway-") != std::string::npos &&
         p.cmdline.find("bin/headway-launch") == std::string::npos;
}

// Processes of this test's deployment: their command line names its directory.
std::vector<ProcInfo> HeadwayProcessesOf(const std::string& dir) {
  std::vector<ProcInfo> found;
  for (const ProcInfo& p : Processes()) {
    if (p.cmdline.find(dir) != std::string::npos && IsHeadwayProcess(p)) found.push_back(p);
  }
  return found;
}

// The deployment `pools_of` describes on `num_hosts` hosts over ssh: it
// comes up, answers as the local run does, every worker runs in its host's
// namespace, and `stop_signal` to the launcher leaves nothing of Headway
// anywhere: SIGINT is a stop (exit status 0); after SIGKILL the ssh
// sessions die with the launcher and each remote agent sees its stdin end.
// `host_of_worker`: which host (1-based) runs instance i's rank r.
void RunOverSsh(int num_hosts, const PoolsOf& pools_of, bool kv_transfer,
                const std::function<int(int instance, int rank)>& host_of_worker,
                int stop_signal = SIGINT) {
  HW_REQUIRE_MODEL(SmolLm2Path());
  SKIP_WITHOUT_SSHD();
  ScopedTempDir dir("headway-ssh-hosts");
  ASSERT_FALSE(dir.path.empty());
  std::string error;
  const std::vector<std::string> expected = LocalTexts(pools_of, kv_transfer, dir.path, &error);
  ASSERT_FALSE(expected.empty()) << error;

  SshHosts hosts(dir.path, std::vector<HostState>(size_t(num_hosts), HostState::kServing));
  HW_SETUP_NETNS_LAN_OR_SKIP(hosts.lan());
  hosts.Start();
  if (::testing::Test::HasFatalFailure()) return;
  NetnsLan& lan = hosts.lan();

  const int http_port = FreePort();
  const std::string config = dir.path + "/ssh.yaml";
  std::ofstream(config) << ConfigYaml(pools_of([](int i) { return SshHosts::HostName(i); }),
                                      "launchhost", http_port, FreePort(), kv_transfer,
                                      dir.path) +
                               hosts.LaunchSection();
  // The launcher's model dir is the real one; each host finds its own.
  const Clock::time_point launched = Clock::now();
  ChildProcess launcher(
      lan.ExecArgv(0, {BinaryPath("headway-launch"), config, "--model-dir",
                       std::filesystem::path(SmolLm2Path()).parent_path().string()}),
      dir.path + "/launch.log");

  bool ready = false;
  double ready_s = -1;
  std::vector<std::string> got;
  std::string metrics_page;
  const Status in_ns = lan.RunInNamespace(0, [&] {
    const auto deadline = Clock::now() + std::chrono::seconds(90);
    while (Clock::now() < deadline && launcher.Running()) {
      if (EveryInstanceReady(HttpGet(http_port, "/health", 5))) {
        ready = true;
        ready_s = std::chrono::duration<double>(Clock::now() - launched).count();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!ready) return;
    got = GreedyTexts(
        [&](const std::string& body) { return HttpPost(http_port, "/v1/completions", body, 60); },
        Prompts(), kMaxTokens, 1);
    metrics_page = HttpGet(http_port, "/metrics", 10).body;
  });
  ASSERT_TRUE(in_ns.ok()) << in_ns.ToString();
  ASSERT_TRUE(ready) << "never ready over ssh\n" << Tail(launcher) << hosts.Logs();
  // The launcher's "ready" is its first /health 200 (possibly degraded);
  // every instance ready is the test's own measure.
  std::printf("[ info     ] over ssh on %d hosts: headway-launch said ready after %.2f s, every "
              "instance ready after %.2f s (preflight included)\n",
              num_hosts, ReadySeconds(launcher.Log()), ready_s);
  if (kv_transfer) {
    EXPECT_GT(Metric(metrics_page, "headway:kv_transfer_blocks_total"), 0) << metrics_page;
    EXPECT_EQ(Metric(metrics_page, "headway:kv_transfer_fallbacks_total"), 0) << metrics_page;
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
    std::istringstream words(p.cmdline);
    std::string word;
    int instance = -1, rank = -1;
    while (words >> word) {
      if (word == "--instance-id") words >> instance;
      if (word == "--tp-rank") words >> rank;
    }
    const int host = host_of_worker(instance, rank);
    EXPECT_EQ(p.net_ns, NamespaceInode(lan.name(host)))
        << "worker i" << instance << "r" << rank << " (pid " << p.pid << ") should run on "
        << SshHosts::HostName(host);
    ++num_workers;
  }
  EXPECT_GT(num_workers, 0);

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
  RunOverSsh(
      2,
      [](const std::function<std::string(int)>& host) {
        return "pools:\n"
               "  - name: prefill\n    role: prefill\n    instances:\n"
               "      - {tp_size: 1, device: cpu, hosts: [" + host(1) + "], num_threads: 1}\n"
               "  - name: decode\n    role: decode\n    instances:\n"
               "      - {tp_size: 1, device: cpu, hosts: [" + host(2) + "], num_threads: 1}\n";
      },
      true, [](int instance, int) { return instance + 1; });
}

// One TP group of 3 ranks, a rank per host, all-reducing over Gloo across
// the bridge. About 30 s on two cores: labelled slow.
TEST(SshHostsTest, TpGroupAcrossThreeHostsServesAsLocalRunSlow) {
  RunOverSsh(
      3,
      [](const std::function<std::string(int)>& host) {
        return "pools:\n  - name: main\n    role: mixed\n    instances:\n"
               "      - {tp_size: 3, device: cpu, hosts: [" + host(1) + ", " + host(2) + ", " +
               host(3) + "], num_threads: 1, collective: gloo}\n";
      },
      false, [](int, int rank) { return rank + 1; });
}

// The launcher killed outright (no chance to stop anything itself): its
// ssh sessions die with it (PR_SET_PDEATHSIG), and every remote agent,
// its stdin ended, stops its workers. Labelled slow.
TEST(SshHostsTest, KilledLauncherLeavesNothingOnAnyHostSlow) {
  RunOverSsh(
      2,
      [](const std::function<std::string(int)>& host) {
        return "pools:\n  - name: main\n    role: mixed\n    instances:\n"
               "      - {tp_size: 1, device: cpu, hosts: [" + host(1) + "], num_threads: 1}\n"
               "      - {tp_size: 1, device: cpu, hosts: [" + host(2) + "], num_threads: 1}\n";
      },
      false, [](int instance, int) { return instance + 1; }, SIGKILL);
}

// A launch that the preflight on host2 refuses: exit status 2, a message
// naming host2 and containing `problem`, and nothing started anywhere.
void ExpectRefused(HostState host2, const std::string& problem) {
  HW_REQUIRE_MODEL(SmolLm2Path());
  SKIP_WITHOUT_SSHD();
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
  std::ofstream(config) << ConfigYaml(pools, "launchhost", FreePort(), FreePort(), false,
                                      dir.path) +
                               hosts.LaunchSection();
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
  EXPECT_EQ(log.find("preflight: host host1"), std::string::npos) << log;
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

}  // namespace
}  // namespace headway::testing
