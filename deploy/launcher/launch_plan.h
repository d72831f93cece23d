// The launcher's plan: which processes a deployment needs and their command
// lines, computed from a validated Config. Pure logic (no processes, no I/O);
// header-only so that tests link it without the launcher library.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/config.h"

namespace headway::launcher {

struct LaunchOptions {
  std::string config_path;        // passed to every process as --config; absolute is safest
  std::string bin_dir;            // holds headway-coordinator and headway-worker
  std::string model_dir;          // passed as --model-dir when non-empty
  std::optional<int> http_port;   // passed to the coordinator as --http-port when set
};

// One process of a deployment.
struct ProcessSpec {
  std::string name;               // "coordinator" or "worker i<instance>r<rank>"
  std::string host;               // where it must run
  bool local = true;              // host is this machine (IsLocalHost)
  std::vector<std::string> argv;  // argv[0] is the binary's path
};

// True for the names of this machine that a config uses: 127.0.0.1,
// localhost and ::1. Other hosts are remote, even if they resolve here.
inline bool IsLocalHost(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1";
}

// The host to probe /health on: the coordinator's http_host, except that a
// wildcard listen address is reached through loopback.
inline std::string HealthHost(const Config& config) {
  const std::string& host = config.http_host;
  if (host.empty() || host == "0.0.0.0" || host == "::" || host == "*") return "127.0.0.1";
  return host;
}

// The coordinator first, then one worker per (instance, TP rank) in the
// order of Config::Instances() (the instance id) and ascending rank. A worker
// runs on hosts[rank], or hosts[0] when the instance lists a single host.
// REQUIRES: ValidateConfig(config).ok().
inline std::vector<ProcessSpec> PlanLaunch(const Config& config, const LaunchOptions& options) {
  std::vector<std::string> common = {"--config", options.config_path};
  if (!options.model_dir.empty()) {
    common.push_back("--model-dir");
    common.push_back(options.model_dir);
  }

  std::vector<ProcessSpec> plan;
  ProcessSpec coordinator;
  coordinator.name = "coordinator";
  coordinator.host = HealthHost(config);
  coordinator.local = true;  // the launcher runs beside the coordinator
  coordinator.argv = {options.bin_dir + "/headway-coordinator"};
  coordinator.argv.insert(coordinator.argv.end(), common.begin(), common.end());
  if (options.http_port) {
    coordinator.argv.push_back("--http-port");
    coordinator.argv.push_back(std::to_string(*options.http_port));
  }
  plan.push_back(std::move(coordinator));

  const std::vector<const InstanceConfig*> instances = config.Instances();
  for (size_t id = 0; id < instances.size(); ++id) {
    const InstanceConfig& instance = *instances[id];
    for (int rank = 0; rank < instance.tp_size; ++rank) {
      ProcessSpec worker;
      worker.name = "worker i" + std::to_string(id) + "r" + std::to_string(rank);
      worker.host = instance.hosts.size() == 1 ? instance.hosts[0] : instance.hosts[rank];
      worker.local = IsLocalHost(worker.host);
      worker.argv = {options.bin_dir + "/headway-worker"};
      worker.argv.insert(worker.argv.end(), common.begin(), common.end());
      worker.argv.insert(worker.argv.end(), {"--instance-id", std::to_string(id), "--tp-rank",
                                             std::to_string(rank)});
      plan.push_back(std::move(worker));
    }
  }
  return plan;
}

// The command line as a shell would read it: arguments with characters a
// shell treats specially are single-quoted.
inline std::string ShellCommand(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& arg : argv) {
    if (!out.empty()) out += ' ';
    bool plain = !arg.empty();
    for (char c : arg) {
      bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '-' || c == '_' || c == '.' || c == '/' || c == ':' || c == '=' ||
                  c == ',' || c == '+' || c == '@';
      plain = plain && safe;
    }
    if (plain) {
      out += arg;
      continue;
    }
    out += '\'';
    for (char c : arg) {
      if (c == '\'') {
        out += "'\\''";
      } else {
        out += c;
      }
    }
    out += '\'';
  }
  return out;
}

}  // namespace headway::launcher
