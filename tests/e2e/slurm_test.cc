// The batch script of `headway-launch render slurm`, run on this machine
// with a stand-in for srun that starts its command once per node with
// SLURM_NODEID set (here one node): the coordinator and the node agent come
// up, answer a greedy completion, and SIGTERM (what scancel sends) stops
// every process. Not exercised: slurmctld, the real srun, several machines
// (the agents' --node-rank mapping is LaunchPlanTest's and
// SlurmScriptTest's).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/support/deployment.h"
#include "tests/support/process.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Processes whose command line mentions `text` (not the shell running
// pgrep: the pattern's last character in brackets does not match itself).
int CountProcesses(const std::string& text) {
  const std::string pattern = text.substr(0, text.size() - 1) + "[" + text.back() + "]";
  FILE* p = popen(("pgrep -c -f -- '" + pattern + "'").c_str(), "r");
  if (p == nullptr) return -1;
  int n = -1;
  if (fscanf(p, "%d", &n) != 1) n = -1;
  pclose(p);
  return n;
}

TEST(SlurmTest, TheBatchScriptServesAndScancelStopsEverything) {
  const std::string model = SmolLm2Path();
  HW_REQUIRE_MODEL(model);
  const std::string dir = MakeTempDir("headway-slurm");
  const int http_port = FreePort();
  const std::string config = dir + "/deploy.yaml";
  std::ofstream(config) << "model:\n  path: " << model << "\n  served_name: smollm2\n"
                        << "coordinator:\n  http_port: " << http_port
                        << "\n  control_address: tcp://127.0.0.1:" << FreePort() << "\n"
                        << "cache:\n  kv_memory_mb: 64\n"
                        << "pools:\n  - name: main\n    instances:\n"
                        << "      - {tp_size: 1, hosts: [node-a], num_threads: 1}\n"
                        // The batch host's name is not loopback: a trusted
                        // network here; keys are tested elsewhere.
                        << "security:\n  insecure: true\n";
  const std::string out = dir + "/rendered";
  const std::string bin = BinaryPath("headway-node").substr(
      0, BinaryPath("headway-node").rfind('/'));
  ChildProcess render({BinaryPath("headway-launch"), "render", "slurm", config, "-o", out,
                       "--bin-dir", bin},
                      dir + "/render.log");
  ASSERT_EQ(render.WaitExit(std::chrono::seconds(30)), 0) << render.Log();

  // srun's stand-in: the flags the script passes, then the command per node.
  const std::string stub_dir = dir + "/stub";
  mkdir(stub_dir.c_str(), 0755);
  std::ofstream(stub_dir + "/srun")
      << "#!/bin/bash\nnodes=1\n"
         "while [[ $# -gt 0 && $1 == --* ]]; do\n"
         "  case $1 in --nodes=*) nodes=${1#--nodes=};; esac\n  shift\ndone\n"
         "for ((i = 0; i < nodes; i++)); do SLURM_NODEID=$i \"$@\" & done\n"
         "trap 'kill -TERM $(jobs -p) 2>/dev/null; wait' TERM\nwait\n";
  chmod((stub_dir + "/srun").c_str(), 0755);

  const Clock::time_point start = Clock::now();
  ChildProcess job({"/usr/bin/env", "PATH=" + stub_dir + ":" + std::getenv("PATH"),
                    "SLURM_JOB_ID=42", "bash", out + "/headway.sbatch"},
                   dir + "/job.log");
  bool ready = false;
  while (Clock::now() - start < std::chrono::seconds(120) && job.Running()) {
    if (EveryInstanceReady(HttpGet(http_port, "/health", 5))) {
      ready = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(ready) << job.Log();
  std::printf("ready %.2f s after the batch script started\n",
              std::chrono::duration<double>(Clock::now() - start).count());
  EXPECT_TRUE(std::ifstream(out + "/run-42/config.yaml").good());
  HttpReply r = HttpPost(http_port, "/v1/completions",
                         nlohmann::json{{"model", "smollm2"},
                                        {"prompt", "The capital of France is"},
                                        {"max_tokens", 4},
                                        {"temperature", 0}}
                             .dump(),
                         60);
  EXPECT_EQ(r.status, 200) << r.body;

  job.Signal(SIGTERM);
  const int status = job.WaitExit(std::chrono::seconds(60));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << job.Log();
  // Nothing of the job is left: every process named the run's config.
  const Clock::time_point stopped = Clock::now();
  while (CountProcesses(out + "/run-42") > 0 && Clock::now() - stopped < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(CountProcesses(out + "/run-42"), 0) << job.Log();
}

}  // namespace
}  // namespace headway::testing
