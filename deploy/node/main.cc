// headway-node: the node agent. Starts every worker the deployment's plan
// puts on this host and keeps them running: a worker that dies takes its
// instance's other ranks here down with it, and the instance starts again
// after a backoff that doubles per failure (1 s up to 30 s); the other
// instances keep serving. The same command runs on every node, with the
// node named by host, by rank, or by its place in an instance group:
//
//   headway-node --config C (--host H | --node-rank R |
//                            --pool P --group-index G --worker-index W)
//                [--model-dir DIR] [--bin-dir DIR] [--bind-host B]
//                [--advertise-host A] [--exit-on-stdin-eof | --drain-on-stdin-eof]
//   headway-node --preflight --config C [--model-dir DIR]
//
// --bind-host and --advertise-host are passed to every worker it starts
// (headway-worker's flags of the same names): where their collective and
// KV-transfer endpoints listen and what peers dial, overriding the config's
// host_addresses entry for this host. On Kubernetes the pod IP, known only
// from the environment, goes in --advertise-host.
//
// Node rank R is the R-th host that runs workers, in the order the plan
// first names them (instances in config order, ranks ascending). The third
// form is a LeaderWorkerSet pod's (headway-launch render k8s): instance G of
// pool P (its order in the pool), host W of that instance (0 = the leader;
// an instance with one host runs every rank there), whatever the config
// calls that host; a pod knows G and W from its labels and environment
// before it knows any name.
//
// SIGTERM drains: each worker asks the coordinator to drain its instance
// (no new request, the running ones finish within drain_timeout_ms) and
// exits when released; the agent then exits 0 (Kubernetes, systemd and
// rolling restarts stop it this way). SIGINT stops the workers at once. A
// worker that exits 0 was released by a drain (POST
// /admin/instances/N/drain): its instance starts again at once. With --exit-on-stdin-eof
// (headway-launch passes it, keeping a pipe open) the agent also stops when
// its stdin closes, so it never outlives its launcher; with
// --drain-on-stdin-eof (headway-launch join) it drains as on SIGTERM first.
//
// --preflight starts nothing: it prints this host's preflight report (its
// version, the config file's hash, the model file's path, size and
// checksum, and what keeps its workers from reading their control-plane
// key files; deploy/launcher/preflight.h) for headway-launch to compare
// before a multi-host deployment starts, and exits 0 (a missing model or
// key file is part of the report, not an error).
//
// Exit status: 0 after a requested stop; 1 when a worker could not be
// started or refused its configuration (exit status 2, not restarted);
// 2 for a bad command line or config.
#include <poll.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/config.h"
#include "common/startup.h"
#include "deploy/launcher/launch_plan.h"
#include "deploy/launcher/preflight.h"
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
  // `drain_grace`: how long a draining worker may take before SIGKILL.
  GroupRunner(const sigset_t& child_mask, std::chrono::milliseconds drain_grace)
      : group_(child_mask), drain_grace_(drain_grace) {}
  Result<pid_t> Start(const launcher::ProcessSpec& spec) override {
    Result<pid_t> pid = group_.Start(spec);
    if (pid.ok()) {
      std::fprintf(stderr, "headway-node: started %s (pid %d): %s\n", spec.name.c_str(),
                   static_cast<int>(*pid), launcher::ShellCommand(spec.argv).c_str());
    }
    return pid;
  }
  std::optional<launcher::ExitedChild> ReapExited() override { return group_.ReapExited(); }
  // A worker drains on SIGTERM and stops at once on SIGINT (worker/main.cc).
  void Stop(const std::vector<pid_t>& pids, Mode mode) override {
    if (mode == Mode::kDrain) {
      group_.Stop(pids, drain_grace_, SIGTERM);
    } else {
      group_.Stop(pids, std::chrono::seconds(10), SIGINT);
    }
  }

 private:
  launcher::ProcessGroup group_;
  const std::chrono::milliseconds drain_grace_;
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
  std::string config_path, host, model_dir, bin_dir, bind_host, advertise_host;
  int node_rank = -1;
  bool exit_on_stdin_eof = false;
  bool drain_on_stdin_eof = false;
  bool preflight = false;
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
  app.add_option("--bind-host", bind_host,
                 "passed to each worker: where its collective and KV-transfer endpoints listen "
                 "(an IP, a name, or 0.0.0.0)");
  app.add_option("--advertise-host", advertise_host,
                 "passed to each worker: what peers dial to reach those endpoints (an IP or a "
                 "name, e.g. the pod IP)");
  app.add_flag("--exit-on-stdin-eof", exit_on_stdin_eof,
               "stop the workers and exit when stdin closes (headway-launch's pipe)");
  app.add_flag("--drain-on-stdin-eof", drain_on_stdin_eof,
               "when stdin closes, drain the workers' instances (as SIGTERM does) and exit "
               "(headway-launch join: a joined slot leaves without failing a request)")
      ->excludes("--exit-on-stdin-eof");
  app.add_flag("--preflight", preflight,
               "print this host's version, config hash and model file size and checksum, and "
               "exit (headway-launch runs it over ssh before starting)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  // Over ssh, stderr is a pipe that closes with the session: a log line
  // written after that must not kill the agent before it stops its workers.
  signal(SIGPIPE, SIG_IGN);
  if (preflight) {
    if (model_dir.empty()) {
      model_dir = DefaultModelDir(std::getenv("HEADWAY_MODEL_DIR"), std::getenv("HOME"));
    }
    Result<Config> loaded = LoadConfigFile(config_path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "headway-node: config error: %s\n", loaded.status().message().c_str());
      return kExitUsage;
    }
    ResolveModelPath(*loaded, model_dir);
    Result<launcher::PreflightReport> report =
        launcher::LocalPreflight(config_path, loaded->head_pattern_path, loaded->model_path);
    if (!report.ok()) {
      std::fprintf(stderr, "headway-node: %s\n", report.status().message().c_str());
      return kExitUsage;
    }
    report->key_errors = launcher::CheckWorkerKeyFiles(loaded->security);
    std::fputs(launcher::FormatPreflight(*report).c_str(), stdout);
    return 0;
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
  for (launcher::ProcessSpec& spec : workers) {
    spec.local = true;  // this agent runs them here
    // Checked here too, so that a malformed value stops the agent at once
    // instead of every worker exiting.
    Result<WorkerAddresses> addresses =
        WorkerAddressesOf(*config, spec.instance_id, spec.tp_rank, bind_host, advertise_host);
    if (!addresses.ok()) {
      std::fprintf(stderr, "headway-node: %s\n", addresses.status().message().c_str());
      return kExitUsage;
    }
    if (!bind_host.empty()) spec.argv.insert(spec.argv.end(), {"--bind-host", bind_host});
    if (!advertise_host.empty()) {
      spec.argv.insert(spec.argv.end(), {"--advertise-host", advertise_host});
    }
  }

  const sigset_t child_mask = launcher::BlockSupervisorSignals();
  // A worker drains for at most drain_timeout_ms, then gives up on a
  // silent coordinator after heartbeat_timeout_ms more.
  GroupRunner runner(child_mask,
                     std::chrono::milliseconds(config->drain_timeout_ms +
                                               config->heartbeat_timeout_ms) +
                         std::chrono::seconds(5));
  node::NodeSupervisor supervisor(std::move(workers), &runner, node::RestartPolicy{});
  if (Status s = supervisor.Start(node::Clock::now()); !s.ok()) {
    std::fprintf(stderr, "headway-node: %s\n", s.message().c_str());
    return kExitFailure;
  }
  for (;;) {
    const std::optional<int> sig = launcher::WaitSignal(kPollInterval);
    if (launcher::IsStopSignal(sig)) {
      const bool drain = *sig == SIGTERM;
      std::fprintf(stderr, "headway-node: %s received, %s\n", drain ? "SIGTERM" : "SIGINT",
                   drain ? "draining the workers' instances, then stopping"
                         : "stopping the workers");
      supervisor.StopAll(drain ? node::ProcessRunner::Mode::kDrain
                               : node::ProcessRunner::Mode::kNow);
      return 0;
    }
    if ((exit_on_stdin_eof || drain_on_stdin_eof) && StdinClosed()) {
      std::fprintf(stderr, "headway-node: stdin closed (the launcher is gone), %s\n",
                   drain_on_stdin_eof ? "draining the workers' instances, then stopping"
                                      : "stopping");
      supervisor.StopAll(drain_on_stdin_eof ? node::ProcessRunner::Mode::kDrain
                                            : node::ProcessRunner::Mode::kNow);
      return 0;
    }
    std::vector<std::string> log;
    const Status polled = supervisor.Poll(node::Clock::now(), &log);
    for (const std::string& line : log) std::fprintf(stderr, "headway-node: %s\n", line.c_str());
    if (!polled.ok()) {
      std::fprintf(stderr, "headway-node: %s; stopping\n", polled.message().c_str());
      supervisor.StopAll(node::ProcessRunner::Mode::kNow);
      return kExitFailure;
    }
  }
}
