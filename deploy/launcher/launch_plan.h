// The launcher's plan: which processes a deployment needs and their command
// lines, computed from a validated Config. Pure logic (no processes, no I/O);
// header-only so that tests link it without the launcher library.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"

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
  int instance_id = -1;           // workers: the instance (Config::Instances order)
  int tp_rank = -1;               // workers: the TP rank in it
  bool standby = false;           // workers of a standby slot (PoolConfig::IsStandby)
  int stdin_fd = -1;              // when >= 0, the child's stdin (ProcessGroup::Start)
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
      worker.instance_id = int(id);
      worker.tp_rank = rank;
      worker.standby = config.IsStandby(int(id));
      plan.push_back(std::move(worker));
    }
  }
  return plan;
}

// The hosts that run workers when the deployment starts (standby slots
// left out), each once, in the order the plan first names them: node rank
// r is hosts[r].
inline std::vector<std::string> WorkerHosts(const std::vector<ProcessSpec>& plan) {
  std::vector<std::string> hosts;
  for (const ProcessSpec& spec : plan) {
    if (spec.instance_id < 0 || spec.standby) continue;
    bool seen = false;
    for (const std::string& h : hosts) seen = seen || h == spec.host;
    if (!seen) hosts.push_back(spec.host);
  }
  return hosts;
}

// The plan's workers that run on `host` when the deployment starts (standby
// slots left out: WorkersOfGroupMember starts one), in plan order.
inline std::vector<ProcessSpec> WorkersOn(const std::vector<ProcessSpec>& plan,
                                          const std::string& host) {
  std::vector<ProcessSpec> workers;
  for (const ProcessSpec& spec : plan) {
    if (spec.instance_id >= 0 && !spec.standby && spec.host == host) workers.push_back(spec);
  }
  return workers;
}

// The workers of one member of an instance group, as a LeaderWorkerSet
// names its pods: the `group_index`-th instance of pool `pool` (config
// order within the pool) and its `worker_index`-th host (0 = the leader),
// so an agent finds its workers without knowing what the config calls its
// host. An instance with one host has one member, which runs every rank.
// Errors: InvalidArgument naming the pool, the index and the valid range.
// REQUIRES: `plan` is PlanLaunch(config, ...).
inline Result<std::vector<ProcessSpec>> WorkersOfGroupMember(const Config& config,
                                                             const std::vector<ProcessSpec>& plan,
                                                             const std::string& pool,
                                                             int group_index, int worker_index) {
  int first_instance = 0;
  const PoolConfig* found = nullptr;
  for (const PoolConfig& p : config.pools) {
    if (p.name == pool) {
      found = &p;
      break;
    }
    first_instance += int(p.instances.size());
  }
  if (found == nullptr) {
    std::string all;
    for (const PoolConfig& p : config.pools) all += (all.empty() ? "" : ", ") + p.name;
    return Status::InvalidArgument("--pool `" + pool + "`: the config has no such pool (pools: " +
                                   all + ")");
  }
  const int num_instances = int(found->instances.size());
  if (group_index < 0 || group_index >= num_instances) {
    return Status::InvalidArgument("--group-index " + std::to_string(group_index) + ": pool `" +
                                   pool + "` has " + std::to_string(num_instances) +
                                   (num_instances == 1 ? " instance" : " instances") + " (0 to " +
                                   std::to_string(num_instances - 1) + ")");
  }
  const InstanceConfig& instance = found->instances[size_t(group_index)];
  const int num_members = int(instance.hosts.size());
  if (worker_index < 0 || worker_index >= num_members) {
    return Status::InvalidArgument(
        "--worker-index " + std::to_string(worker_index) + ": instance " +
        std::to_string(group_index) + " of pool `" + pool + "` has " +
        std::to_string(num_members) + " host" + (num_members == 1 ? "" : "s") + " (0 to " +
        std::to_string(num_members - 1) + ")");
  }
  const int instance_id = first_instance + group_index;
  std::vector<ProcessSpec> workers;
  for (const ProcessSpec& spec : plan) {
    if (spec.instance_id != instance_id) continue;
    if (num_members == 1 || spec.tp_rank == worker_index) workers.push_back(spec);
  }
  return workers;
}

// One node agent per host that runs workers (WorkerHosts order), named
// "node <host>": `headway-node --config C --host H` with the plan's
// --model-dir and --bin-dir, and --exit-on-stdin-eof so that an agent the
// launcher starts stops with it.
inline std::vector<ProcessSpec> PlanNodes(const std::vector<ProcessSpec>& plan,
                                          const LaunchOptions& options) {
  std::vector<ProcessSpec> nodes;
  for (const std::string& host : WorkerHosts(plan)) {
    ProcessSpec node;
    node.name = "node " + host;
    node.host = host;
    node.local = IsLocalHost(host);
    node.argv = {options.bin_dir + "/headway-node", "--config", options.config_path, "--host", host};
    if (!options.model_dir.empty()) {
      node.argv.insert(node.argv.end(), {"--model-dir", options.model_dir});
    }
    node.argv.insert(node.argv.end(), {"--bin-dir", options.bin_dir});
    if (node.local) node.argv.push_back("--exit-on-stdin-eof");
    nodes.push_back(std::move(node));
  }
  return nodes;
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
