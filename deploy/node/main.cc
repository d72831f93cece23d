// headway-node: the node agent. Starts every worker the deployment's plan
// puts on this host and keeps them running: a worker that dies takes its
// instance's other ranks here down with it, and the instance starts again
// after a backoff that doubles per failure (1 s up to 30 s); the other
// instances keep serving. The same command runs on every node, with the
// node named by host, by rank, or by its place in an instance group:
//
//   headway-node --config C (--host H | --node-rank R |
//                            --pool P --group-index G --worker-index W)
//                [--model-dir DIR] [--bin-dir DIR] [--exit-on-stdin-eof]
//
// Node rank R is the R-th host that runs workers, in the order the plan
// first names them (instances in config order, ranks ascending). The third
// form is a LeaderWorkerSet pod's (headway-launch render k8s): instance G of
// pool P (its order in the pool), host W of that instance (0 = the leader;
// an instance with one host runs every rank there), whatever the config
// calls that host; a pod knows G and W from its labels and environment
// before it knows any name.
// SIGTERM or SIGINT stops the workers and exits 0. With --exit-on-stdin-eof
// (headway-launch passes it, keeping a pipe open) the agent also stops when
// its stdin closes, so it never outlives its launcher.
//
// Exit status: 0 after a requested stop; 1 when a worker could not be
// started or refused its configuration (exit status 2, not restarted);
// 2 for a bad command line or config.
#include <poll.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/config.h"
#include "common/startup.h"
#include "deploy/launcher/launch_plan.h"
#include "deploy/launcher/process_group.h"
#include "deploy/launcher/signals.h"
#include "deploy/node/node_supervisor.h"

namespace {

using namespace headway;

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
constexpr std::chrono::milliseconds kPollInterval(100);

// The supervisor's processes: children of this agent.
class GroupRunner final : public node::ProcessRunner {
 public:
  explicit GroupRunner(const sigset_t& child_mask) : group_(child_mask) {}
  Result<pid_t> Start(const launcher::ProcessSpec& spec) override {
    Result<pid_t> pid = group_.Start(spec);
    if (pid.ok()) {
      std::fprintf(stderr, "headway-node: started %s (pid %d): %s\n", spec.name.c_str(),
                   static_cast<int>(*pid), launcher::ShellCommand(spec.argv).c_str());
    }
    return pid;
  }
  std::optional<launcher::ExitedChild> ReapExited() override { return group_.ReapExited(); }
  void Stop(const std::vector<pid_t>& pids) override { group_.Stop(pids); }

 private:
  launcher::ProcessGroup group_;
};

// True once stdin is at end of file (its writer closed it).
bool StdinClosed() {
  pollfd fd{STDIN_FILENO, POLLIN, 0};
  if (poll(&fd, 1, 0) <= 0) return false;
  if (fd.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
  char buf[256];
  return read(STDIN_FILENO, buf, sizeof buf) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Headway node agent: starts and supervises this host's workers."};
  std::string config_path, host, model_dir, bin_dir;
  int node_rank = -1;
  bool exit_on_stdin_eof = false;
  app.add_option("--config", config_path, "deployment YAML")->required();
  CLI::Option* host_opt = app.add_option("--host", host, "this node, as the config names it");
  CLI::Option* rank_opt =
      app.add_option("--node-rank", node_rank, "this node's rank among the hosts that run workers")
          ->check(CLI::NonNegativeNumber);
  host_opt->excludes(rank_opt);
  std::string pool;
  int group_index = -1;
  int worker_index = -1;
  CLI::Option* pool_opt =
      app.add_option("--pool", pool, "with --group-index and --worker-index: this node's pool");
  CLI::Option* group_opt =
      app.add_option("--group-index", group_index, "the instance's index in --pool")
          ->check(CLI::NonNegativeNumber);
  CLI::Option* worker_opt =
      app.add_option("--worker-index", worker_index, "this node's host in the instance (0 = first)")
          ->check(CLI::NonNegativeNumber);
  pool_opt->needs(group_opt, worker_opt)->excludes(host_opt, rank_opt);
  group_opt->needs(pool_opt);
  worker_opt->needs(pool_opt);
  app.add_option("--model-dir", model_dir,
                 "directory for a relative model.path (default: $HEADWAY_MODEL_DIR, else "
                 "~/.cache/headway/models)");
  app.add_option("--bin-dir", bin_dir, "where headway-worker is (default: beside this binary)");
  app.add_flag("--exit-on-stdin-eof", exit_on_stdin_eof,
               "stop the workers and exit when stdin closes (headway-launch's pipe)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  if (host.empty() && node_rank < 0 && pool.empty()) {
    std::fprintf(stderr, "headway-node: give --host, --node-rank, or --pool with --group-index "
                 "and --worker-index\n");
    return kExitUsage;
  }
  // Environment is read here and nowhere else.
  if (model_dir.empty()) {
    model_dir = DefaultModelDir(std::getenv("HEADWAY_MODEL_DIR"), std::getenv("HOME"));
  }
  if (bin_dir.empty()) bin_dir = launcher::OwnDirectory();
  std::error_code ec;
  const std::filesystem::path absolute_config = std::filesystem::absolute(config_path, ec);
  if (!ec) config_path = absolute_config.string();

  Result<Config> config = LoadConfigFile(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "headway-node: config error: %s\n", config.status().message().c_str());
    return kExitUsage;
  }
  launcher::LaunchOptions options;
  options.config_path = config_path;
  options.bin_dir = bin_dir;
  options.model_dir = model_dir;
  const std::vector<launcher::ProcessSpec> plan = launcher::PlanLaunch(*config, options);
  const std::vector<std::string> hosts = launcher::WorkerHosts(plan);
  if (node_rank >= 0) {
    if (node_rank >= int(hosts.size())) {
      std::fprintf(stderr, "headway-node: --node-rank %d: the config has %zu hosts with workers\n",
                   node_rank, hosts.size());
      return kExitUsage;
    }
    host = hosts[size_t(node_rank)];
  }
  std::vector<launcher::ProcessSpec> workers;
  if (!pool.empty()) {
    Result<std::vector<launcher::ProcessSpec>> member =
        launcher::WorkersOfGroupMember(*config, plan, pool, group_index, worker_index);
    if (!member.ok()) {
      std::fprintf(stderr, "headway-node: %s\n", member.status().message().c_str());
      return kExitUsage;
    }
    workers = std::move(member).value();
  } else {
    workers = launcher::WorkersOn(plan, host);
  }
  if (workers.empty()) {
    std::string names;
    for (const std::string& h : hosts) names += (names.empty() ? "" : ", ") + h;
    std::fprintf(stderr, "headway-node: no worker of %s runs on host `%s` (hosts with workers: %s)\n",
                 config_path.c_str(), host.c_str(), names.c_str());
    return kExitUsage;
  }
  for (launcher::ProcessSpec& spec : workers) spec.local = true;  // this agent runs them here

  const sigset_t child_mask = launcher::BlockSupervisorSignals();
  GroupRunner runner(child_mask);
  node::NodeSupervisor supervisor(std::move(workers), &runner, node::RestartPolicy{});
  if (Status s = supervisor.Start(node::Clock::now()); !s.ok()) {
    std::fprintf(stderr, "headway-node: %s\n", s.message().c_str());
    return kExitFailure;
  }
  for (;;) {
    const std::optional<int> sig = launcher::WaitSignal(kPollInterval);
    if (launcher::IsStopSignal(sig)) {
      std::fprintf(stderr, "headway-node: %s received, stopping the workers\n",
                   *sig == SIGINT ? "SIGINT" : "SIGTERM");
      supervisor.StopAll();
      return 0;
    }
    if (exit_on_stdin_eof && StdinClosed()) {
      std::fprintf(stderr, "headway-node: stdin closed (the launcher is gone), stopping\n");
      supervisor.StopAll();
      return 0;
    }
    std::vector<std::string> log;
    const Status polled = supervisor.Poll(node::Clock::now(), &log);
    for (const std::string& line : log) std::fprintf(stderr, "headway-node: %s\n", line.c_str());
    if (!polled.ok()) {
      std::fprintf(stderr, "headway-node: %s; stopping\n", polled.message().c_str());
      supervisor.StopAll();
      return kExitFailure;
    }
  }
}
