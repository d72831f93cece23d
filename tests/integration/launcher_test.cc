// headway-launch: its plan (pure), then the real binary and the real node
// agent (headway-node) supervising stand-in processes (shell scripts, with
// this test serving /health), then, when the coordinator and worker binaries
// are built, a real deployment whose worker is killed and comes back, and
// the shipped multi-instance configs serving.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "common/config.h"
#include "deploy/launcher/launch_plan.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/test_env.h"
#include "tests/support/process.h"

namespace headway {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using launcher::LaunchOptions;
using launcher::PlanLaunch;
using launcher::ProcessSpec;
using testing::ReadText;

// ---- plan (pure) -------------------------------------------------------------

Config TwoInstanceConfig() {
  Result<Config> config = ParseConfig(R"(
model: {path: m.gguf}
coordinator: {http_host: 0.0.0.0, http_port: 9000}
pools:
  - name: main
    role: mixed
    instances:
      - {tp_size: 1}
      - {tp_size: 3, hosts: [127.0.0.1, 10.0.0.2, localhost]}
)");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return config.ok() ? *config : Config{};
}

TEST(LaunchPlanTest, CoordinatorThenEveryRank) {
  LaunchOptions options{"/etc/hw.yaml", "/opt/hw/bin", "/models", 8123};
  std::vector<ProcessSpec> plan = PlanLaunch(TwoInstanceConfig(), options);
  ASSERT_EQ(plan.size(), 5u);
  EXPECT_EQ(plan[0].name, "coordinator");
  EXPECT_TRUE(plan[0].local);
  EXPECT_EQ(plan[0].argv, (std::vector<std::string>{"/opt/hw/bin/headway-coordinator", "--config",
                                                    "/etc/hw.yaml", "--model-dir", "/models",
                                                    "--http-port", "8123"}));
  EXPECT_EQ(plan[1].name, "worker i0r0");
  EXPECT_EQ(plan[1].argv,
            (std::vector<std::string>{"/opt/hw/bin/headway-worker", "--config", "/etc/hw.yaml",
                                      "--model-dir", "/models", "--instance-id", "0", "--tp-rank",
                                      "0"}));
  EXPECT_EQ(plan[2].name, "worker i1r0");
  EXPECT_EQ(plan[3].name, "worker i1r1");
  EXPECT_EQ(plan[3].host, "10.0.0.2");
  EXPECT_FALSE(plan[3].local);
  EXPECT_EQ(plan[4].host, "localhost");
  EXPECT_TRUE(plan[4].local);
  EXPECT_EQ(plan[4].argv.back(), "2");
}

TEST(LaunchPlanTest, OptionalFlagsOmitted) {
  LaunchOptions options{"c.yaml", "bin", "", std::nullopt};
  std::vector<ProcessSpec> plan = PlanLaunch(TwoInstanceConfig(), options);
  EXPECT_EQ(plan[0].argv, (std::vector<std::string>{"bin/headway-coordinator", "--config",
                                                    "c.yaml"}));
  EXPECT_EQ(launcher::HealthHost(TwoInstanceConfig()), "127.0.0.1");  // 0.0.0.0 → loopback
}

TEST(LaunchPlanTest, OneNodeAgentPerHostWithWorkers) {
  LaunchOptions options{"/etc/hw.yaml", "/opt/hw/bin", "/models", 8123};
  const std::vector<ProcessSpec> plan = PlanLaunch(TwoInstanceConfig(), options);
  // Hosts in the order the plan first names them; node rank r is hosts[r].
  EXPECT_EQ(launcher::WorkerHosts(plan),
            (std::vector<std::string>{"127.0.0.1", "10.0.0.2", "localhost"}));
  const std::vector<ProcessSpec> on_first = launcher::WorkersOn(plan, "127.0.0.1");
  ASSERT_EQ(on_first.size(), 2u);
  EXPECT_EQ(on_first[0].name, "worker i0r0");
  EXPECT_EQ(on_first[1].name, "worker i1r0");
  EXPECT_EQ(on_first[1].instance_id, 1);
  EXPECT_EQ(on_first[1].tp_rank, 0);

  const std::vector<ProcessSpec> nodes = launcher::PlanNodes(plan, options);
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_EQ(nodes[0].name, "node 127.0.0.1");
  EXPECT_TRUE(nodes[0].local);
  EXPECT_EQ(nodes[0].argv,
            (std::vector<std::string>{"/opt/hw/bin/headway-node", "--config", "/etc/hw.yaml",
                                      "--host", "127.0.0.1", "--model-dir", "/models",
                                      "--bin-dir", "/opt/hw/bin", "--exit-on-stdin-eof"}));
  // A remote agent is started by hand (or ssh): it has no launcher pipe.
  EXPECT_FALSE(nodes[1].local);
  EXPECT_EQ(nodes[1].argv.back(), "/opt/hw/bin");
}

// A pool's standby slots start only when an agent is asked for them by
// group index: nothing starts them with the deployment.
TEST(LaunchPlanTest, StandbySlotsStartOnlyByGroupIndex) {
  Result<Config> config = ParseConfig(R"(
model: {path: m.gguf}
pools:
  - name: main
    instances: {min: 1, max: 3, template: {tp_size: 1, hosts: [127.0.0.1]}}
)");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  LaunchOptions options{"/etc/hw.yaml", "/opt/hw/bin", "", std::nullopt};
  const std::vector<ProcessSpec> plan = PlanLaunch(*config, options);
  ASSERT_EQ(plan.size(), 4u);  // the coordinator and three slots
  EXPECT_FALSE(plan[1].standby);
  EXPECT_TRUE(plan[2].standby && plan[3].standby);
  const std::vector<ProcessSpec> started = launcher::WorkersOn(plan, "127.0.0.1");
  ASSERT_EQ(started.size(), 1u);
  EXPECT_EQ(started[0].name, "worker i0r0");
  Result<std::vector<ProcessSpec>> joining =
      launcher::WorkersOfGroupMember(*config, plan, "main", 2, 0);
  ASSERT_TRUE(joining.ok()) << joining.status().ToString();
  ASSERT_EQ(joining->size(), 1u);
  EXPECT_EQ((*joining)[0].name, "worker i2r0");
}

TEST(LaunchPlanTest, ShellCommandQuotes) {
  EXPECT_EQ(launcher::ShellCommand({"/bin/x", "--config", "/a b/c'd.yaml", ""}),
            "/bin/x --config '/a b/c'\\''d.yaml' ''");
}

// ---- the launcher binary ------------------------------------------------------

int FreeTcpPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

void WriteFile(const fs::path& path, const std::string& text, bool executable = false) {
  std::ofstream(path) << text;
  if (executable) fs::permissions(path, fs::perms::owner_all, fs::perm_options::add);
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

// A launcher run with stdout/stderr captured in files of `dir`.
class LauncherRun {
 public:
  LauncherRun(const fs::path& dir, std::vector<std::string> args)
      : out_(dir / "launch.out"), err_(dir / "launch.err") {
    std::vector<std::string> argv = {testing::BinaryPath("headway-launch")};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // a crashed test must not leave a deployment behind
      if (getppid() != parent) _exit(1);
      int out = open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(out, 1);
      dup2(err, 2);
      execv(cargv[0], cargv.data());
      _exit(127);
    }
  }
  ~LauncherRun() {
    if (!status_ && pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  // Exit status once the launcher exited within `timeout`, else nullopt.
  std::optional<int> Wait(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!status_) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        status_ = status;
      } else if (std::chrono::steady_clock::now() >= deadline) {
        break;
      } else {
        std::this_thread::sleep_for(20ms);
      }
    }
    return status_;
  }

  // Waits until stdout contains `text`; false on timeout or launcher exit.
  bool WaitForStdout(const std::string& text, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (Out().find(text) != std::string::npos) return true;
      if (Wait(0ms)) return Out().find(text) != std::string::npos;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  // Pid of the child the launcher or its node agent last reported as `name`
  // ("worker i0r0", "node 127.0.0.1").
  pid_t ChildPid(const std::string& name) {
    const std::string err = Err();
    const std::regex re("started " + name + " \\(pid ([0-9]+)\\)");
    pid_t last = -1;
    for (auto it = std::sregex_iterator(err.begin(), err.end(), re); it != std::sregex_iterator();
         ++it) {
      last = std::stoi((*it)[1]);
    }
    return last;
  }

  // Waits until `name` was started with a pid other than `old`; that pid.
  pid_t WaitForRestart(const std::string& name, pid_t old, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      const pid_t pid = ChildPid(name);
      if (pid > 0 && pid != old) return pid;
      std::this_thread::sleep_for(50ms);
    }
    return -1;
  }

  pid_t pid() const { return pid_; }
  std::string Out() const { return ReadText(out_); }
  std::string Err() const { return ReadText(err_); }

 private:
  fs::path out_;
  fs::path err_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(testing::BinaryPath("headway-launch"))) {
      GTEST_FAIL() << "headway-launch is not built at " << testing::BinaryPath("headway-launch");
    }
    std::string tmpl = ::testing::TempDir() + "/headway_launcher_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    // The launcher reads the model's shape to check TP sizes before starting
    // anything: a tiny llama (4 query heads, 2 KV heads: TP 1 and 2 valid).
    ASSERT_TRUE(testing::WriteTinyLlama((dir_ / "model.gguf").string(), {}).ok());
  }
  void TearDown() override {
    if (health_) health_->stop();
    if (health_thread_.joinable()) health_thread_.join();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // A deployment config with free ports and `workers` ranks in one instance.
  fs::path WriteConfig(int http_port, int tp_size, const std::string& model_path) {
    std::string yaml = "model: {path: " + model_path + "}\n" +
                       "coordinator: {http_host: 127.0.0.1, http_port: " +
                       std::to_string(http_port) + ", control_address: tcp://127.0.0.1:" +
                       std::to_string(FreeTcpPort()) + "}\n" +
                       "cache: {block_size: 16, kv_memory_mb: 64}\n"
                       "pools: [{name: main, role: mixed, instances: [{tp_size: " +
                       std::to_string(tp_size) + ", device: cpu, num_threads: 1}]}]\n";
    WriteFile(dir_ / "config.yaml", yaml);
    return dir_ / "config.yaml";
  }

  // Stand-ins for the coordinator and the workers: they record their
  // arguments and idle (or run `worker_body`). /health is served by this
  // test. The node agent is the real one.
  void WriteStandIns(const std::string& worker_body = "exec sleep 600") {
    fs::create_directory(dir_ / "bin");
    fs::create_symlink(testing::BinaryPath("headway-node"), dir_ / "bin/headway-node");
    WriteFile(dir_ / "bin/headway-coordinator",
              "#!/bin/sh\necho \"$@\" > \"" + (dir_ / "coordinator.args").string() +
                  "\"\nexec sleep 600\n",
              true);
    WriteFile(dir_ / "bin/headway-worker",
              "#!/bin/sh\necho \"$@\" >> \"" + (dir_ / "worker.args").string() + "\"\n" +
                  worker_body + "\n",
              true);
  }

  int ServeHealth() {
    int port = FreeTcpPort();
    health_ = std::make_unique<httplib::Server>();
    health_->Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    });
    EXPECT_TRUE(health_->bind_to_port("127.0.0.1", port));
    health_thread_ = std::thread([this] { health_->listen_after_bind(); });
    return port;
  }

  fs::path dir_;
  std::unique_ptr<httplib::Server> health_;
  std::thread health_thread_;
};

TEST_F(LauncherTest, BadConfigExitsWithMessage) {
  WriteFile(dir_ / "bad.yaml",
            "model: {path: m.gguf}\ncache: {block_size: 48}\npools: [{instances: [{}]}]\n");
  LauncherRun run(dir_, {(dir_ / "bad.yaml").string()});
  std::optional<int> status = run.Wait(10s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << *status;
  EXPECT_NE(run.Err().find("cache.block_size"), std::string::npos) << run.Err();
  EXPECT_NE(run.Err().find("48"), std::string::npos) << run.Err();
}

TEST_F(LauncherTest, MissingConfigOrModelExits2) {
  LauncherRun missing_config(dir_, {(dir_ / "none.yaml").string()});
  std::optional<int> status = missing_config.Wait(10s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 2);
  EXPECT_NE(missing_config.Err().find("none.yaml"), std::string::npos);

  fs::path config = WriteConfig(FreeTcpPort(), 1, "absent.gguf");
  LauncherRun missing_model(dir_, {config.string(), "--model-dir", dir_.string()});
  status = missing_model.Wait(10s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 2);
  EXPECT_NE(missing_model.Err().find("absent.gguf"), std::string::npos) << missing_model.Err();
}

TEST_F(LauncherTest, ReadyThenStopsEverythingOnSigterm) {
  WriteStandIns();
  const int port = ServeHealth();
  fs::path config = WriteConfig(1, 2, (dir_ / "model.gguf").string());
  LauncherRun run(dir_, {config.string(), "--bin-dir", (dir_ / "bin").string(), "--http-port",
                         std::to_string(port), "--model-dir", "/models"});
  ASSERT_TRUE(run.WaitForStdout(
      "headway: ready at http://127.0.0.1:" + std::to_string(port) + " (2 workers) in", 30s))
      << run.Out() << run.Err();
  // The stand-in /health answers before the agent has started (and logged)
  // its workers.
  std::vector<pid_t> children = {run.ChildPid("coordinator"), run.ChildPid("node 127.0.0.1"),
                                 run.WaitForRestart("worker i0r0", -1, 10s),
                                 run.WaitForRestart("worker i0r1", -1, 10s)};
  for (pid_t pid : children) ASSERT_TRUE(pid > 0 && Alive(pid)) << run.Err();

  EXPECT_EQ(ReadText(dir_ / "coordinator.args"),
            "--config " + config.string() + " --model-dir /models --http-port " +
                std::to_string(port) + "\n");
  // Each stand-in writes its arguments once it runs.
  std::string worker_args;
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(20ms)) {
    worker_args = ReadText(dir_ / "worker.args");
    if (std::count(worker_args.begin(), worker_args.end(), '\n') >= 2) break;
  }
  EXPECT_NE(worker_args.find("--model-dir /models --instance-id 0 --tp-rank 0"),
            std::string::npos) << worker_args;
  EXPECT_NE(worker_args.find("--instance-id 0 --tp-rank 1"), std::string::npos) << worker_args;

  kill(run.pid(), SIGTERM);
  std::optional<int> status = run.Wait(20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status << run.Err();
  for (pid_t pid : children) EXPECT_FALSE(Alive(pid)) << pid;
}

TEST_F(LauncherTest, WorkerDeathRestartsItsInstanceAndTheRestKeepsRunning) {
  WriteStandIns();
  const int port = ServeHealth();
  fs::path config = WriteConfig(port, 2, (dir_ / "model.gguf").string());
  LauncherRun run(dir_, {config.string(), "--bin-dir", (dir_ / "bin").string()});
  ASSERT_TRUE(run.WaitForStdout("(2 workers)", 30s)) << run.Out() << run.Err();
  const pid_t coordinator = run.ChildPid("coordinator");
  // The stand-in /health answers before the agent has started its workers.
  const pid_t rank0 = run.WaitForRestart("worker i0r0", -1, 10s);
  const pid_t rank1 = run.WaitForRestart("worker i0r1", -1, 10s);
  ASSERT_GT(rank1, 0);
  kill(rank1, SIGKILL);
  // Its agent stops rank 0 too (a TP group restarts together) and starts
  // both again after the first backoff (1 s).
  EXPECT_GT(run.WaitForRestart("worker i0r1", rank1, 10s), 0) << run.Err();
  EXPECT_GT(run.WaitForRestart("worker i0r0", rank0, 10s), 0) << run.Err();
  EXPECT_FALSE(Alive(rank0));
  EXPECT_TRUE(Alive(coordinator));
  EXPECT_FALSE(run.Wait(0ms).has_value()) << "the launcher keeps running";
  EXPECT_NE(run.Err().find("killed by signal 9"), std::string::npos) << run.Err();

  kill(run.pid(), SIGTERM);
  std::optional<int> status = run.Wait(20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status << run.Err();
  EXPECT_FALSE(Alive(run.ChildPid("worker i0r0")));
  EXPECT_FALSE(Alive(run.ChildPid("worker i0r1")));
}

TEST_F(LauncherTest, CoordinatorDeathStopsEverything) {
  WriteStandIns();
  const int port = ServeHealth();
  fs::path config = WriteConfig(port, 1, (dir_ / "model.gguf").string());
  LauncherRun run(dir_, {config.string(), "--bin-dir", (dir_ / "bin").string()});
  ASSERT_TRUE(run.WaitForStdout("(1 worker)", 30s)) << run.Out() << run.Err();
  // The stand-in /health answers before the agent has started its worker.
  const pid_t worker = run.WaitForRestart("worker i0r0", -1, 10s);
  ASSERT_GT(worker, 0) << run.Err();
  kill(run.ChildPid("coordinator"), SIGKILL);
  std::optional<int> status = run.Wait(20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << *status;
  EXPECT_NE(run.Err().find("coordinator"), std::string::npos) << run.Err();
  EXPECT_NE(run.Err().find("killed by signal 9"), std::string::npos) << run.Err();
  EXPECT_FALSE(Alive(worker));
}

TEST_F(LauncherTest, AWorkerRefusingItsConfigIsNotRestarted) {
  // Exit status 2 is a worker's "bad config or command line": its agent
  // gives up, and the launcher stops the deployment naming it.
  WriteStandIns("exit 2");
  fs::path config = WriteConfig(FreeTcpPort(), 1, (dir_ / "model.gguf").string());
  LauncherRun run(dir_, {config.string(), "--bin-dir", (dir_ / "bin").string()});
  std::optional<int> status = run.Wait(20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 1);
  EXPECT_NE(run.Err().find("worker i0r0"), std::string::npos) << run.Err();
  EXPECT_NE(run.Err().find("exited with status 2"), std::string::npos) << run.Err();
  EXPECT_NE(run.Err().find("node 127.0.0.1"), std::string::npos) << run.Err();
}

TEST_F(LauncherTest, NotReadyInTimeStops) {
  WriteStandIns();
  fs::path config = WriteConfig(FreeTcpPort(), 1, (dir_ / "model.gguf").string());
  LauncherRun run(dir_, {config.string(), "--bin-dir", (dir_ / "bin").string(),
                         "--ready-timeout-s", "1"});
  std::optional<int> status = run.Wait(20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 1);
  EXPECT_NE(run.Err().find("did not answer 200"), std::string::npos) << run.Err();
}

// A binary missing here means nothing can start: exit status 2, like a
// host failing the preflight, naming the binary and the host.
TEST_F(LauncherTest, MissingBinaryExits2NamingItAndTheHost) {
  fs::path config = WriteConfig(FreeTcpPort(), 1, (dir_ / "model.gguf").string());
  LauncherRun run(dir_, {config.string(), "--bin-dir", (dir_ / "nowhere").string()});
  std::optional<int> status = run.Wait(10s);
  ASSERT_TRUE(status.has_value());
  ASSERT_TRUE(WIFEXITED(*status)) << *status;
  EXPECT_EQ(WEXITSTATUS(*status), 2) << run.Err();
  EXPECT_NE(run.Err().find("host 127.0.0.1 (this machine): " + (dir_ / "nowhere").string() +
                           "/headway-coordinator not found"),
            std::string::npos)
      << run.Err();
}

// Only the worker binary is missing: the agent would start and fail on
// every restart; the launcher refuses before starting anything.
TEST_F(LauncherTest, MissingWorkerBinaryExits2BeforeAnythingStarts) {
  WriteStandIns();
  fs::remove(dir_ / "bin/headway-worker");
  fs::path config = WriteConfig(FreeTcpPort(), 1, (dir_ / "model.gguf").string());
  LauncherRun run(dir_, {config.string(), "--bin-dir", (dir_ / "bin").string()});
  std::optional<int> status = run.Wait(10s);
  ASSERT_TRUE(status.has_value());
  ASSERT_TRUE(WIFEXITED(*status)) << *status;
  EXPECT_EQ(WEXITSTATUS(*status), 2) << run.Err();
  EXPECT_NE(run.Err().find("host 127.0.0.1 (this machine): " + (dir_ / "bin").string() +
                           "/headway-worker not found"),
            std::string::npos)
      << run.Err();
  EXPECT_EQ(run.Err().find("headway: started"), std::string::npos) << run.Err();
  EXPECT_FALSE(fs::exists(dir_ / "coordinator.args"));
}

// `headway-launch join` runs standby slots only, with one --host per host
// of the slot's instance; anything else is refused with exit status 2
// before any process starts.
TEST_F(LauncherTest, JoinRefusesWhatIsNotAStandbySlot) {
  WriteStandIns();
  WriteFile(dir_ / "pool.yaml",
            "model: {path: " + (dir_ / "model.gguf").string() + "}\n"
            "coordinator: {http_port: " + std::to_string(FreeTcpPort()) + "}\n"
            "pools: [{name: main, role: mixed, instances: {min: 1, max: 3, template: "
            "{tp_size: 1, device: cpu, num_threads: 1}}}]\n");
  const std::string config = (dir_ / "pool.yaml").string();
  const std::string bin = (dir_ / "bin").string();
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--pool", "main", "--group-index", "0"},
       "slot 0 of pool `main` starts with the deployment (its first 1 do); standby slots are 1 "
       "to 2"},
      {{"--pool", "main", "--group-index", "3"}, "pool `main` has 3 instances (0 to 2)"},
      {{"--pool", "other", "--group-index", "1"}, "the config has no such pool (pools: main)"},
      {{"--pool", "main", "--group-index", "1", "--host", "a", "--host", "b"},
       "--host given 2 times; instance 1 of pool `main` has 1 host"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"join", config, "--bin-dir", bin};
    args.insert(args.end(), c.args.begin(), c.args.end());
    LauncherRun run(dir_, args);
    std::optional<int> status = run.Wait(10s);
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << *status << run.Err();
    EXPECT_NE(run.Err().find(c.message), std::string::npos) << run.Err();
    EXPECT_EQ(run.Err().find("headway: started"), std::string::npos) << run.Err();
  }
  EXPECT_FALSE(fs::exists(dir_ / "worker.args"));
}

// The real thing: coordinator and worker binaries with the real model.
TEST_F(LauncherTest, StartsRealDeploymentAndStops) {
  const std::string coordinator = testing::BinaryPath("headway-coordinator");
  const std::string worker = testing::BinaryPath("headway-worker");
  if (!fs::exists(coordinator) || !fs::exists(worker)) {
    GTEST_SKIP() << "needs " << coordinator << " and " << worker;
  }
  const std::string model = testing::SmolLm2Path();
  HW_REQUIRE_MODEL(model);
  const int port = FreeTcpPort();
  fs::path config = WriteConfig(port, 1, model);
  LauncherRun run(dir_, {config.string(), "--bin-dir", fs::path(coordinator).parent_path().string()});
  ASSERT_TRUE(run.WaitForStdout("headway: ready at http://127.0.0.1:" + std::to_string(port) +
                                    " (1 worker) in",
                                130s))
      << run.Out() << run.Err();
  httplib::Client client("127.0.0.1", port);
  httplib::Result health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  pid_t worker_pid = run.ChildPid("worker i0r0");

  // A killed worker comes back and the deployment answers again.
  const auto killed_at = std::chrono::steady_clock::now();
  kill(worker_pid, SIGKILL);
  worker_pid = run.WaitForRestart("worker i0r0", worker_pid, 30s);
  ASSERT_GT(worker_pid, 0) << run.Err();
  bool served = false;
  while (!served && std::chrono::steady_clock::now() < killed_at + 120s) {
    httplib::Result r = client.Post(
        "/v1/completions",
        R"({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})",
        "application/json");
    served = r && r->status == 200;
    if (!served) std::this_thread::sleep_for(200ms);
  }
  EXPECT_TRUE(served) << run.Err();
  std::printf("worker killed -> serving again in %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count());

  kill(run.pid(), SIGTERM);
  std::optional<int> status = run.Wait(30s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status << run.Err();
  EXPECT_FALSE(Alive(worker_pid));
}

// The shipped multi-instance configs (bench/conversation_bench.py's) start
// under headway-launch with every instance ready and answer a completion.
// Copies with free ports, so that they run beside other tests.
TEST_F(LauncherTest, ShippedMultiInstanceConfigsServe) {
  const std::string coordinator = testing::BinaryPath("headway-coordinator");
  const std::string worker = testing::BinaryPath("headway-worker");
  if (!fs::exists(coordinator) || !fs::exists(worker)) {
    GTEST_SKIP() << "needs " << coordinator << " and " << worker;
  }
  const std::string model = testing::SmolLm2Path();
  HW_REQUIRE_MODEL(model);
  const std::pair<const char*, int> shipped[] = {{"two-mixed.yaml", 2}, {"pd-2p2d.yaml", 4}};
  for (const auto& [name, num_workers] : shipped) {
    SCOPED_TRACE(name);
    const std::string yaml = std::regex_replace(
        ReadText(testing::SourceDir() + "/deploy/configs/" + name),
        std::regex(R"(tcp://127\.0\.0\.1:5557)"),
        "tcp://127.0.0.1:" + std::to_string(FreeTcpPort()));
    WriteFile(dir_ / name, yaml);
    const int port = FreeTcpPort();
    LauncherRun run(dir_, {(dir_ / name).string(), "--bin-dir",
                           fs::path(coordinator).parent_path().string(), "--model-dir",
                           fs::path(model).parent_path().string(), "--http-port",
                           std::to_string(port)});
    ASSERT_TRUE(run.WaitForStdout("headway: ready at http://127.0.0.1:" + std::to_string(port) +
                                      " (" + std::to_string(num_workers) + " workers) in",
                                  130s))
        << run.Out() << run.Err();
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(60s);
    httplib::Result health = client.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
    size_t ready = 0;
    for (size_t at = health->body.find("\"state\":\"ready\""); at != std::string::npos;
         at = health->body.find("\"state\":\"ready\"", at + 1)) {
      ++ready;
    }
    EXPECT_EQ(ready, size_t(num_workers)) << health->body;  // one worker per instance
    httplib::Result r = client.Post(
        "/v1/completions",
        R"({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})",
        "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_NE(r->body.find("\"completion_tokens\":4"), std::string::npos) << r->body;

    kill(run.pid(), SIGTERM);
    std::optional<int> status = run.Wait(30s);
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status << run.Err();
  }
}

}  // namespace
}  // namespace headway
