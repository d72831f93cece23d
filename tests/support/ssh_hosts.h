// Hosts reached over ssh for multi-host tests of headway-launch: network
// namespaces on one bridge (tests/support/netns_lan.h), each but the first
// running its own sshd (Debian's openssh-server) on port 22 of its address,
// with an /etc/hosts naming every host. Member 0 is the machine the
// launcher (and so the coordinator) runs on, "launchhost"; member i >= 1 is
// "host<i>". A throwaway host key and client key, a known_hosts file
// listing the host key, and the `launch:` section pointing at both let ssh
// run with BatchMode and strict host key checking as between machines.
// Each sshd sets HEADWAY_MODEL_DIR for its sessions (sshd_config SetEnv):
// that host's model directory, so one host can lack the model or hold a
// different file.
//
// What a real cluster adds and this does not: separate file systems (all
// hosts see the same binaries and config at the same paths), separate
// kernels and clocks, and real network latency.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/support/netns_lan.h"
#include "tests/support/process.h"

namespace headway::testing {

// What one remote host does when the launcher calls.
enum class HostState { kServing, kNoModel, kWrongModel, kNoSshd };

// Owns the LAN and the sshd processes (stopped before the LAN goes). Not
// thread-safe: use from the test's main thread.
class SshHosts {
 public:
  // `dir`: an existing directory for keys, configs and logs. One remote
  // host per entry of `states`. Creates nothing yet.
  SshHosts(const std::string& dir, std::vector<HostState> states);
  ~SshHosts();

  // Set up with HW_SETUP_NETNS_LAN_OR_SKIP(hosts.lan()) before Start().
  NetnsLan& lan() { return lan_; }
  static std::string HostName(int i) { return "host" + std::to_string(i); }
  int num_hosts() const { return int(states_.size()); }

  // Keys, /etc/hosts, known_hosts, one sshd per host not kNoSshd; waits (up
  // to 10 s each) until each listens. Reports any error as a fatal test
  // failure (check ::testing::Test::HasFatalFailure()).
  void Start();

  // The config's `launch:` section pointing at the test's keys.
  std::string LaunchSection() const;

  // The tail of every sshd's log.
  std::string Logs() const;

 private:
  std::string dir_;
  std::vector<HostState> states_;
  NetnsLan lan_;
  std::vector<std::unique_ptr<ChildProcess>> sshd_;
};

// True, with the reason in *why, when this machine cannot run SshHosts:
// not root, or no sshd / ssh-keygen (openssh-server; deploy/setup.sh).
bool CannotRunSshHosts(std::string* why);

// A deployment YAML on SmolLm2Path()'s file name (each host resolves it in
// its own model dir) with `pools` (a `pools:` list naming hosts): the
// coordinator's HTTP on every interface at `http_port`, its control
// endpoint bound on every interface and dialled at
// tcp://`coordinator_host`:`control_port`; kv_transfer over UCX TCP when
// `kv_transfer`. The control port is reachable from other hosts, so it is
// authenticated with CurveZMQ keys made in `keys_dir` (ControlPlaneKeysYaml;
// the hosts share the file system).
std::string SshDeploymentYaml(const std::string& pools, const std::string& coordinator_host,
                              int http_port, int control_port, bool kv_transfer,
                              const std::string& keys_dir);

// A process as /proc shows it.
struct ProcInfo {
  pid_t pid = 0;
  std::string cmdline;  // arguments joined with spaces
  ino_t net_ns = 0;     // inode of its network namespace
};

// Every process of this machine.
std::vector<ProcInfo> Processes();

// Inode of the network namespace `ip netns` calls `netns_name`; 0 if none.
ino_t NamespaceInode(const std::string& netns_name);

// True for a Headway binary (build/bin/headway-...) other than the
// launcher, or an ssh client or shell running one.
bool IsHeadwayProcess(const ProcInfo& p);

// Headway processes whose command line names `dir` (a test's directory).
std::vector<ProcInfo> HeadwayProcessesOf(const std::string& dir);

// The value after `flag` in a command line ("--instance-id 3" -> 3); -1
// when absent.
int FlagValue(const std::string& cmdline, const std::string& flag);

}  // namespace headway::testing

// In a TEST body: skip, saying why, where CannotRunSshHosts.
#define HW_SKIP_WITHOUT_SSHD()                                                      \
  do {                                                                              \
    std::string hw_why_;                                                            \
    if (::headway::testing::CannotRunSshHosts(&hw_why_)) GTEST_SKIP() << hw_why_;   \
  } while (0)
