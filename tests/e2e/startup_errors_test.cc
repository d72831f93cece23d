// A corrupt model file or a bad config must stop Headway at start with a
// message that names the problem, never a crash or a hang.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "tests/support/deployment.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

// Writes the first `num_bytes` of the real model to `path`, optionally with
// its magic replaced.
void WriteDamagedModel(const std::string& path, size_t num_bytes, bool break_magic) {
  std::ifstream in(SmolLm2Path(), std::ios::binary);
  std::string bytes(num_bytes, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(num_bytes));
  if (break_magic) bytes.replace(0, 4, "GGUX");
  std::ofstream(path, std::ios::binary) << bytes;
}

struct Exit {
  int status = -1;  // wait status, -1 = still running at the deadline
  std::string log;
};

Exit RunToExit(std::vector<std::string> argv, const std::string& log_path) {
  ChildProcess child(std::move(argv), log_path);
  Exit e;
  e.status = child.WaitExit(std::chrono::seconds(60));
  e.log = child.Log();
  return e;
}

class StartupErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HW_REQUIRE_MODEL(SmolLm2Path());
    dir_ = MakeTempDir("headway-startup");
  }
  std::string WriteConfig(const DeploymentOptions& options) {
    std::string path = dir_ + "/deploy.yaml";
    std::ofstream(path) << DeploymentYaml(options, FreePort(), FreePort());
    return path;
  }
  std::string dir_;
};

void ExpectFailedExit(const Exit& e) {
  ASSERT_NE(e.status, -1) << "still running after 60 s:\n" << e.log;
  EXPECT_TRUE(WIFEXITED(e.status)) << "killed by a signal (crash?):\n" << e.log;
  EXPECT_NE(WEXITSTATUS(e.status), 0) << e.log;
}

TEST_F(StartupErrorTest, TruncatedModelStopsCoordinatorAndWorkerWithAClearMessage) {
  std::string model = dir_ + "/truncated.gguf";
  WriteDamagedModel(model, 1 << 20, /*break_magic=*/false);
  DeploymentOptions options;
  options.model_path = model;
  std::string config = WriteConfig(options);

  Exit coordinator = RunToExit({BinaryPath("headway-coordinator"), "--config", config},
                               dir_ + "/coordinator.log");
  ExpectFailedExit(coordinator);
  EXPECT_NE(coordinator.log.find("truncated"), std::string::npos) << coordinator.log;

  Exit worker = RunToExit({BinaryPath("headway-worker"), "--config", config, "--instance-id",
                           "0", "--tp-rank", "0"},
                          dir_ + "/worker.log");
  ExpectFailedExit(worker);
  // 2: a restart would fail the same way, so the node agent does not retry.
  EXPECT_EQ(WEXITSTATUS(worker.status), 2) << worker.log;
  EXPECT_NE(worker.log.find("truncated"), std::string::npos) << worker.log;
}

TEST_F(StartupErrorTest, WrongMagicIsNamed) {
  std::string model = dir_ + "/magic.gguf";
  WriteDamagedModel(model, 1 << 16, /*break_magic=*/true);
  DeploymentOptions options;
  options.model_path = model;
  Exit e = RunToExit({BinaryPath("headway-coordinator"), "--config", WriteConfig(options)},
                     dir_ + "/coordinator.log");
  ExpectFailedExit(e);
  EXPECT_NE(e.log.find("magic"), std::string::npos) << e.log;
}

TEST_F(StartupErrorTest, BadConfigValueIsNamedByTheLauncher) {
  DeploymentOptions options;
  options.model_path = SmolLm2Path();
  options.block_size = 17;
  Exit e = RunToExit({BinaryPath("headway-launch"), WriteConfig(options)}, dir_ + "/launch.log");
  ExpectFailedExit(e);
  EXPECT_NE(e.log.find("cache.block_size"), std::string::npos) << e.log;
  EXPECT_NE(e.log.find("17"), std::string::npos) << e.log;
}

TEST_F(StartupErrorTest, InvalidTensorParallelSizeIsRefusedBeforeAnyWorkerStarts) {
  DeploymentOptions options;
  options.model_path = SmolLm2Path();
  options.tp_size = 2;
  Exit e = RunToExit({BinaryPath("headway-coordinator"), "--config", WriteConfig(options)},
                     dir_ + "/coordinator.log");
  ExpectFailedExit(e);
  // DESIGN.md: the message names the field, its value, the TP size and the valid sizes.
  EXPECT_NE(e.log.find("9"), std::string::npos) << e.log;
  EXPECT_NE(e.log.find("valid TP sizes: 1, 3"), std::string::npos) << e.log;
}

TEST_F(StartupErrorTest, LauncherRefusesAnInvalidTpSizeBeforeStartingProcesses) {
  DeploymentOptions options;
  options.model_path = SmolLm2Path();
  options.tp_size = 2;
  Exit e = RunToExit({BinaryPath("headway-launch"), WriteConfig(options)}, dir_ + "/launch.log");
  ExpectFailedExit(e);
  EXPECT_NE(e.log.find("pools[0].instances[0].tp_size"), std::string::npos) << e.log;
  EXPECT_NE(e.log.find("Smollm2 135M"), std::string::npos) << e.log;  // general.name
  EXPECT_NE(e.log.find("9 query heads"), std::string::npos) << e.log;
  EXPECT_NE(e.log.find("valid TP sizes: 1, 3"), std::string::npos) << e.log;
  // Nothing was started: no process wrote a log line.
  EXPECT_EQ(e.log.find("worker i0r0"), std::string::npos) << e.log;
  EXPECT_EQ(e.log.find("listening"), std::string::npos) << e.log;
}

}  // namespace
}  // namespace headway::testing
