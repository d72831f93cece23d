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

#include "tests/support/netns_util.h"

namespace headway::testing {
namespace {

using Clock = std::chrono::steady_clock;
using netns::FindIp;
using netns::kNetnsDir;
using netns::RunQuietly;

// Every namespace made here is named kPrefix + "<tag>-<pid>-<hex>-<member|s>",
// so a later run can tell which ones a dead test process left behind.
constexpr char kPrefix[] = "hwlan-";
constexpr char kEtcNetns[] = "/etc/netns/";

// Deleting a namespace deletes the veth ends inside it, and with each its peer.
void DeleteOrphans(const std::string& ip) {
  for (const std::string& name : netns::Orphans(kNetnsDir, kPrefix)) {
    RunQuietly(ip + " netns del " + name);
  }
  std::error_code ec;
  for (const std::string& name : netns::Orphans(kEtcNetns, kPrefix)) {
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
  if (!in_root_.empty()) RunQuietly(ip_path_ + " link del " + in_root_);
  std::error_code ec;
  for (size_t i = 0; i < members_.size(); ++i) {
    if (created_[i]) RunQuietly(ip_path_ + " netns del " + members_[i]);
    std::filesystem::remove_all(kEtcNetns + members_[i], ec);
  }
  if (switch_created_) RunQuietly(ip_path_ + " netns del " + switch_ns_);
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
  if (!RunQuietly(ip + " netns add " + switch_ns_)) {
    return Status::FailedPrecondition(
        "`ip netns add` failed (no CAP_SYS_ADMIN, e.g. in an unprivileged container)");
  }
  switch_created_ = true;
  const std::string in_switch = ip + " -n " + switch_ns_ + " ";
  if (!RunQuietly(in_switch + "link add br0 type bridge")) {
    return Status::FailedPrecondition("`ip link add ... type bridge` failed");
  }
  if (!RunQuietly(in_switch + "link set br0 up")) return Status::Internal("bringing br0 up");
  for (size_t i = 0; i < members_.size(); ++i) {
    if (!RunQuietly(ip + " netns add " + members_[i])) {
      return Status::FailedPrecondition("`ip netns add " + members_[i] + "` failed");
    }
    created_[i] = true;
    if (!RunQuietly(ip + " link add " + devices_[i] + " type veth peer name " + ports_[i])) {
      return Status::FailedPrecondition(
          "`ip link add ... type veth` failed (no veth support or CAP_NET_ADMIN)");
    }
    in_root_ = devices_[i];
    if (!RunQuietly(ip + " link set " + ports_[i] + " netns " + switch_ns_)) {
      return Status::Internal("moving " + ports_[i] + " into " + switch_ns_);
    }
    if (!RunQuietly(ip + " link set " + devices_[i] + " netns " + members_[i])) {
      return Status::Internal("moving " + devices_[i] + " into " + members_[i]);
    }
    in_root_.clear();
    const std::string in = ip + " -n " + members_[i] + " ";
    if (!RunQuietly(in_switch + "link set " + ports_[i] + " master br0") ||
        !RunQuietly(in_switch + "link set " + ports_[i] + " up") ||
        !RunQuietly(in + "addr add " + address(int(i)) + "/24 dev " + devices_[i]) ||
        !RunQuietly(in + "link set " + devices_[i] + " up") || !RunQuietly(in + "link set lo up")) {
      return Status::Internal("configuring " + devices_[i] + " in " + members_[i]);
    }
  }
  // The kernel updates a veth's operational state asynchronously, and UCX
  // skips interfaces that are not IFF_RUNNING.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  for (size_t i = 0; i < members_.size(); ++i) {
    while (!RunQuietly(ip + " -n " + members_[i] + " link show dev " + devices_[i] +
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
  return netns::ExecArgv(ip_path_, name(i), argv, env);
}

Status NetnsLan::RunInNamespace(int i, const std::function<void()>& fn) const {
  return netns::RunIn(name(i), fn);
}

}  // namespace headway::testing
