// Every Headway process exits with status 2 on a bad config or a bad command
// line: the node agent does not restart a worker that exits 2, and the
// launcher's caller can tell a typo from a crash. The config errors are
// found before any model is opened, so no model file is needed.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>
#include <string>
#include <vector>

#include "tests/support/gguf_writer.h"
#include "tests/support/process.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

// A valid config but for `cache_lines` (the body of `cache:`).
std::string ConfigWithCache(const std::string& cache_lines,
                            const std::string& model_path = "/nonexistent/model.gguf") {
  return "model:\n  path: " + model_path + "\ncoordinator:\n  http_host: 127.0.0.1\n"
         "  http_port: " + std::to_string(FreePort()) +
         "\n  control_address: tcp://127.0.0.1:" + std::to_string(FreePort()) +
         "\ncache:\n" + cache_lines +
         "pools:\n  - name: main\n    role: mixed\n    instances:\n      - tp_size: 1\n"
         "        hosts: [127.0.0.1]\n";
}

class BadConfigExitTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path.empty()); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_.path + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  // Runs `argv` to its exit (at most 30 s); expects exit status 2 and every
  // string of `parts` in its output.
  void ExpectExit2(const std::vector<std::string>& argv, std::initializer_list<std::string> parts) {
    const std::string log = dir_.path + "/run" + std::to_string(++num_runs_) + ".log";
    ChildProcess child(argv, log);
    const int status = child.WaitExit(std::chrono::seconds(30));
    const std::string output = child.Log();
    ASSERT_NE(status, -1) << argv[0] << " still running after 30 s:\n" << output;
    ASSERT_TRUE(WIFEXITED(status)) << argv[0] << " killed by a signal:\n" << output;
    EXPECT_EQ(WEXITSTATUS(status), 2) << argv[0] << ":\n" << output;
    for (const std::string& part : parts) {
      EXPECT_NE(output.find(part), std::string::npos)
          << argv[0] << " output lacks `" << part << "`:\n" << output;
    }
  }

  // The four binaries, each started on `config`.
  std::vector<std::vector<std::string>> EveryProcessOn(const std::string& config) {
    return {{BinaryPath("headway-coordinator"), "--config", config},
            {BinaryPath("headway-worker"), "--config", config, "--instance-id", "0", "--tp-rank",
             "0"},
            {BinaryPath("headway-node"), "--config", config, "--host", "127.0.0.1"},
            {BinaryPath("headway-launch"), config}};
  }

  ScopedTempDir dir_{"headway-bad-config"};
  int num_runs_ = 0;
};

TEST_F(BadConfigExitTest, OverflowingKvMemoryIsAConfigErrorInEveryProcess) {
  const std::string config =
      Write("overflow.yaml", ConfigWithCache("  kv_memory_mb: 99999999999999\n"));
  for (const auto& argv : EveryProcessOn(config)) {
    ExpectExit2(argv, {"cache.kv_memory_mb", "99999999999999", "[1, 16777216]"});
  }
}

TEST_F(BadConfigExitTest, DuplicateKeyIsAConfigErrorInEveryProcess) {
  const std::string config = Write(
      "duplicate.yaml", ConfigWithCache("  kv_memory_mb: 64\n  block_size: 16\n  kv_memory_mb: 128\n"));
  for (const auto& argv : EveryProcessOn(config)) {
    ExpectExit2(argv, {"duplicate key `cache.kv_memory_mb`", "line 10"});
  }
}

TEST_F(BadConfigExitTest, BadFlagsExit2InEveryProcess) {
  const std::string config = Write("good.yaml", ConfigWithCache("  kv_memory_mb: 64\n"));
  ExpectExit2({BinaryPath("headway-coordinator"), "--config", config, "--http-port", "70000"},
              {"--http-port"});
  ExpectExit2({BinaryPath("headway-coordinator"), "--config", config, "--log-level", "loud"},
              {"--log-level"});
  ExpectExit2({BinaryPath("headway-coordinator"), "--config", config, "--no-such-flag"},
              {"--no-such-flag"});
  ExpectExit2({BinaryPath("headway-coordinator")}, {"--config is required"});
  ExpectExit2({BinaryPath("headway-worker"), "--config", config, "--instance-id", "0"},
              {"--tp-rank"});
  ExpectExit2({BinaryPath("headway-worker"), "--config", config, "--instance-id", "7",
               "--tp-rank", "0"},
              {"--instance-id 7"});
  ExpectExit2({BinaryPath("headway-node"), "--config", config, "--node-rank", "-1"},
              {"--node-rank"});
  ExpectExit2({BinaryPath("headway-launch"), config, "--ready-timeout-s", "0"},
              {"--ready-timeout-s"});
}

// The coordinator and the launcher check the tensor list against the
// metadata before any worker starts; a worker alone does the same.
TEST_F(BadConfigExitTest, BlockCountBeyondTheTensorsIsRefusedBeforeAnyWorkerStarts) {
  const std::string model = dir_.path + "/tiny.gguf";
  ASSERT_TRUE(WriteTinyLlama(model, {}).ok());
  ASSERT_TRUE(SetUInt32Key(model, "llama.block_count", 100000).ok());
  const std::string config =
      Write("tiny.yaml", ConfigWithCache("  kv_memory_mb: 64\n", model));
  for (const auto& argv : EveryProcessOn(config)) {
    if (argv[0] == BinaryPath("headway-node")) continue;  // leaves the model to its workers
    ExpectExit2(argv, {"tensor blk.2.attn_norm.weight is missing", "100000 layers"});
  }
}

}  // namespace
}  // namespace headway::testing
