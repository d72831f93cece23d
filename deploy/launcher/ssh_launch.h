// The command lines headway-launch runs for hosts other than this one: one
// ssh session per host running `headway-node`, and before it, one running
// `headway-node --preflight` (deploy/launcher/preflight.h). The launcher and
// the coordinator stay on this machine; only agents and their workers run
// remotely. Pure logic (no processes, no I/O); header-only like
// launch_plan.h.
//
// ssh runs with BatchMode=yes (no password or passphrase prompt, no TTY: a
// host that would ask fails at once) and -T. An agent session forwards
// stdin: the agent runs with --exit-on-stdin-eof, so when the launcher
// closes its end, or dies, or the connection drops, ssh passes the end of
// file on and the agent stops its workers. ServerAliveInterval makes a
// vanished host end its session within about 15 s instead of never.
#pragma once

#include <string>
#include <vector>

#include "common/launch_config.h"
#include "deploy/launcher/launch_plan.h"

namespace headway::launcher {

// Where Headway's binaries and models are on the remote hosts.
// `local_bin_dir`: the launcher's own --bin-dir, used when launch.bin_dir is
// not set (the same install path on every host).
inline std::string RemoteBinDir(const LaunchConfig& launch, const std::string& local_bin_dir) {
  return launch.bin_dir.empty() ? local_bin_dir : launch.bin_dir;
}

// ssh's argv running `remote_argv` on `host` (as the config names it; ssh
// resolves it). `ssh_path`: the ssh client's absolute path. With
// `forward_stdin` false the session reads /dev/null (-n).
// REQUIRES: !remote_argv.empty().
inline std::vector<std::string> SshArgv(const std::string& ssh_path, const LaunchConfig& launch,
                                        const std::string& host,
                                        const std::vector<std::string>& remote_argv,
                                        bool forward_stdin) {
  std::vector<std::string> argv = {ssh_path, "-T"};
  if (!forward_stdin) argv.push_back("-n");
  argv.insert(argv.end(), {"-o", "BatchMode=yes", "-o",
                           "ConnectTimeout=" + std::to_string(launch.connect_timeout_s), "-o",
                           "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-p",
                           std::to_string(launch.ssh_port)});
  if (!launch.ssh_key.empty()) {
    argv.insert(argv.end(), {"-i", launch.ssh_key, "-o", "IdentitiesOnly=yes"});
  }
  if (!launch.ssh_known_hosts.empty()) {
    argv.insert(argv.end(), {"-o", "UserKnownHostsFile=" + launch.ssh_known_hosts, "-o",
                             "StrictHostKeyChecking=yes"});
  }
  if (!launch.ssh_user.empty()) argv.insert(argv.end(), {"-l", launch.ssh_user});
  // The remote side hands the command to the login shell: quote it once.
  argv.insert(argv.end(), {"--", host, ShellCommand(remote_argv)});
  return argv;
}

// The agent's command on remote host `host`: headway-node from the remote
// bin dir with the config at the same path as here, launch.model_dir when
// set (else the agent's own default there), and --exit-on-stdin-eof.
inline std::vector<std::string> RemoteAgentArgv(const LaunchConfig& launch,
                                                const std::string& config_path,
                                                const std::string& host,
                                                const std::string& local_bin_dir) {
  const std::string bin_dir = RemoteBinDir(launch, local_bin_dir);
  std::vector<std::string> argv = {bin_dir + "/headway-node", "--config", config_path, "--host",
                                   host};
  if (!launch.model_dir.empty()) argv.insert(argv.end(), {"--model-dir", launch.model_dir});
  argv.insert(argv.end(), {"--bin-dir", bin_dir, "--exit-on-stdin-eof"});
  return argv;
}

// The preflight's command on a remote host: `headway-node --preflight` with
// the same config path and model directory as RemoteAgentArgv.
inline std::vector<std::string> RemotePreflightArgv(const LaunchConfig& launch,
                                                    const std::string& config_path,
                                                    const std::string& local_bin_dir) {
  std::vector<std::string> argv = {RemoteBinDir(launch, local_bin_dir) + "/headway-node",
                                   "--preflight", "--config", config_path};
  if (!launch.model_dir.empty()) argv.insert(argv.end(), {"--model-dir", launch.model_dir});
  return argv;
}

// The hosts of `plan` that are not this machine (IsLocalHost), each once,
// in WorkerHosts order.
inline std::vector<std::string> RemoteHosts(const std::vector<ProcessSpec>& plan) {
  std::vector<std::string> remote;
  for (const std::string& host : WorkerHosts(plan)) {
    if (!IsLocalHost(host)) remote.push_back(host);
  }
  return remote;
}

// OK unless workers on `remote_hosts` could not dial the coordinator's
// control_address: an ipc:// path, or a loopback host (127.x.x.x,
// localhost, ::1), which on another machine is that machine. Errors:
// InvalidArgument naming the key, its value, the first remote host and
// what to set instead.
inline Status CheckControlAddressForRemoteHosts(const Config& config,
                                                const std::vector<std::string>& remote_hosts) {
  if (remote_hosts.empty()) return Status::Ok();
  const std::string& address = config.control_address;
  std::string host;
  if (address.rfind("tcp://", 0) == 0) {
    host = address.substr(6, address.rfind(':') > 6 ? address.rfind(':') - 6 : std::string::npos);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
  }
  const bool loopback = host.empty() || host == "localhost" || host == "::1" ||
                        host.rfind("127.", 0) == 0;
  if (!loopback) return Status::Ok();
  return Status::InvalidArgument(
      "`coordinator.control_address` = \"" + address + "\" cannot be dialled from " +
      remote_hosts[0] + ", which runs workers: set it to tcp://NAME:PORT with this machine's "
      "name or address as the workers resolve it (and control_bind to tcp://0.0.0.0:PORT)");
}

}  // namespace headway::launcher
