// Any number of Linux network namespaces on one Ethernet segment: a bridge
// in a namespace of its own and a veth pair from each member to it, for
// tests that need more than two "machines" (NetnsPair, tests/support/netns.h,
// joins exactly two). Each member also gets its own /etc/hosts, the way a
// cluster's DNS would answer it.
//
//   member i: veth end device(i), address(i) = 10.202.N.(i+1)/24, lo up
//   switch:   bridge br0 with the other end of every member's pair
//
// Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and iproute2's `ip`. Setup()
// says FailedPrecondition where the environment forbids namespaces, veth or
// bridges (the test skips: HW_SETUP_NETNS_LAN_OR_SKIP) and another error
// where setup failed after they were allowed (the test fails).
//
// Processes join a member with ExecArgv(): `ip netns exec NS /usr/bin/env
// VAR=... cmd`, which also mounts the member's /etc/netns/NS/hosts (from
// WriteHosts) over /etc/hosts and gives it a private /sys of the namespace.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/status.h"

namespace headway::testing {

// Owns the namespaces, the bridge, the veth pairs and the /etc/netns files;
// the destructor deletes them whatever state Setup() reached. Processes
// started with ExecArgv() are the caller's: stop them before this object.
// Not thread-safe: use one object from the test's main thread.
class NetnsLan {
 public:
  // Picks unique names for `num_members` members; creates nothing. `tag` (a
  // few letters, no '-') shows in the namespace names, e.g.
  // hwlan-k8s-1234-5a3f01-2. REQUIRES: 1 <= num_members <= 250.
  NetnsLan(const std::string& tag, int num_members);
  ~NetnsLan();
  NetnsLan(const NetnsLan&) = delete;
  NetnsLan& operator=(const NetnsLan&) = delete;

  // Deletes what earlier test processes killed before their destructor ran
  // left behind, then creates the switch namespace and its bridge, and each
  // member with its veth pair, addressed and up; waits (up to 5 s) until
  // every member's end reports state UP. Errors: FailedPrecondition when not
  // root, `ip` is missing, or a namespace, veth pair or bridge is refused
  // (skip); Internal for any later step (fail). REQUIRES: called once.
  Status Setup();

  int num_members() const { return int(members_.size()); }
  // Namespace name of member `i`, as `ip netns` knows it.
  const std::string& name(int i) const;
  // The IPv4 address of member `i`'s veth end, e.g. "10.202.7.3".
  std::string address(int i) const;

  // Writes `hosts` (an /etc/hosts text) as every member's /etc/hosts, seen
  // by processes started with ExecArgv() from now on.
  // Errors: Internal when a file cannot be written. REQUIRES: Setup() succeeded.
  Status WriteHosts(const std::string& hosts);

  // `argv` prefixed so that it runs in member `i` with `env` ("VAR=value"
  // entries) added to its environment. REQUIRES: Setup() succeeded; argv[0]
  // is a path, not a bare name.
  std::vector<std::string> ExecArgv(int i, const std::vector<std::string>& argv,
                                    const std::vector<std::string>& env = {}) const;

  // Runs `fn` on a new thread that has joined member `i`'s network
  // namespace, and joins it. Errors: Internal if the namespace cannot be
  // joined (`fn` does not run).
  Status RunInNamespace(int i, const std::function<void()>& fn) const;

 private:
  std::string switch_ns_;
  std::vector<std::string> members_;   // namespace names
  std::vector<std::string> devices_;   // member-side veth ends
  std::vector<std::string> ports_;     // switch-side veth ends
  std::vector<bool> created_;          // members_[i] exists
  bool switch_created_ = false;
  std::string in_root_;                // a veth created, not yet moved
  int subnet_ = 1;                     // the N of 10.202.N.0/24
  std::string ip_path_;
};

}  // namespace headway::testing

// In a TEST body: sets up `lan` (a NetnsLan), skipping the test where the
// environment forbids it and failing it on a later error.
#define HW_SETUP_NETNS_LAN_OR_SKIP(lan)                                                 \
  do {                                                                                  \
    const ::headway::Status hw_lan_status_ = (lan).Setup();                             \
    if (hw_lan_status_.code() == ::headway::StatusCode::kFailedPrecondition) {          \
      GTEST_SKIP() << "network namespaces unavailable: " << hw_lan_status_.message();   \
    }                                                                                   \
    if (!hw_lan_status_.ok()) FAIL() << "network namespace setup: " << hw_lan_status_.message(); \
  } while (0)
