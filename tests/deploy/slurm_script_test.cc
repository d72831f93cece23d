// RenderSlurm on in-memory configs: the files, the batch script's node
// count and commands, the config the nodes read, and the options and
// configs refused. Running the script is tests/e2e/slurm_test.cc.
#include "deploy/launcher/slurm_script.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>

#include <gtest/gtest.h>

#include "tests/support/process.h"

namespace headway::launcher {
namespace {

constexpr char kTwoNodes[] = R"(
model:
  path: m.gguf
coordinator:
  http_port: 8080
  control_address: tcp://10.1.1.1:6000
pools:
  - name: main
    instances:
      - {tp_size: 2, hosts: [node-a, node-b], collective: gloo}
      - {tp_size: 1, hosts: [node-a]}
)";

SlurmOptions Options() {
  SlurmOptions o;
  o.bin_dir = "/opt/headway/bin";
  o.model_dir = "/shared/models";
  o.render_dir = "/shared/headway";
  return o;
}

Result<std::vector<RenderedFile>> Render(const std::string& yaml, const SlurmOptions& options) {
  Result<Config> config = ParseConfig(yaml);
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  if (!config.ok()) return config.status();
  return RenderSlurm(yaml, *config, options);
}

TEST(SlurmScriptTest, OneAgentPerNodeAndTheCoordinatorOnTheBatchHost) {
  Result<std::vector<RenderedFile>> files = Render(kTwoNodes, Options());
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[0].file_name, "config.yaml");
  EXPECT_EQ((*files)[1].file_name, "headway.sbatch");
  EXPECT_TRUE((*files)[1].executable);
  const std::string& script = (*files)[1].text;
  EXPECT_NE(script.find("#SBATCH --nodes=2\n"), std::string::npos) << script;
  EXPECT_NE(script.find("srun --nodes=2 --ntasks-per-node=1"), std::string::npos);
  EXPECT_NE(script.find("--node-rank \"$SLURM_NODEID\" --bind-host 0.0.0.0 --advertise-host"),
            std::string::npos);
  EXPECT_NE(script.find("bin_dir=\"/opt/headway/bin\""), std::string::npos);
  EXPECT_NE(script.find("\"$bin_dir/headway-coordinator\" --config \"$run_dir/config.yaml\""),
            std::string::npos);
  EXPECT_EQ(script.find("#SBATCH --time"), std::string::npos);

  // The nodes' config: the coordinator's address is filled in by the script.
  const YAML::Node config = YAML::Load((*files)[0].text);
  EXPECT_EQ(config["coordinator"]["control_address"].as<std::string>(),
            "tcp://@HEADWAY_COORDINATOR_HOST@:6000");
  EXPECT_EQ(config["coordinator"]["control_bind"].as<std::string>(), "tcp://0.0.0.0:6000");
  EXPECT_EQ(config["coordinator"]["http_host"].as<std::string>(), "0.0.0.0");
  EXPECT_EQ(config["pools"][0]["instances"][0]["hosts"][1].as<std::string>(), "node-b");
}

TEST(SlurmScriptTest, ScriptIsValidBash) {
  SlurmOptions o = Options();
  o.time_limit = "04:00:00";
  o.partition = "gpu";
  Result<std::vector<RenderedFile>> files = Render(kTwoNodes, o);
  ASSERT_TRUE(files.ok());
  EXPECT_NE((*files)[1].text.find("#SBATCH --time=04:00:00\n#SBATCH --partition=gpu\n"),
            std::string::npos);
  const std::string path = testing::MakeTempDir("slurm-script") + "/headway.sbatch";
  std::ofstream(path) << (*files)[1].text;
  EXPECT_EQ(std::system(("bash -n " + path).c_str()), 0);
}

TEST(SlurmScriptTest, RefusesWhatTheScriptCannotCarry) {
  SlurmOptions o = Options();
  o.bin_dir = "/opt/$HOME/bin";
  Result<std::vector<RenderedFile>> files = Render(kTwoNodes, o);
  ASSERT_FALSE(files.ok());
  EXPECT_NE(files.status().message().find("--bin-dir"), std::string::npos);

  std::string ipc = kTwoNodes;
  ipc.replace(ipc.find("tcp://10.1.1.1:6000"), 19, "ipc:///tmp/hw.sock");
  files = Render(ipc, Options());
  ASSERT_FALSE(files.ok());
  EXPECT_NE(files.status().message().find("coordinator.control_address"), std::string::npos);
  EXPECT_NE(files.status().message().find("SLURM"), std::string::npos);

  std::string any_port = kTwoNodes;
  any_port.replace(any_port.find("http_port: 8080"), 15, "http_port: 0");
  files = Render(any_port, Options());
  ASSERT_FALSE(files.ok());
  EXPECT_NE(files.status().message().find("coordinator.http_port"), std::string::npos);
}

}  // namespace
}  // namespace headway::launcher
