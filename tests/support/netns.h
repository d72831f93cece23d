// Two Linux network namespaces joined by a veth pair, for tests that need
// processes which share nothing but a network link: the closest a single host
// gets to two machines (no shared-memory transports, no loopback shortcut).
//
//   namespace A: veth end device(kA), address(kA) = 10.201.N.1/24, lo up
//   namespace B: veth end device(kB), address(kB) = 10.201.N.2/24, lo up
//
// Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and iproute2's `ip`. Setup()
// says FailedPrecondition where the environment forbids namespaces (the test
// skips: HW_SETUP_NETNS_OR_SKIP) and another error where setup failed after
// they were allowed (the test fails).
//
// Processes get into a namespace three ways:
//   * ExecArgv(): an argv prefix `ip netns exec NS /usr/bin/env VAR=... cmd`
//     for ChildProcess (tests/support/process.h); `ip netns exec` execs in
//     place, so the pid is the command's, and gives it a private /sys of the
//     namespace;
//   * ForkChild() + EnterFromChild(): a forked child running test code;
//   * RunInNamespace(): a function on a fresh thread of this process that has
//     joined the namespace (setns on that thread only), e.g. HTTP clients.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/status.h"

namespace headway::testing {

enum class NetnsSide { kA, kB };

// Owns both namespaces, the veth pair and the children forked by
// ForkChild(). The destructor SIGKILLs and reaps those children and deletes
// both namespaces (with them the veth pair), whatever state Setup() reached,
// so every path out of a test cleans up, a failed assertion included.
// Processes started with ExecArgv() are the caller's: stop them (destroy
// their ChildProcess) before this object, or the kernel keeps the namespace
// and its veth alive until they exit.
//
// Not thread-safe: use one object from the test's main thread (the functions
// run by RunInNamespace() must not call it).
class NetnsPair {
 public:
  // Picks unique names; creates nothing. `tag` (a few letters, no '-') shows
  // in the namespace names, e.g. hwnet-kv-1234-5a3f01-a.
  explicit NetnsPair(const std::string& tag);
  ~NetnsPair();
  NetnsPair(const NetnsPair&) = delete;
  NetnsPair& operator=(const NetnsPair&) = delete;

  // Deletes namespaces left by earlier test processes that were killed
  // before their destructor ran, then creates both namespaces and the veth
  // pair, addresses both ends, brings them and lo up and waits (up to 5 s)
  // until both ends report state UP (UCX lists only running interfaces).
  // Errors: FailedPrecondition when not root, `ip` is missing, or `ip netns
  // add` / veth creation is refused (skip); Internal for any later step
  // (fail). REQUIRES: called once.
  Status Setup();

  // Namespace name, as `ip netns` knows it.
  const std::string& name(NetnsSide side) const;
  // The veth end inside `side`'s namespace (for UCX_NET_DEVICES).
  const std::string& device(NetnsSide side) const;
  // The IPv4 address of that veth end, e.g. "10.201.7.1".
  std::string address(NetnsSide side) const;

  // Bytes received so far by `side`'s veth end (its rx_bytes counter), i.e.
  // everything the other side sent over the link, frame headers included.
  // Errors: Internal if the counter cannot be read. REQUIRES: Setup() succeeded.
  Result<uint64_t> ReceivedBytes(NetnsSide side) const;

  // `argv` prefixed so that it runs in `side`'s namespace with `env`
  // ("VAR=value" entries) added to its environment:
  //   {ip, "netns", "exec", name(side), "/usr/bin/env", env..., argv...}.
  // REQUIRES: Setup() succeeded; argv[0] is a path, not a bare name.
  std::vector<std::string> ExecArgv(NetnsSide side, const std::vector<std::string>& argv,
                                    const std::vector<std::string>& env = {}) const;

  // Runs `fn` on a new thread that has joined `side`'s network namespace
  // (setns(CLONE_NEWNET) on that thread only; threads it starts inherit the
  // namespace) and joins it. Sockets `fn` opens live in that namespace; the
  // calling thread and the rest of the process stay where they were.
  // Errors: Internal if the namespace cannot be opened or joined (`fn` does
  // not run).
  Status RunInNamespace(NetnsSide side, const std::function<void()>& fn) const;

  // Forks a child that runs `body`, which must end the process (_exit); a
  // body that returns exits with status 120. The child gets SIGKILL when the
  // test process dies, and from the destructor. Returns the pid, or -1 if
  // fork failed. The child is still in the test's namespace: `body` calls
  // EnterFromChild() first.
  pid_t ForkChild(const std::function<void()>& body);

  // In a child from ForkChild() (single-threaded): joins `side`'s network
  // namespace and gives the process a private /sys of it (UCX lists TCP
  // devices from /sys/class/net, which otherwise still shows the host's
  // interfaces), as `ip netns exec` does. Errors: Internal naming the step
  // that failed (the child should report it and exit).
  Status EnterFromChild(NetnsSide side) const;

  // Waits up to `timeout` for child `pid` (from ForkChild) to exit; returns
  // its wait status, or -1 on timeout (the child keeps running).
  int WaitChild(pid_t pid, std::chrono::milliseconds timeout);

  // SIGKILLs child `pid` (from ForkChild); the destructor or WaitChild reaps.
  void KillChild(pid_t pid);

 private:
  std::string ns_[2];
  std::string veth_[2];
  int subnet_ = 1;  // the N of 10.201.N.0/24
  std::string ip_path_;
  bool ns_created_[2] = {false, false};
  bool veth_in_root_ = false;  // created, not yet moved into namespace A
  std::vector<pid_t> children_;
};

}  // namespace headway::testing

// In a TEST body: sets up `pair` (a NetnsPair), skipping the test where the
// environment forbids network namespaces and failing it on a later error.
#define HW_SETUP_NETNS_OR_SKIP(pair)                                                    \
  do {                                                                                  \
    const ::headway::Status hw_netns_status_ = (pair).Setup();                          \
    if (hw_netns_status_.code() == ::headway::StatusCode::kFailedPrecondition) {        \
      GTEST_SKIP() << "network namespaces unavailable: " << hw_netns_status_.message(); \
    }                                                                                   \
    if (!hw_netns_status_.ok()) {                                                       \
      FAIL() << "network namespace setup: " << hw_netns_status_.message();              \
    }                                                                                   \
  } while (0)
