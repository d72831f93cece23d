// headway-launch: starts a deployment described by one YAML file: the
// coordinator, and one node agent (headway-node) per host that runs workers,
// which starts that host's workers and restarts an instance whose worker
// dies. The coordinator always runs here, beside the launcher. Agents for
// this machine start here; for every other host the launcher first runs a
// preflight over ssh on all of them at once (`headway-node --preflight`:
// the same build, the same config file, a model file of the same size and
// checksum; deploy/launcher/preflight.h), then runs each host's agent in an
// ssh session (`ssh -o BatchMode=yes HOST headway-node ...`, options from
// the config's `launch:` section; deploy/launcher/ssh_launch.h). It waits
// until the coordinator's /health answers 200 and supervises the
// coordinator and the agents (local, or their ssh sessions) until
// SIGINT/SIGTERM or until one of them exits (a worker's death is its
// agent's business). A stop reaches every host: the agents' stdin closes,
// each stops its workers and exits, and only then does the coordinator stop.
//
// Exit status: 0 after a requested stop; 1 when a process failed to start,
// the coordinator or an agent died, or the deployment was not ready in
// time; 2 when nothing could be started: a bad command line, config or
// missing model file, a Headway binary missing here, or a remote host that
// failed the preflight (the message names the host).
//
// `headway-launch join CONFIG --pool P --group-index G [--host H]...` runs
// one standby slot of a running deployment, on the hosts its instance
// names or on --host (JoinMain says more).
//
// `headway-launch render k8s CONFIG -o DIR [options]` starts nothing: it
// writes Kubernetes manifests for the config into DIR
// (deploy/launcher/k8s_manifests.h lists them). Exit status: 0 when written;
// 1 when DIR cannot be written; 2 for a bad command line or a config that
// Kubernetes cannot run as rendered.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <optional>
#include <string>

#include "common/config.h"
#include "common/startup.h"
#include "deploy/launcher/captured_commands.h"
#include "deploy/launcher/health_probe.h"
#include "deploy/launcher/k8s_manifests.h"
#include "deploy/launcher/slurm_script.h"
#include "deploy/launcher/launch_plan.h"
#include "deploy/launcher/preflight.h"
#include "deploy/launcher/process_group.h"
#include "deploy/launcher/signals.h"
#include "deploy/launcher/ssh_launch.h"

namespace {

using namespace headway;
using namespace headway::launcher;
using Clock = std::chrono::steady_clock;

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// An agent stops its workers (up to 10 s each, deploy/node/main.cc) before
// it exits; a remote one's ssh session ends after that.
constexpr std::chrono::seconds kAgentStopGrace(20);

// The launcher's children and the pipe every agent reads as its stdin
// (locally, or through its ssh session).
struct Supervised {
  explicit Supervised(const sigset_t& child_mask) : group(child_mask) {}
  ProcessGroup group;
  int agent_stdin_writer = -1;  // closed to stop every agent
  std::vector<pid_t> agent_pids;
};

// The whole deployment stops at once, workers first: closing the agents'
// stdin stops each (a remote agent learns of it through ssh, which a signal
// to the ssh client would not tell it in order), and the agents stop their
// workers with SIGINT, not the SIGTERM that drains (deploy/node/main.cc).
// Signal 0 sends nothing: the agents are only waited for. The coordinator
// goes last, with SIGINT.
void StopEverything(Supervised& s) {
  if (s.agent_stdin_writer >= 0) {
    close(s.agent_stdin_writer);
    s.agent_stdin_writer = -1;
  }
  s.group.Stop(s.agent_pids, kAgentStopGrace, 0);
  s.group.StopAll(std::chrono::seconds(10), SIGINT);
}

int StopOnSignal(Supervised& s, int sig) {
  std::fprintf(stderr, "headway: %s received, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  StopEverything(s);
  return 0;
}

int StopOnExit(Supervised& s, const ExitedChild& exited) {
  std::fprintf(stderr, "headway: %s (pid %d) %s; stopping the deployment\n", exited.name.c_str(),
               static_cast<int>(exited.pid), DescribeWaitStatus(exited.wait_status).c_str());
  StopEverything(s);
  return kExitFailure;
}

// Exit status of a command the remote login shell could not find.
constexpr int kRemoteCommandNotFound = 127;
// Exit status of ssh itself failing (cannot connect, refused login).
constexpr int kSshFailed = 255;

std::string LastLines(const std::string& text, size_t max_chars = 600) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  return t.size() > max_chars ? "..." + t.substr(t.size() - max_chars) : t;
}

// Runs `headway-node --preflight` on every remote host at once and compares
// each report with this machine's. Returns true when all agree; otherwise
// prints one line per problem, each naming its host.
bool PreflightRemoteHosts(const std::string& ssh_path, const Config& config,
                          const std::string& config_path, const std::string& bin_dir,
                          const std::vector<std::string>& hosts, const PreflightReport& local) {
  const LaunchConfig& launch = config.launch;
  const std::vector<std::string> remote_argv =
      RemotePreflightArgv(launch, config_path, bin_dir);
  std::vector<std::vector<std::string>> commands;
  for (const std::string& host : hosts) {
    commands.push_back(SshArgv(ssh_path, launch, host, remote_argv, false));
  }
  // Connecting, then hashing the model from a cold disk.
  const std::chrono::seconds timeout(launch.connect_timeout_s + 120);
  const std::vector<CapturedCommand> results = RunCaptured(commands, timeout);
  bool ok = true;
  for (size_t i = 0; i < hosts.size(); ++i) {
    const std::string& host = hosts[i];
    const CapturedCommand& r = results[i];
    auto fail = [&](const std::string& problem) {
      std::fprintf(stderr, "headway-launch: preflight: host %s: %s\n", host.c_str(),
                   problem.c_str());
      ok = false;
    };
    if (r.timed_out) {
      fail("no answer within " + std::to_string(timeout.count()) + " s: " + LastLines(r.output));
      continue;
    }
    const int exit_code = WIFEXITED(r.wait_status) ? WEXITSTATUS(r.wait_status) : -1;
    if (exit_code == kSshFailed || r.wait_status == -1) {
      fail("cannot run a command there over ssh (" + LastLines(r.output) +
           "); check that sshd runs there and that `" + ShellCommand(commands[i]) +
           "` works without a password or prompt (launch.user, launch.port, launch.key, "
           "launch.known_hosts)");
      continue;
    }
    if (exit_code == kRemoteCommandNotFound) {
      fail(remote_argv[0] + " not found there (" + LastLines(r.output) +
           "): install Headway there, or set launch.bin_dir");
      continue;
    }
    if (exit_code != 0) {
      fail(ShellCommand(remote_argv) + " failed (" + DescribeWaitStatus(r.wait_status) + "): " +
           LastLines(r.output));
      continue;
    }
    Result<PreflightReport> remote = ParsePreflight(r.output);
    if (!remote.ok()) {
      fail(remote.status().message() + ": " + LastLines(r.output));
      continue;
    }
    for (const std::string& problem : PreflightProblems(local, *remote)) fail(problem);
  }
  return ok;
}

bool ReadFile(const std::string& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream buf;
  buf << in.rdbuf();
  *text = buf.str();
  return bool(in) || in.eof();
}

// Writes `text` to `path` created with mode 0600 (and made 0600 if it
// existed), so that key material is never readable by others, not even
// while it is written. False on an I/O error.
bool WriteSecretFile(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  bool ok = fchmod(fd, 0600) == 0;
  for (size_t done = 0; ok && done < text.size();) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += size_t(n);
  }
  return close(fd) == 0 && ok;
}

// Writes `files` into `dir` (created); prints each path. Exit status.
int WriteRendered(const std::string& dir, const std::vector<RenderedFile>& files) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  for (const RenderedFile& file : files) {
    const std::string path = (std::filesystem::path(dir) / file.file_name).string();
    bool written;
    if (file.secret) {
      written = WriteSecretFile(path, file.text);
    } else {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << file.text;
      out.close();
      written = bool(out);
    }
    if (!written) {
      std::fprintf(stderr, "headway-launch: cannot write %s\n", path.c_str());
      return kExitFailure;
    }
    if (file.executable) {
      std::filesystem::permissions(path, std::filesystem::perms::owner_exec |
                                             std::filesystem::perms::group_exec |
                                             std::filesystem::perms::others_exec,
                                   std::filesystem::perm_options::add, ec);
    }
    std::printf("%s\n", path.c_str());
  }
  return 0;
}

// A rendered deployment's control port is always reachable from other
// machines (control_bind 0.0.0.0): says on stderr what its processes will
// need, since they check it only when they start (CheckControlPlaneSecurity).
void WarnAboutControlPlaneKeys(const Config& config, const char* renderer) {
  if (config.security.insecure) return;
  if (!config.security.HasKeys()) {
    std::fprintf(stderr,
                 "headway-launch: render %s: warning: the rendered control port is reachable "
                 "from other machines and the config names no security keys: the coordinator "
                 "and workers will refuse to start (exit 2). Add keys (headway-keygen; README "
                 "\"Security\") or `security.insecure: true`\n",
                 renderer);
  }
}

// The text of the key files `security` names, for a rendered Secret. An
// authorized_keys directory becomes one file: its public key files one after
// the other (each keeps its `public-key = "..."` line), as ReadAuthorizedKeys
// reads a directory. Prints what it cannot read; false then.
bool ReadKeyFiles(const SecurityConfig& security, K8sOptions::KeyFiles* files) {
  auto read = [](const char* key, const std::string& path, std::string* text) {
    if (ReadFile(path, text)) return true;
    std::fprintf(stderr,
                 "headway-launch: render k8s: cannot read security.%s = %s for the Secret: "
                 "render where the key files are, or pass --key-secret NAME for a Secret you "
                 "created (README \"Security\")\n",
                 key, path.c_str());
    return false;
  };
  bool ok = read("coordinator_key", security.coordinator_key, &files->coordinator_key);
  ok = read("coordinator_public_key", security.coordinator_public_key,
            &files->coordinator_public_key) && ok;
  ok = read("client_key", security.client_key, &files->client_key) && ok;
  std::error_code ec;
  if (!std::filesystem::is_directory(security.authorized_keys, ec)) {
    return read("authorized_keys", security.authorized_keys, &files->authorized_keys) && ok;
  }
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::directory_iterator(security.authorized_keys, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && !name.ends_with("_secret") && !name.starts_with(".")) {
      paths.push_back(e.path().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  for (const std::string& path : paths) {
    std::string text;
    ok = read("authorized_keys", path, &text) && ok;
    files->authorized_keys += "# " + std::filesystem::path(path).filename().string() + "\n" + text;
    if (!text.empty() && text.back() != '\n') files->authorized_keys += "\n";
  }
  return ok;
}

// headway-launch render slurm CONFIG -o DIR.
int RenderSlurmMain(const std::string& config_path, const std::string& out_dir,
                    SlurmOptions options) {
  Result<Config> loaded = LoadConfigFile(config_path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "headway-launch: config error: %s\n", loaded.status().message().c_str());
    return kExitUsage;
  }
  std::string config_yaml;
  if (!ReadFile(config_path, &config_yaml)) {
    std::fprintf(stderr, "headway-launch: cannot read %s\n", config_path.c_str());
    return kExitUsage;
  }
  WarnAboutControlPlaneKeys(*loaded, "slurm");
  std::error_code ec;
  options.render_dir = std::filesystem::absolute(out_dir, ec).lexically_normal().string();
  Result<std::vector<RenderedFile>> files = RenderSlurm(config_yaml, *loaded, options);
  if (!files.ok()) {
    std::fprintf(stderr, "headway-launch: render slurm: %s\n", files.status().message().c_str());
    return kExitUsage;
  }
  return WriteRendered(out_dir, *files);
}

// headway-launch render k8s|slurm ...: argv[0] is "render".
int RenderMain(int argc, char** argv) {
  CLI::App app{"Writes Kubernetes manifests for a Headway deployment config.",
               "headway-launch render"};
  app.require_subcommand(1);
  CLI::App* k8s = app.add_subcommand(
      "k8s", "a ConfigMap, the coordinator's Deployment and Services, a LeaderWorkerSet per "
             "mixed pool, a DisaggregatedSet for the prefill and decode pools");
  std::string config_path, out_dir, model_dir;
  K8sOptions options;
  k8s->add_option("config", config_path, "deployment YAML (see deploy/configs/local.yaml)")
      ->required();
  k8s->add_option("-o,--output", out_dir, "directory to write the manifests into")->required();
  k8s->add_option("--name", options.name, "prefix of every object's name (default headway)");
  k8s->add_option("--namespace", options.namespace_name, "namespace (default default)");
  k8s->add_option("--image", options.image,
                  "container image holding the Headway binaries (default headway:latest)");
  k8s->add_option("--image-bin-dir", options.image_bin_dir,
                  "where the image keeps them (default /usr/local/bin)");
  k8s->add_option("--model-claim", options.model_claim,
                  "PersistentVolumeClaim holding the model directory, mounted at /models "
                  "(default headway-models)");
  k8s->add_option("--key-secret", options.key_secret,
                  "with security keys: a Secret you created holding coordinator.key_secret, "
                  "coordinator.key, client.key_secret and authorized_keys (default: render "
                  "Secret NAME-keys from the key files into secret.yaml, mode 0600)");
  k8s->add_option("--model-dir", model_dir,
                  "local model directory, read only to size the pods' memory from the model "
                  "file (default: $HEADWAY_MODEL_DIR, else ~/.cache/headway/models)");
  CLI::App* slurm = app.add_subcommand(
      "slurm", "a batch script running the coordinator on the batch host and one node agent "
               "per node through srun, and the config it reads");
  SlurmOptions slurm_options;
  std::string slurm_config, slurm_dir;
  slurm->add_option("config", slurm_config, "deployment YAML (see deploy/configs/local.yaml)")
      ->required();
  slurm->add_option("-o,--output", slurm_dir,
                    "directory to write into, on a filesystem every node sees")
      ->required();
  slurm->add_option("--bin-dir", slurm_options.bin_dir,
                    "where the nodes have the Headway binaries (default: beside this one)");
  slurm->add_option("--model-dir", slurm_options.model_dir,
                    "the nodes' model directory (default: $HEADWAY_MODEL_DIR, else "
                    "~/.cache/headway/models, as here)");
  slurm->add_option("--job-name", slurm_options.job_name, "#SBATCH --job-name (default headway)");
  slurm->add_option("--time", slurm_options.time_limit, "#SBATCH --time, e.g. 04:00:00");
  slurm->add_option("--partition", slurm_options.partition, "#SBATCH --partition");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  // Environment is read here and in main, nowhere else.
  if (model_dir.empty()) {
    model_dir = DefaultModelDir(std::getenv("HEADWAY_MODEL_DIR"), std::getenv("HOME"));
  }
  if (slurm->parsed()) {
    if (slurm_options.model_dir.empty()) slurm_options.model_dir = model_dir;
    if (slurm_options.bin_dir.empty()) slurm_options.bin_dir = OwnDirectory();
    return RenderSlurmMain(slurm_config, slurm_dir, slurm_options);
  }
  Result<Config> loaded = LoadConfigFile(config_path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "headway-launch: config error: %s\n", loaded.status().message().c_str());
    return kExitUsage;
  }
  WarnAboutControlPlaneKeys(*loaded, "k8s");
  std::string config_yaml, head_pattern_yaml;
  if (!ReadFile(config_path, &config_yaml)) {
    std::fprintf(stderr, "headway-launch: cannot read %s\n", config_path.c_str());
    return kExitUsage;
  }
  if (!loaded->head_pattern_path.empty() &&
      !ReadFile(loaded->head_pattern_path, &head_pattern_yaml)) {
    std::fprintf(stderr, "headway-launch: cannot read model.head_pattern %s\n",
                 loaded->head_pattern_path.c_str());
    return kExitUsage;
  }
  Config resolved = *loaded;
  ResolveModelPath(resolved, model_dir);
  std::error_code ec;
  const uintmax_t model_bytes = std::filesystem::file_size(resolved.model_path, ec);
  if (!ec) {
    options.model_mb = int64_t((model_bytes + (1u << 20) - 1) >> 20);
  } else {
    std::fprintf(stderr, "headway-launch: %s not found here; sizing pods for a %lld MiB model\n",
                 resolved.model_path.c_str(), static_cast<long long>(options.model_mb));
  }
  if (loaded->security.HasKeys() && options.key_secret.empty()) {
    if (!ReadKeyFiles(loaded->security, &options.key_files)) return kExitUsage;
    std::fprintf(stderr,
                 "headway-launch: render k8s: secret.yaml holds the control plane's secret keys "
                 "(mode 0600): keep it out of version control, or pass --key-secret NAME\n");
  }
  Result<std::vector<RenderedFile>> files = RenderK8s(config_yaml, *loaded, head_pattern_yaml, options);
  if (!files.ok()) {
    std::fprintf(stderr, "headway-launch: render k8s: %s\n", files.status().message().c_str());
    return kExitUsage;
  }
  return WriteRendered(out_dir, *files);
}

// headway-launch join CONFIG --pool P --group-index G [--host H]...: runs a
// standby slot's node agents, one per host of its instance, each over ssh
// where the host is not this machine (after the same preflight as a
// launch), with --drain-on-stdin-eof: SIGINT or SIGTERM closes their stdin
// and the slot drains and leaves. Exit status: 0 once the slot left on
// request; 1 when an agent could not start or exited on its own; 2 for a
// bad command line or config, a slot that is not standby, a binary missing
// here or a host that failed the preflight.
// Fills what the command line left out: the model dir from
// $HEADWAY_MODEL_DIR or $HOME, the bin dir beside this binary, and makes the
// config path absolute (workers and agents get it from another directory).
// The environment is read here and nowhere else.
void ResolveLaunchPaths(std::string* model_dir, std::string* bin_dir, std::string* config_path) {
  if (model_dir->empty()) {
    *model_dir = DefaultModelDir(std::getenv("HEADWAY_MODEL_DIR"), std::getenv("HOME"));
  }
  if (bin_dir->empty()) *bin_dir = OwnDirectory();
  std::error_code ec;
  const std::filesystem::path absolute_config = std::filesystem::absolute(*config_path, ec);
  if (!ec) *config_path = absolute_config.string();
}

int JoinMain(int argc, char** argv) {
  CLI::App app{"Runs a standby slot of a pool (declared with min and max): its node agents, over "
               "ssh for other hosts; SIGINT or SIGTERM drains it away.",
               "headway-launch join"};
  std::string config_path, pool, model_dir, bin_dir;
  int group_index = -1;
  std::vector<std::string> hosts;
  app.add_option("config", config_path, "the running deployment's YAML")->required();
  app.add_option("--pool", pool, "the pool whose slot joins")->required();
  app.add_option("--group-index", group_index, "the slot: the instance's index in --pool")
      ->required()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--host", hosts,
                 "where the slot's workers run, once per host of its instance in worker-index "
                 "order (default: the hosts the config's instance names); workers on a host "
                 "given here bind and advertise that name");
  app.add_option("--model-dir", model_dir,
                 "directory for a relative model.path here (default: $HEADWAY_MODEL_DIR, else "
                 "~/.cache/headway/models)");
  app.add_option("--bin-dir", bin_dir, "where headway-node is (default: beside this binary)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  ResolveLaunchPaths(&model_dir, &bin_dir, &config_path);
  Result<Config> loaded = LoadConfigFile(config_path);
  Status valid = loaded.ok() ? ValidateConfig(*loaded) : loaded.status();
  if (!valid.ok()) {
    std::fprintf(stderr, "headway-launch join: config error: %s\n", valid.message().c_str());
    return kExitUsage;
  }
  const Config& config = *loaded;
  LaunchOptions options{config_path, bin_dir, model_dir, std::nullopt};
  Result<std::vector<ProcessSpec>> leader =
      WorkersOfGroupMember(config, PlanLaunch(config, options), pool, group_index, 0);
  if (!leader.ok()) {
    std::fprintf(stderr, "headway-launch join: %s\n", leader.status().message().c_str());
    return kExitUsage;
  }
  const PoolConfig* slot_pool = nullptr;
  for (const PoolConfig& p : config.pools) slot_pool = p.name == pool ? &p : slot_pool;
  if (!slot_pool->IsStandby(group_index)) {
    std::fprintf(stderr, "headway-launch join: --group-index %d: slot %d of pool `%s` starts with "
                 "the deployment (its first %d do); standby slots are %d to %zu\n", group_index,
                 group_index, pool.c_str(), slot_pool->NumInitial(), slot_pool->NumInitial(),
                 slot_pool->instances.size() - 1);
    return kExitUsage;
  }
  const std::vector<std::string>& config_hosts =
      slot_pool->instances[size_t(group_index)].hosts;
  if (hosts.empty()) hosts = config_hosts;
  if (hosts.size() != config_hosts.size()) {
    std::fprintf(stderr, "headway-launch join: --host given %zu times; instance %d of pool `%s` "
                 "has %zu host%s\n", hosts.size(), group_index, pool.c_str(), config_hosts.size(),
                 config_hosts.size() == 1 ? "" : "s");
    return kExitUsage;
  }
  std::vector<std::string> remote_hosts;
  for (const std::string& h : hosts) {
    if (IsLocalHost(h)) {
      for (const std::string& binary : {bin_dir + "/headway-node", bin_dir + "/headway-worker"}) {
        if (access(binary.c_str(), X_OK) != 0) {
          std::fprintf(stderr, "headway-launch join: host %s (this machine): %s not found or not "
                       "executable (build it, or pass --bin-dir)\n", h.c_str(), binary.c_str());
          return kExitUsage;
        }
      }
    } else if (std::find(remote_hosts.begin(), remote_hosts.end(), h) == remote_hosts.end()) {
      remote_hosts.push_back(h);
    }
  }
  std::string ssh_path;
  if (!remote_hosts.empty()) {
    // Environment is read here and nowhere else.
    ssh_path = FindExecutable("ssh", std::getenv("PATH"));
    Config resolved = config;
    ResolveModelPath(resolved, model_dir);
    Result<PreflightReport> local =
        LocalPreflight(config_path, config.head_pattern_path, resolved.model_path);
    if (ssh_path.empty() || !local.ok() || !local->model_error.empty()) {
      std::fprintf(stderr, "headway-launch join: %s\n",
                   ssh_path.empty() ? "no `ssh` client is on PATH here (install openssh-client)"
                   : local.ok()     ? ("preflight here: " + local->model_error).c_str()
                                    : ("preflight here: " + local.status().message()).c_str());
      return kExitUsage;
    }
    if (!PreflightRemoteHosts(ssh_path, config, config_path, bin_dir, remote_hosts, *local)) {
      std::fprintf(stderr, "headway-launch join: preflight failed; nothing was started\n");
      return kExitUsage;
    }
  }

  const sigset_t original_mask = BlockSupervisorSignals();
  int agent_stdin[2];
  if (pipe2(agent_stdin, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "headway-launch join: pipe failed\n");
    return kExitFailure;
  }
  Supervised supervised(original_mask);
  supervised.agent_stdin_writer = agent_stdin[1];
  // A worker drains for at most drain_timeout_ms, then gives up on a
  // silent coordinator after heartbeat_timeout_ms more.
  const auto drain_grace = std::chrono::milliseconds(config.drain_timeout_ms +
                                                     config.heartbeat_timeout_ms) +
                           kAgentStopGrace;
  auto leave = [&](int exit_code) {
    close(supervised.agent_stdin_writer);
    supervised.agent_stdin_writer = -1;
    supervised.group.Stop(supervised.agent_pids, drain_grace, 0);
    return exit_code;
  };
  for (size_t w = 0; w < hosts.size(); ++w) {
    const std::string& host = hosts[w];
    const bool remote = !IsLocalHost(host);
    const std::string node_bin_dir = remote ? RemoteBinDir(config.launch, bin_dir) : bin_dir;
    std::vector<std::string> argv = {node_bin_dir + "/headway-node", "--config", config_path,
                                     "--pool", pool, "--group-index", std::to_string(group_index),
                                     "--worker-index", std::to_string(w)};
    const std::string& node_model_dir = remote ? config.launch.model_dir : model_dir;
    if (!node_model_dir.empty()) argv.insert(argv.end(), {"--model-dir", node_model_dir});
    argv.insert(argv.end(), {"--bin-dir", node_bin_dir});
    if (host != config_hosts[w]) {
      argv.insert(argv.end(), {"--bind-host", host, "--advertise-host", host});
    }
    argv.push_back("--drain-on-stdin-eof");
    ProcessSpec spec;
    spec.name = "node " + host + " (pool " + pool + " slot " + std::to_string(group_index) + ")";
    spec.host = host;
    spec.argv = remote ? SshArgv(ssh_path, config.launch, host, argv, true) : argv;
    spec.stdin_fd = agent_stdin[0];
    Result<pid_t> pid = supervised.group.Start(spec);
    if (!pid.ok()) {
      std::fprintf(stderr, "headway-launch join: %s\n", pid.status().message().c_str());
      return leave(kExitFailure);
    }
    supervised.agent_pids.push_back(*pid);
    std::fprintf(stderr, "headway: started %s (pid %d): %s\n", spec.name.c_str(),
                 static_cast<int>(*pid), ShellCommand(spec.argv).c_str());
  }
  close(agent_stdin[0]);
  for (;;) {
    std::optional<int> sig = WaitSignal(std::chrono::milliseconds(1000));
    if (IsStopSignal(sig)) {
      std::fprintf(stderr, "headway: %s received, draining slot %d of pool `%s` away\n",
                   *sig == SIGINT ? "SIGINT" : "SIGTERM", group_index, pool.c_str());
      return leave(0);
    }
    if (std::optional<ExitedChild> exited = supervised.group.ReapExited()) {
      std::fprintf(stderr, "headway: %s (pid %d) %s; the slot leaves\n", exited->name.c_str(),
                   static_cast<int>(exited->pid), DescribeWaitStatus(exited->wait_status).c_str());
      return leave(kExitFailure);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "render") return RenderMain(argc - 1, argv + 1);
  if (argc > 1 && std::string(argv[1]) == "join") return JoinMain(argc - 1, argv + 1);
  CLI::App app{"Starts a Headway deployment (coordinator and workers) from a YAML config."};
  app.footer("headway-launch render k8s|slurm CONFIG -o DIR writes Kubernetes manifests or a "
             "SLURM batch script for the config instead (see headway-launch render k8s --help, "
             "headway-launch render slurm --help); headway-launch join CONFIG --pool P "
             "--group-index G runs a standby slot of a running deployment (see headway-launch "
             "join --help).");
  std::string config_path;
  std::string model_dir;
  std::string bin_dir;
  int http_port = -1;
  int ready_timeout_s = 120;
  app.add_option("config", config_path, "deployment YAML (see deploy/configs/local.yaml)")
      ->required();
  app.add_option("--model-dir", model_dir,
                 "directory for a relative model.path (default: $HEADWAY_MODEL_DIR, else "
                 "~/.cache/headway/models)");
  app.add_option("--http-port", http_port, "override coordinator.http_port");
  app.add_option("--bin-dir", bin_dir,
                 "where headway-coordinator and headway-worker are (default: beside this binary)");
  app.add_option("--ready-timeout-s", ready_timeout_s, "seconds to wait for /health (default 120)")
      ->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }

  ResolveLaunchPaths(&model_dir, &bin_dir, &config_path);

  Result<Config> loaded = LoadConfigFile(config_path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "headway-launch: config error: %s\n", loaded.status().message().c_str());
    return kExitUsage;
  }
  Config config = std::move(loaded).value();
  if (app.count("--http-port") > 0) config.http_port = http_port;
  if (Status status = ValidateConfig(config); !status.ok()) {
    std::fprintf(stderr, "headway-launch: config error: %s\n", status.message().c_str());
    return kExitUsage;
  }
  // The coordinator and the workers refuse it too; refusing here stops the
  // launch before any process starts on any host.
  if (Status status = CheckControlPlaneSecurity(config); !status.ok()) {
    std::fprintf(stderr, "headway-launch: config error: %s\n", status.message().c_str());
    return kExitUsage;
  }
  if (config.http_port == 0) {
    std::fprintf(stderr,
                 "headway-launch: config error: `coordinator.http_port` = 0 is not allowed here: "
                 "the launcher must know the port to check /health; set it or pass --http-port\n");
    return kExitUsage;
  }
  Config resolved = config;
  ResolveModelPath(resolved, model_dir);
  std::error_code ec;
  if (!std::filesystem::exists(resolved.model_path, ec)) {
    std::fprintf(stderr,
                 "headway-launch: model file not found: %s (run deploy/setup.sh, or pass "
                 "--model-dir)\n",
                 resolved.model_path.c_str());
    return kExitUsage;
  }
  // Refuse what this build cannot serve, a TP size the model cannot shard
  // or a head pattern that does not fit it, before any process starts.
  StartupCheck failed_check = StartupCheck::kSupported;
  Result<StartupModel> model = OpenAndCheckModel(resolved, StartupCheckOptions{}, &failed_check);
  if (!model.ok()) {
    if (failed_check == StartupCheck::kModelFile || failed_check == StartupCheck::kModelSpec) {
      std::fprintf(stderr, "headway-launch: model %s: %s\n", resolved.model_path.c_str(),
                   model.status().message().c_str());
    } else {
      std::fprintf(stderr, "headway-launch: config error: %s\n",
                   model.status().message().c_str());
    }
    return kExitUsage;
  }
  model->file.reset();

  LaunchOptions options;
  options.config_path = config_path;
  options.bin_dir = bin_dir;
  options.model_dir = model_dir;
  if (app.count("--http-port") > 0) options.http_port = http_port;
  const std::vector<ProcessSpec> plan = PlanLaunch(config, options);
  std::vector<ProcessSpec> processes = {plan[0]};  // the coordinator
  for (ProcessSpec& node : PlanNodes(plan, options)) processes.push_back(std::move(node));
  const int num_workers = int(plan.size()) - 1;

  // This machine's binaries are checked before the preflight: a missing one
  // is as fatal as a remote host failing it, and cheaper to find.
  std::vector<std::pair<std::string, std::string>> binaries = {  // (host, binary)
      {plan[0].host, plan[0].argv[0]}};
  for (const ProcessSpec& spec : processes) {
    if (spec.local && spec.name != "coordinator") {
      binaries.emplace_back(spec.host, spec.argv[0]);                 // headway-node
      binaries.emplace_back(spec.host, bin_dir + "/headway-worker");  // which it starts
      break;
    }
  }
  for (const auto& [host, binary] : binaries) {
    if (access(binary.c_str(), X_OK) != 0) {
      std::fprintf(stderr, "headway-launch: host %s (this machine): %s not found or not "
                   "executable (build it, or pass --bin-dir); nothing was started\n",
                   host.c_str(), binary.c_str());
      return kExitUsage;
    }
  }

  const std::vector<std::string> remote_hosts = RemoteHosts(plan);
  std::string ssh_path;
  if (Status reachable = CheckControlAddressForRemoteHosts(config, remote_hosts);
      !reachable.ok()) {
    std::fprintf(stderr, "headway-launch: config error: %s\n", reachable.message().c_str());
    return kExitUsage;
  }
  if (!remote_hosts.empty()) {
    // Environment is read here and nowhere else.
    ssh_path = FindExecutable("ssh", std::getenv("PATH"));
    if (ssh_path.empty()) {
      std::fprintf(stderr, "headway-launch: the config has workers on %s, but no `ssh` client is "
                   "on PATH here (install openssh-client)\n", remote_hosts[0].c_str());
      return kExitUsage;
    }
    Result<PreflightReport> local =
        LocalPreflight(config_path, config.head_pattern_path, resolved.model_path);
    if (!local.ok() || !local->model_error.empty()) {
      std::fprintf(stderr, "headway-launch: preflight here: %s\n",
                   local.ok() ? local->model_error.c_str() : local.status().message().c_str());
      return kExitUsage;
    }
    std::string names;
    for (const std::string& h : remote_hosts) names += (names.empty() ? "" : ", ") + h;
    std::fprintf(stderr, "headway: preflight over ssh on %s\n", names.c_str());
    if (!PreflightRemoteHosts(ssh_path, config, config_path, bin_dir, remote_hosts, *local)) {
      std::fprintf(stderr, "headway-launch: preflight failed; nothing was started\n");
      return kExitUsage;
    }
    std::fprintf(stderr, "headway: preflight: %zu remote host%s run %s with this config and a "
                 "model of %lld bytes, %s\n", remote_hosts.size(),
                 remote_hosts.size() == 1 ? "" : "s", local->version.c_str(),
                 static_cast<long long>(local->model_bytes), local->model_checksum.c_str());
  }

  // The launcher takes its signals synchronously (sigtimedwait); children
  // start with the mask the launcher was started with. Agents read a pipe
  // whose only writer is this process (a remote agent through its ssh
  // session): when it exits, for whatever reason, they stop their workers.
  const sigset_t original_mask = BlockSupervisorSignals();
  int agent_stdin[2];
  if (pipe2(agent_stdin, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "headway-launch: pipe failed\n");
    return kExitFailure;
  }

  const Clock::time_point start = Clock::now();
  Supervised supervised(original_mask);
  supervised.agent_stdin_writer = agent_stdin[1];
  for (ProcessSpec& spec : processes) {
    const bool agent = spec.name != "coordinator";
    if (!spec.local) {
      spec.argv = SshArgv(ssh_path, config.launch, spec.host,
                          RemoteAgentArgv(config.launch, config_path, spec.host, bin_dir), true);
      spec.local = true;  // the ssh client runs here
    }
    if (agent) spec.stdin_fd = agent_stdin[0];
    Result<pid_t> pid = supervised.group.Start(spec);
    if (!pid.ok()) {
      std::fprintf(stderr, "headway-launch: %s\n", pid.status().message().c_str());
      StopEverything(supervised);
      return kExitFailure;
    }
    if (agent) supervised.agent_pids.push_back(*pid);
    std::fprintf(stderr, "headway: started %s (pid %d): %s\n", spec.name.c_str(),
                 static_cast<int>(*pid), ShellCommand(spec.argv).c_str());
  }
  close(agent_stdin[0]);

  const std::string host = HealthHost(config);
  const Clock::time_point ready_deadline = start + std::chrono::seconds(ready_timeout_s);
  for (;;) {
    std::optional<int> sig = WaitSignal(std::chrono::milliseconds(0));
    if (IsStopSignal(sig)) return StopOnSignal(supervised, *sig);
    if (std::optional<ExitedChild> exited = supervised.group.ReapExited()) return StopOnExit(supervised, *exited);
    if (ProbeHealth(host, config.http_port, std::chrono::milliseconds(1000))) break;
    if (Clock::now() >= ready_deadline) {
      std::fprintf(stderr, "headway: http://%s:%d/health did not answer 200 within %d s; "
                   "stopping\n", host.c_str(), config.http_port, ready_timeout_s);
      StopEverything(supervised);
      return kExitFailure;
    }
    sig = WaitSignal(std::chrono::milliseconds(200));
    if (IsStopSignal(sig)) return StopOnSignal(supervised, *sig);
  }
  const double ready_s = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("headway: ready at http://%s:%d (%d worker%s) in %.2f s\n", host.c_str(),
              config.http_port, num_workers, num_workers == 1 ? "" : "s", ready_s);
  std::fflush(stdout);

  for (;;) {
    std::optional<int> sig = WaitSignal(std::chrono::milliseconds(1000));
    if (IsStopSignal(sig)) return StopOnSignal(supervised, *sig);
    if (std::optional<ExitedChild> exited = supervised.group.ReapExited()) return StopOnExit(supervised, *exited);
  }
}
