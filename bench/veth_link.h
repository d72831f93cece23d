// Two network namespaces joined by a veth pair, for headway-kv-transfer-bench
// --veth: the receiver and the sender (and ucx_perftest's server and client)
// share nothing but one TCP link, as two hosts would.
//
//   namespace hwbench-<pid>-a: device hwb<pid>a, 10.202.0.1/24, lo up
//   namespace hwbench-<pid>-b: device hwb<pid>b, 10.202.0.2/24, lo up
//
// Header-only, because tests/support/netns.h is built on gtest. Needs root
// and iproute2's `ip`. The namespaces (and with them the veth pair) are
// deleted by the destructor and, on SIGINT / SIGTERM / SIGHUP, by a signal
// handler that runs `ip netns del` (fork + execv: async-signal-safe) and
// exits; namespaces that a SIGKILLed run left behind are deleted by the next
// run's Setup().
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace headway::bench {

// The signal handler sees only these (a handler cannot reach an object):
// argv of the `ip netns del` commands, written before the handler is set.
inline char g_veth_ip[64];
inline char g_veth_ns[2][64];

inline void DeleteNamespacesFromSignal(int sig) {
  for (char* ns : g_veth_ns) {
    const pid_t pid = fork();
    if (pid == 0) {
      char netns[] = "netns", del[] = "del";
      char* argv[] = {g_veth_ip, netns, del, ns, nullptr};
      execv(g_veth_ip, argv);
      _exit(127);
    }
    if (pid > 0) waitpid(pid, nullptr, 0);
  }
  _exit(128 + sig);
}

class VethLink {
 public:
  VethLink() {
    const std::string id = std::to_string(getpid());
    ns_[0] = "hwbench-" + id + "-a";
    ns_[1] = "hwbench-" + id + "-b";
    dev_[0] = "hwb" + id + "a";  // interface names: at most 15 bytes
    dev_[1] = "hwb" + id + "b";
  }
  ~VethLink() {
    for (int i = 0; i < 2; ++i) {
      if (created_[i]) Run(ip_ + " netns del " + ns_[i]);
    }
  }
  VethLink(const VethLink&) = delete;
  VethLink& operator=(const VethLink&) = delete;

  // Creates both namespaces and the pair, addresses and raises both ends and
  // waits until the kernel reports them UP (UCX skips interfaces that are
  // not running). Returns "" or what failed.
  std::string Setup() {
    if (geteuid() != 0) return "--veth needs root (it creates network namespaces)";
    for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
      if (access(path, X_OK) == 0) ip_ = path;
    }
    if (ip_.empty()) return "--veth needs iproute2's `ip`";
    DeleteOrphans();
    std::strncpy(g_veth_ip, ip_.c_str(), sizeof g_veth_ip - 1);
    for (int i = 0; i < 2; ++i) std::strncpy(g_veth_ns[i], ns_[i].c_str(), sizeof g_veth_ns[i] - 1);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, DeleteNamespacesFromSignal);
    for (int i = 0; i < 2; ++i) {
      if (!Run(ip_ + " netns add " + ns_[i])) return "`ip netns add " + ns_[i] + "` failed";
      created_[i] = true;
    }
    // Created inside namespace a, so that deleting the namespaces deletes it.
    if (!Run(ip_ + " -n " + ns_[0] + " link add " + dev_[0] + " type veth peer name " + dev_[1] +
             " netns " + ns_[1])) {
      return "creating the veth pair failed";
    }
    for (int i = 0; i < 2; ++i) {
      const std::string in = ip_ + " -n " + ns_[i] + " ";
      if (!Run(in + "addr add " + address(i) + "/24 dev " + dev_[i]) ||
          !Run(in + "link set " + dev_[i] + " up") || !Run(in + "link set lo up")) {
        return "configuring " + dev_[i];
      }
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (int i = 0; i < 2; ++i) {
      while (!Run(ip_ + " -n " + ns_[i] + " link show dev " + dev_[i] + " | grep -q 'state UP'")) {
        if (std::chrono::steady_clock::now() > deadline) return dev_[i] + " never came up";
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    return "";
  }

  // Sets the MTU of both ends. False on failure.
  bool SetMtu(int mtu) const {
    for (int i = 0; i < 2; ++i) {
      if (!Run(ip_ + " -n " + ns_[i] + " link set dev " + dev_[i] + " mtu " + std::to_string(mtu))) {
        return false;
      }
    }
    return true;
  }

  // side 0 = a (receiver, ucx_perftest server), 1 = b (sender, client).
  const std::string& ns(int side) const { return ns_[side]; }
  const std::string& device(int side) const { return dev_[side]; }
  std::string address(int side) const { return "10.202.0." + std::to_string(side + 1); }
  // Shell prefix that runs a command in `side`'s namespace (with its /sys).
  std::string ExecPrefix(int side) const { return ip_ + " netns exec " + ns_[side] + " "; }

  // In a forked, single-threaded child: joins `side`'s namespace and mounts
  // a private /sys of it, where UCX lists its TCP devices (as `ip netns
  // exec` does). Returns "" or what failed.
  std::string Enter(int side) const {
    const std::string path = "/var/run/netns/" + ns_[side];
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) return "joining " + path + ": " + strerror(errno);
    close(fd);
    if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) {
      return std::string("private mount namespace: ") + strerror(errno);
    }
    umount2("/sys", MNT_DETACH);
    if (mount("sysfs", "/sys", "sysfs", 0, nullptr) != 0) {
      return std::string("mounting sysfs: ") + strerror(errno);
    }
    return "";
  }

 private:
  static bool Run(const std::string& command) {
    const int rc = std::system(("(" + command + ") >/dev/null 2>&1").c_str());
    return rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
  }

  // hwbench-<pid>-{a,b} whose pid no longer runs.
  void DeleteOrphans() const {
    DIR* dir = opendir("/var/run/netns");
    if (dir == nullptr) return;
    while (dirent* e = readdir(dir)) {
      const std::string name = e->d_name;
      if (name.rfind("hwbench-", 0) != 0) continue;
      const long pid = std::atol(name.c_str() + 8);
      if (pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
        Run(ip_ + " netns del " + name);
      }
    }
    closedir(dir);
  }

  std::string ns_[2], dev_[2], ip_;
  bool created_[2] = {false, false};
};

}  // namespace headway::bench
