#include "tests/support/netns_lan.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

namespace headway::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Every namespace made here is named kPrefix + "<tag>-<pid>-<hex>-<member|s>",
// so a later run can tell which ones a dead test process left behind.
constexpr char kPrefix[] = "hwlan-";
constexpr char kNetnsDir[] = "/var/run/netns/";
constexpr char kEtcNetns[] = "/etc/netns/";

bool Run(const std::string& command) {
  const std::string quiet = "(" + command + ") >/dev/null 2>&1";
  const int rc = std::system(quiet.c_str());
  return rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
}

std::string FindIp() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

// True while `pid` runs; a zombie counts as gone.
bool ProcessRunning(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

// The names in `dir` made by this file whose creating process is gone.
std::vector<std::string> Orphans(const std::string& dir) {
  std::vector<std::string> orphans;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return orphans;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(kPrefix, 0) != 0) continue;
    const size_t tag_end = name.find('-', sizeof kPrefix - 1);
    if (tag_end == std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str() + tag_end + 1));
    if (pid > 0 && !ProcessRunning(pid)) orphans.push_back(name);
  }
  closedir(d);
  return orphans;
}

// Deleting a namespace deletes the veth ends inside it, and with each its peer.
void DeleteOrphans(const std::string& ip) {
  for (const std::string& name : Orphans(kNetnsDir)) Run(ip + " netns del " + name);
  std::error_code ec;
  for (const std::string& name : Orphans(kEtcNetns)) {
    std::filesystem::remove_all(kEtcNetns + name, ec);
  }
}

}  // namespace

NetnsLan::NetnsLan(const std::string& tag, int num_members) {
  std::random_device rd;
  char hex[8];
  std::snprintf(hex, sizeof hex, "%06x", static_cast<unsigned>(rd() & 0xffffff));
  const std::string id = kPrefix + tag + "-" + std::to_string(getpid()) + "-" + hex + "-";
  switch_ns_ = id + "s";
  for (int i = 0; i < num_members; ++i) {
    members_.push_back(id + std::to_string(i));
    // Interface names are at most 15 bytes: "hw" + 6 hex + side + index.
    devices_.push_back(std::string("hw") + hex + "m" + std::to_string(i));
    ports_.push_back(std::string("hw") + hex + "p" + std::to_string(i));
  }
  created_.assign(members_.size(), false);
  subnet_ = 1 + static_cast<int>(rd() % 254);
}

NetnsLan::~NetnsLan() {
  if (ip_path_.empty()) return;
  if (!in_root_.empty()) Run(ip_path_ + " link del " + in_root_);
  std::error_code ec;
  for (size_t i = 0; i < members_.size(); ++i) {
    if (created_[i]) Run(ip_path_ + " netns del " + members_[i]);
    std::filesystem::remove_all(kEtcNetns + members_[i], ec);
  }
  if (switch_created_) Run(ip_path_ + " netns del " + switch_ns_);
}

const std::string& NetnsLan::name(int i) const { return members_[size_t(i)]; }

std::string NetnsLan::address(int i) const {
  return "10.202." + std::to_string(subnet_) + "." + std::to_string(i + 1);
}

Status NetnsLan::Setup() {
  if (geteuid() != 0) return Status::FailedPrecondition("needs root to create network namespaces");
  const std::string ip = FindIp();
  if (ip.empty()) return Status::FailedPrecondition("iproute2's `ip` is not installed");
  ip_path_ = ip;
  DeleteOrphans(ip);
  if (!Run(ip + " netns add " + switch_ns_)) {
    return Status::FailedPrecondition(
        "`ip netns add` failed (no CAP_SYS_ADMIN, e.g. in an unprivileged container)");
  }
  switch_created_ = true;
  const std::string in_switch = ip + " -n " + switch_ns_ + " ";
  if (!Run(in_switch + "link add br0 type bridge")) {
    return Status::FailedPrecondition("`ip link add ... type bridge` failed");
  }
  if (!Run(in_switch + "link set br0 up")) return Status::Internal("bringing br0 up");
  for (size_t i = 0; i < members_.size(); ++i) {
    if (!Run(ip + " netns add " + members_[i])) {
      return Status::FailedPrecondition("`ip netns add " + members_[i] + "` failed");
    }
    created_[i] = true;
    if (!Run(ip + " link add " + devices_[i] + " type veth peer name " + ports_[i])) {
      return Status::FailedPrecondition(
          "`ip link add ... type veth` failed (no veth support or CAP_NET_ADMIN)");
    }
    in_root_ = devices_[i];
    if (!Run(ip + " link set " + ports_[i] + " netns " + switch_ns_)) {
      return Status::Internal("moving " + ports_[i] + " into " + switch_ns_);
    }
    if (!Run(ip + " link set " + devices_[i] + " netns " + members_[i])) {
      return Status::Internal("moving " + devices_[i] + " into " + members_[i]);
    }
    in_root_.clear();
    const std::string in = ip + " -n " + members_[i] + " ";
    if (!Run(in_switch + "link set " + ports_[i] + " master br0") ||
        !Run(in_switch + "link set " + ports_[i] + " up") ||
        !Run(in + "addr add " + address(int(i)) + "/24 dev " + devices_[i]) ||
        !Run(in + "link set " + devices_[i] + " up") || !Run(in + "link set lo up")) {
      return Status::Internal("configuring " + devices_[i] + " in " + members_[i]);
    }
  }
  // The kernel updates a veth's operational state asynchronously, and UCX
  // skips interfaces that are not IFF_RUNNING.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  for (size_t i = 0; i < members_.size(); ++i) {
    while (!Run(ip + " -n " + members_[i] + " link show dev " + devices_[i] +
                " | grep -q 'state UP'")) {
      if (Clock::now() > deadline) {
        return Status::Internal(devices_[i] + " in " + members_[i] + " never came up");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return Status::Ok();
}

Status NetnsLan::WriteHosts(const std::string& hosts) {
  for (const std::string& member : members_) {
    const std::string dir = kEtcNetns + member;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::ofstream out(dir + "/hosts", std::ios::trunc);
    out << hosts;
    out.close();
    if (ec || !out) return Status::Internal("cannot write " + dir + "/hosts");
  }
  return Status::Ok();
}

std::vector<std::string> NetnsLan::ExecArgv(int i, const std::vector<std::string>& argv,
                                            const std::vector<std::string>& env) const {
  std::vector<std::string> out = {ip_path_, "netns", "exec", name(i), "/usr/bin/env"};
  out.insert(out.end(), env.begin(), env.end());
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

Status NetnsLan::RunInNamespace(int i, const std::function<void()>& fn) const {
  const std::string path = kNetnsDir + name(i);
  Status status;
  // A fresh thread that ends with `fn`, so no pooled thread is left in the namespace.
  std::thread thread([&] {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      status = Status::Internal("open " + path + ": " + std::strerror(errno));
      return;
    }
    const int rc = setns(fd, CLONE_NEWNET);
    const int setns_errno = errno;
    close(fd);
    if (rc != 0) {
      status = Status::Internal("setns " + path + ": " + std::strerror(setns_errno));
      return;
    }
    fn();
  });
  thread.join();
  return status;
}

}  // namespace headway::testing
