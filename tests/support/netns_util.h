// What NetnsPair (netns.h) and NetnsLan (netns_lan.h) both need: running
// iproute2 quietly, finding namespaces a dead test process left behind,
// and running code or a command inside a named network namespace.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace headway::testing::netns {

// Where `ip netns add NAME` puts the namespace's handle.
inline constexpr char kNetnsDir[] = "/var/run/netns/";

// Runs a shell command with its output discarded; true when it exits 0.
bool RunQuietly(const std::string& command);

// The path of iproute2's `ip`, or "" when it is not installed.
std::string FindIp();

// The entries of `dir` named `prefix` + "<tag>-<pid>-..." whose creating
// process (the pid field) is gone or a zombie: what a test killed by a
// timeout left behind. A missing `dir` has none.
std::vector<std::string> Orphans(const std::string& dir, const std::string& prefix);

// `argv` run inside namespace `ns` with the variables `env` ("NAME=value")
// set: ip netns exec NS /usr/bin/env ENV... ARGV..., which also mounts
// /etc/netns/NS/ files over /etc and a /sys of the namespace.
std::vector<std::string> ExecArgv(const std::string& ip_path, const std::string& ns,
                                  const std::vector<std::string>& argv,
                                  const std::vector<std::string>& env);

// Runs `fn` on a fresh thread that joins namespace `ns` (setns) and ends
// with `fn`, so no pooled thread of the process is left in it. Internal
// naming the call that failed (open, setns); `fn` has not run then.
Status RunIn(const std::string& ns, const std::function<void()>& fn);

}  // namespace headway::testing::netns
