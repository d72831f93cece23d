#include "tests/support/netns.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "tests/support/netns_util.h"

namespace headway::testing {
namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;
using netns::FindIp;
using netns::kNetnsDir;
using netns::RunQuietly;

// Every namespace this file creates is named kPrefix + "<tag>-<pid>-<hex>-<a|b>",
// so a later run can tell which ones a dead test process left behind.
constexpr char kPrefix[] = "hwnet-";

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// Deletes namespaces named by this file whose creating process is gone (a
// test killed by a timeout never runs its destructor). Deleting the
// namespace deletes its veth end and with it the peer.
void DeleteOrphans(const std::string& ip) {
  for (const std::string& name : netns::Orphans(kNetnsDir, kPrefix)) {
    RunQuietly(ip + " netns del " + name);
  }
}

}  // namespace

NetnsPair::NetnsPair(const std::string& tag) {
  std::random_device rd;
  char hex[8];
  std::snprintf(hex, sizeof hex, "%06x", static_cast<unsigned>(rd() & 0xffffff));
  const std::string id = std::to_string(getpid()) + "-" + hex;
  ns_[0] = kPrefix + tag + "-" + id + "-a";
  ns_[1] = kPrefix + tag + "-" + id + "-b";
  // Interface names are at most 15 bytes: "hw" + 6 hex digits + side.
  veth_[0] = std::string("hw") + hex + "a";
  veth_[1] = std::string("hw") + hex + "b";
  subnet_ = 1 + static_cast<int>(rd() % 254);
}

NetnsPair::~NetnsPair() {
  for (pid_t pid : children_) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  // Deleting a namespace destroys the veth end inside it, and with it the
  // peer; the root-side delete covers a failure before the move.
  if (veth_in_root_) RunQuietly(ip_path_ + " link del " + veth_[0]);
  for (int i = 0; i < 2; ++i) {
    if (ns_created_[i]) RunQuietly(ip_path_ + " netns del " + ns_[i]);
  }
}

const std::string& NetnsPair::name(NetnsSide side) const { return ns_[static_cast<int>(side)]; }

const std::string& NetnsPair::device(NetnsSide side) const {
  return veth_[static_cast<int>(side)];
}

std::string NetnsPair::address(NetnsSide side) const {
  return "10.201." + std::to_string(subnet_) + "." + std::to_string(static_cast<int>(side) + 1);
}

Status NetnsPair::Setup() {
  if (geteuid() != 0) return Status::FailedPrecondition("needs root to create network namespaces");
  ip_path_ = FindIp();
  if (ip_path_.empty()) return Status::FailedPrecondition("iproute2's `ip` is not installed");
  const std::string& ip = ip_path_;
  DeleteOrphans(ip);
  if (!RunQuietly(ip + " netns add " + ns_[0])) {
    return Status::FailedPrecondition(
        "`ip netns add` failed (no CAP_SYS_ADMIN, e.g. in an unprivileged container)");
  }
  ns_created_[0] = true;
  if (!RunQuietly(ip + " netns add " + ns_[1])) {
    return Status::FailedPrecondition("second `ip netns add` failed");
  }
  ns_created_[1] = true;
  if (!RunQuietly(ip + " link add " + veth_[0] + " type veth peer name " + veth_[1])) {
    return Status::FailedPrecondition(
        "`ip link add ... type veth` failed (no veth support or CAP_NET_ADMIN)");
  }
  veth_in_root_ = true;
  if (!RunQuietly(ip + " link set " + veth_[0] + " netns " + ns_[0])) {
    return Status::Internal("moving " + veth_[0] + " into " + ns_[0]);
  }
  veth_in_root_ = false;  // namespace A owns the pair now
  if (!RunQuietly(ip + " link set " + veth_[1] + " netns " + ns_[1])) {
    return Status::Internal("moving " + veth_[1] + " into " + ns_[1]);
  }
  for (NetnsSide side : {NetnsSide::kA, NetnsSide::kB}) {
    const std::string in = ip + " -n " + name(side) + " ";
    const std::string& dev = device(side);
    if (!RunQuietly(in + "addr add " + address(side) + "/24 dev " + dev) ||
        !RunQuietly(in + "link set " + dev + " up") || !RunQuietly(in + "link set lo up")) {
      return Status::Internal("configuring " + dev + " in " + name(side));
    }
  }
  // The kernel updates a veth's operational state asynchronously (linkwatch,
  // slower under load), and UCX skips interfaces that are not IFF_RUNNING.
  const auto deadline = Clock::now() + Millis(5000);
  for (NetnsSide side : {NetnsSide::kA, NetnsSide::kB}) {
    while (!RunQuietly(ip + " -n " + name(side) + " link show dev " + device(side) +
                " | grep -q 'state UP'")) {
      if (Clock::now() > deadline) {
        return Status::Internal(device(side) + " in " + name(side) + " never came up");
      }
      std::this_thread::sleep_for(Millis(10));
    }
  }
  return Status::Ok();
}

Result<uint64_t> NetnsPair::ReceivedBytes(NetnsSide side) const {
  // sysfs shows the namespace of the process that mounted it, so the
  // counter is read by a process inside the namespace.
  const std::string command = ip_path_ + " netns exec " + name(side) + " cat /sys/class/net/" +
                              device(side) + "/statistics/rx_bytes 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return Status::Internal(Errno("popen " + command));
  unsigned long long bytes = 0;
  const bool parsed = std::fscanf(pipe, "%llu", &bytes) == 1;
  const int rc = pclose(pipe);
  if (!parsed || rc != 0) return Status::Internal("cannot read rx_bytes: " + command);
  return static_cast<uint64_t>(bytes);
}

std::vector<std::string> NetnsPair::ExecArgv(NetnsSide side, const std::vector<std::string>& argv,
                                             const std::vector<std::string>& env) const {
  return netns::ExecArgv(ip_path_, name(side), argv, env);
}

Status NetnsPair::RunInNamespace(NetnsSide side, const std::function<void()>& fn) const {
  return netns::RunIn(name(side), fn);
}

pid_t NetnsPair::ForkChild(const std::function<void()>& body) {
  const pid_t pid = fork();
  if (pid != 0) {
    if (pid > 0) children_.push_back(pid);
    return pid;
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  body();
  _exit(120);
}

Status NetnsPair::EnterFromChild(NetnsSide side) const {
  const std::string path = kNetnsDir + name(side);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Internal(Errno("open " + path));
  if (setns(fd, CLONE_NEWNET) != 0) {
    const std::string why = Errno("setns " + path);
    close(fd);
    return Status::Internal(why);
  }
  close(fd);
  // A mount namespace of its own, with mount events not propagated back, so
  // the sysfs below replaces /sys for this process only.
  if (unshare(CLONE_NEWNS) != 0) return Status::Internal(Errno("unshare(CLONE_NEWNS)"));
  if (mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) {
    return Status::Internal(Errno("making / a slave mount"));
  }
  umount2("/sys", MNT_DETACH);  // may not be a mount point of its own
  if (mount("sysfs", "/sys", "sysfs", 0, nullptr) != 0) {
    return Status::Internal(Errno("mounting sysfs"));
  }
  return Status::Ok();
}

int NetnsPair::WaitChild(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      std::erase(children_, pid);
      return status;
    }
    if (Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(Millis(5));
  }
}

void NetnsPair::KillChild(pid_t pid) {
  for (pid_t child : children_) {
    if (child == pid) kill(pid, SIGKILL);
  }
}

}  // namespace headway::testing
