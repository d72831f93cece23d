// The pieces of headway-launch's ssh launch that need no host: the ssh and
// agent command lines, the `launch:` config section, the preflight report
// and its comparison, and the XXH64 checksum (against values from the
// reference library, libxxhash 0.8.1).
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/config.h"
#include "deploy/launcher/captured_commands.h"
#include "deploy/launcher/preflight.h"
#include "deploy/launcher/ssh_launch.h"
#include "deploy/launcher/xxh64.h"
#include "tests/support/process.h"

namespace headway::launcher {
namespace {

constexpr char kBase[] = R"(model:
  path: m.gguf
pools:
  - name: main
    role: mixed
    instances:
      - {tp_size: 2, hosts: [127.0.0.1, gpu-b]}
)";

bool Contains(const std::vector<std::string>& argv, const std::vector<std::string>& run) {
  return std::search(argv.begin(), argv.end(), run.begin(), run.end()) != argv.end();
}

TEST(Xxh64Test, MatchesTheReferenceLibrary) {
  EXPECT_EQ(Xxh64Of("", 0), 0xef46db3751d8e999ULL);
  EXPECT_EQ(Xxh64Of("a", 1), 0xd24ec4f1a98c6e5bULL);
  EXPECT_EQ(Xxh64Of("abc", 3), 0x44bc2cf5ad770999ULL);
  EXPECT_EQ(Xxh64Of("Headway", 7), 0x54f4defa55cb6aa5ULL);
  std::string kib;
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 256; ++i) kib += char(i);
  }
  kib += "xyz";
  EXPECT_EQ(Xxh64Of(kib.data(), kib.size()), 0xe146cb31b65bc21aULL);
  EXPECT_EQ(FormatXxh64(0xe146cb31b65bc21aULL), "xxh64:e146cb31b65bc21a");
}

TEST(Xxh64Test, StreamingInAnyPiecesEqualsOneShot) {
  std::string data;
  for (int i = 0; i < 100003; ++i) data += char((i * 7) % 251);
  ASSERT_EQ(Xxh64Of(data.data(), data.size()), 0x1d0edb76d73b0886ULL);
  for (size_t piece : {1u, 5u, 31u, 32u, 33u, 4096u}) {
    Xxh64 hash;
    for (size_t at = 0; at < data.size(); at += piece) {
      hash.Update(data.data() + at, std::min(piece, data.size() - at));
    }
    EXPECT_EQ(hash.Digest(), 0x1d0edb76d73b0886ULL) << "pieces of " << piece;
  }
  const std::string dir = testing::MakeTempDir("headway-xxh64");
  std::ofstream(dir + "/f", std::ios::binary) << data;
  Result<uint64_t> file = FileXxh64(dir + "/f");
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(*file, 0x1d0edb76d73b0886ULL);
  EXPECT_EQ(FileXxh64(dir + "/missing").status().code(), StatusCode::kNotFound);
}

TEST(LaunchConfigTest, ReadsEveryKeyAndRejectsBadValues) {
  Result<Config> config = ParseConfig(std::string(kBase) + R"(launch:
  user: headway
  port: 2222
  key: /keys/id
  known_hosts: /keys/known_hosts
  connect_timeout_s: 3
  bin_dir: /opt/headway/bin
  model_dir: /data/models
)");
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->launch.ssh_user, "headway");
  EXPECT_EQ(config->launch.ssh_port, 2222);
  EXPECT_EQ(config->launch.ssh_key, "/keys/id");
  EXPECT_EQ(config->launch.ssh_known_hosts, "/keys/known_hosts");
  EXPECT_EQ(config->launch.connect_timeout_s, 3);
  EXPECT_EQ(config->launch.bin_dir, "/opt/headway/bin");
  EXPECT_EQ(config->launch.model_dir, "/data/models");

  Result<Config> defaults = ParseConfig(kBase);
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->launch.ssh_port, 22);
  EXPECT_TRUE(defaults->launch.ssh_user.empty());

  const std::pair<std::string, std::string> bad[] = {
      {"launch: {port: 0}", "launch.port"},
      {"launch: {port: 70000}", "launch.port"},
      {"launch: {connect_timeout_s: 0}", "launch.connect_timeout_s"},
      {"launch: {key: id_ed25519}", "launch.key"},
      {"launch: {model_dir: models}", "launch.model_dir"},
      {"launch: {user: -oProxyCommand=x}", "launch.user"},
      {"launch: {hosts: [a]}", "launch.hosts"},
      {"launch: [a]", "launch"},
  };
  for (const auto& [yaml, key] : bad) {
    Result<Config> parsed = ParseConfig(std::string(kBase) + yaml + "\n");
    ASSERT_FALSE(parsed.ok()) << yaml;
    EXPECT_NE(parsed.status().message().find(key), std::string::npos)
        << yaml << ": " << parsed.status().message();
  }
}

TEST(SshLaunchTest, SshArgvNeedsNoTtyAndCarriesTheLaunchSection) {
  LaunchConfig launch;
  launch.ssh_user = "headway";
  launch.ssh_port = 2222;
  launch.ssh_key = "/keys/id";
  launch.ssh_known_hosts = "/keys/known hosts";
  launch.connect_timeout_s = 4;
  const std::vector<std::string> argv =
      SshArgv("/usr/bin/ssh", launch, "gpu-b", {"/opt/bin/headway-node", "--config", "/c/a b.yaml"},
              true);
  EXPECT_EQ(argv[0], "/usr/bin/ssh");
  EXPECT_TRUE(Contains(argv, {"-T"}));
  EXPECT_FALSE(Contains(argv, {"-n"}));  // the agent's stdin is forwarded
  EXPECT_TRUE(Contains(argv, {"-o", "BatchMode=yes"}));
  EXPECT_TRUE(Contains(argv, {"-o", "ConnectTimeout=4"}));
  EXPECT_TRUE(Contains(argv, {"-p", "2222"}));
  EXPECT_TRUE(Contains(argv, {"-i", "/keys/id", "-o", "IdentitiesOnly=yes"}));
  EXPECT_TRUE(Contains(argv, {"-o", "UserKnownHostsFile=/keys/known hosts", "-o",
                              "StrictHostKeyChecking=yes"}));
  EXPECT_TRUE(Contains(argv, {"-l", "headway"}));
  // The host, then the remote command as one word the remote shell splits.
  ASSERT_GE(argv.size(), 3u);
  EXPECT_EQ(argv[argv.size() - 3], "--");
  EXPECT_EQ(argv[argv.size() - 2], "gpu-b");
  EXPECT_EQ(argv.back(), "/opt/bin/headway-node --config '/c/a b.yaml'");

  const std::vector<std::string> plain =
      SshArgv("/usr/bin/ssh", LaunchConfig{}, "gpu-b", {"/bin/true"}, false);
  EXPECT_TRUE(Contains(plain, {"-n"}));
  EXPECT_TRUE(Contains(plain, {"-p", "22"}));
  EXPECT_FALSE(Contains(plain, {"-i"}));
  EXPECT_FALSE(Contains(plain, {"-l"}));
}

TEST(SshLaunchTest, RemoteCommandsUseTheRemoteDirectories) {
  LaunchConfig launch;
  EXPECT_EQ(RemoteAgentArgv(launch, "/c/d.yaml", "gpu-b", "/build/bin"),
            (std::vector<std::string>{"/build/bin/headway-node", "--config", "/c/d.yaml", "--host",
                                      "gpu-b", "--bin-dir", "/build/bin",
                                      "--exit-on-stdin-eof"}));
  EXPECT_EQ(RemotePreflightArgv(launch, "/c/d.yaml", "/build/bin"),
            (std::vector<std::string>{"/build/bin/headway-node", "--preflight", "--config",
                                      "/c/d.yaml"}));
  launch.bin_dir = "/opt/headway/bin";
  launch.model_dir = "/data/models";
  EXPECT_EQ(RemoteAgentArgv(launch, "/c/d.yaml", "gpu-b", "/build/bin"),
            (std::vector<std::string>{"/opt/headway/bin/headway-node", "--config", "/c/d.yaml",
                                      "--host", "gpu-b", "--model-dir", "/data/models",
                                      "--bin-dir", "/opt/headway/bin", "--exit-on-stdin-eof"}));
  EXPECT_EQ(RemotePreflightArgv(launch, "/c/d.yaml", "/build/bin"),
            (std::vector<std::string>{"/opt/headway/bin/headway-node", "--preflight", "--config",
                                      "/c/d.yaml", "--model-dir", "/data/models"}));

  Result<Config> config = ParseConfig(kBase);
  ASSERT_TRUE(config.ok());
  LaunchOptions options;
  options.config_path = "/c/d.yaml";
  options.bin_dir = "/build/bin";
  EXPECT_EQ(RemoteHosts(PlanLaunch(*config, options)), (std::vector<std::string>{"gpu-b"}));
}

TEST(SshLaunchTest, RemoteWorkersNeedAControlAddressTheyCanDial) {
  Result<Config> config = ParseConfig(kBase);
  ASSERT_TRUE(config.ok());
  EXPECT_TRUE(CheckControlAddressForRemoteHosts(*config, {}).ok());  // all local
  for (const char* address : {"tcp://127.0.0.1:5557", "tcp://localhost:5557", "tcp://[::1]:5557",
                              "ipc:///tmp/headway.sock"}) {
    config->control_address = address;
    const Status status = CheckControlAddressForRemoteHosts(*config, {"gpu-b"});
    EXPECT_FALSE(status.ok()) << address;
    EXPECT_NE(status.message().find("coordinator.control_address"), std::string::npos);
    EXPECT_NE(status.message().find("gpu-b"), std::string::npos) << status.message();
  }
  for (const char* address : {"tcp://head:5557", "tcp://10.0.0.1:5557"}) {
    config->control_address = address;
    EXPECT_TRUE(CheckControlAddressForRemoteHosts(*config, {"gpu-b"}).ok()) << address;
  }
}

PreflightReport Report() {
  PreflightReport r;
  r.version = "git-abc";
  r.config_hash = "xxh64:0000000000000001";
  r.model_path = "/here/m.gguf";
  r.model_bytes = 1000;
  r.model_checksum = "xxh64:00000000000000ff";
  return r;
}

TEST(PreflightTest, ReportRoundTripsThroughText) {
  const PreflightReport local = Report();
  Result<PreflightReport> parsed =
      ParsePreflight("some log line\n" + FormatPreflight(local) + "future_key=1\n");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->version, local.version);
  EXPECT_EQ(parsed->config_hash, local.config_hash);
  EXPECT_EQ(parsed->model_path, local.model_path);
  EXPECT_EQ(parsed->model_bytes, 1000);
  EXPECT_EQ(parsed->model_checksum, local.model_checksum);
  EXPECT_TRUE(PreflightProblems(local, *parsed).empty());

  PreflightReport missing = local;
  missing.model_error = "not found";
  Result<PreflightReport> parsed_missing = ParsePreflight(FormatPreflight(missing));
  ASSERT_TRUE(parsed_missing.ok());
  EXPECT_EQ(parsed_missing->model_error, "not found");

  EXPECT_FALSE(ParsePreflight("bash: headway-node: command not found\n").ok());
  EXPECT_FALSE(ParsePreflight("version=1\nconfig_hash=x\nmodel_path=/m\n").ok());
  EXPECT_FALSE(
      ParsePreflight("version=1\nconfig_hash=x\nmodel_path=/m\nmodel_bytes=1x\nmodel_checksum=c\n")
          .ok());
}

TEST(PreflightTest, LocalReportHashesConfigHeadPatternAndModel) {
  const std::string dir = testing::MakeTempDir("headway-preflight");
  std::ofstream(dir + "/c.yaml") << "model: {path: m.gguf}\n";
  std::ofstream(dir + "/heads.yaml") << "streaming: []\n";
  std::ofstream(dir + "/m.gguf", std::ios::binary) << "GGUF-bytes";
  Result<PreflightReport> plain = LocalPreflight(dir + "/c.yaml", "", dir + "/m.gguf");
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain->version, HeadwayVersion());
  EXPECT_EQ(plain->model_bytes, 10);
  EXPECT_EQ(plain->model_checksum, FormatXxh64(Xxh64Of("GGUF-bytes", 10)));
  Result<PreflightReport> with_pattern =
      LocalPreflight(dir + "/c.yaml", dir + "/heads.yaml", dir + "/m.gguf");
  ASSERT_TRUE(with_pattern.ok());
  EXPECT_NE(with_pattern->config_hash, plain->config_hash);  // the pattern is part of it

  EXPECT_EQ(LocalPreflight(dir + "/c.yaml", dir + "/none.yaml", dir + "/m.gguf").status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(LocalPreflight(dir + "/none.yaml", "", dir + "/m.gguf").status().code(),
            StatusCode::kNotFound);
  Result<PreflightReport> no_model = LocalPreflight(dir + "/c.yaml", "", dir + "/none.gguf");
  ASSERT_TRUE(no_model.ok());
  EXPECT_EQ(no_model->model_error, "not found");
}

TEST(PreflightTest, WorkerKeyFilesMustExistBeReadableAndSecretOnesPrivate) {
  const std::string dir = testing::MakeTempDir("headway-preflight-keys");
  SecurityConfig security;
  EXPECT_TRUE(CheckWorkerKeyFiles(security).empty());  // no keys, nothing to read
  security.coordinator_key = dir + "/coordinator.key_secret";  // the coordinator's: not read here
  security.authorized_keys = dir + "/authorized";
  security.coordinator_public_key = dir + "/coordinator.key";
  security.client_key = dir + "/worker.key_secret";
  std::ofstream(security.coordinator_public_key) << "public\n";
  std::ofstream(security.client_key) << "secret\n";
  chmod(security.client_key.c_str(), 0600);
  EXPECT_TRUE(CheckWorkerKeyFiles(security).empty());

  chmod(security.client_key.c_str(), 0644);
  std::vector<std::string> problems = CheckWorkerKeyFiles(security);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0], "security.client_key = " + security.client_key +
                             ": is a secret key readable by every user (mode 0644): chmod 600 "
                             "it there");
  chmod(security.client_key.c_str(), 0640);  // the group may read it
  EXPECT_TRUE(CheckWorkerKeyFiles(security).empty());

  security.coordinator_public_key = dir + "/none.key";
  security.client_key = dir;  // a directory
  problems = CheckWorkerKeyFiles(security);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0], "security.coordinator_public_key = " + dir +
                             "/none.key: not found (copy the key file there)");
  EXPECT_EQ(problems[1], "security.client_key = " + dir + ": is not a regular file");

  // They travel in the report, one line each, and each is a problem.
  PreflightReport remote = Report();
  remote.key_errors = problems;
  Result<PreflightReport> parsed = ParsePreflight(FormatPreflight(remote));
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->key_errors, problems);
  EXPECT_EQ(PreflightProblems(Report(), *parsed), problems);
}

TEST(PreflightTest, EveryDifferenceIsOneProblemSayingWhatToFix) {
  const PreflightReport local = Report();
  PreflightReport remote = Report();
  remote.model_path = "/there/m.gguf";  // each host resolves its own directory
  EXPECT_TRUE(PreflightProblems(local, remote).empty());

  auto only_problem = [&](const PreflightReport& r) {
    const std::vector<std::string> problems = PreflightProblems(local, r);
    EXPECT_EQ(problems.size(), 1u);
    return problems.empty() ? std::string() : problems[0];
  };
  PreflightReport r = Report();
  r.version = "git-def";
  EXPECT_NE(only_problem(r).find("same build"), std::string::npos);
  r = Report();
  r.config_hash = "xxh64:2";
  EXPECT_NE(only_problem(r).find("config file (or its model.head_pattern file) differs"), std::string::npos);
  r = Report();
  r.model_error = "not found";
  EXPECT_NE(only_problem(r).find("/here/m.gguf: not found"), std::string::npos);
  r = Report();
  r.model_bytes = 999;
  EXPECT_NE(only_problem(r).find("999 bytes"), std::string::npos);
  r = Report();
  r.model_checksum = "xxh64:00000000000000fe";
  EXPECT_NE(only_problem(r).find("checksum xxh64:00000000000000fe"), std::string::npos);
}

TEST(CapturedCommandsTest, RunsSideBySideAndKillsWhatOutlivesTheTimeout) {
  const std::string sh = FindExecutable("sh", "/nonexistent:/bin:/usr/bin");
  ASSERT_FALSE(sh.empty());
  EXPECT_EQ(FindExecutable("no-such-binary-here", "/bin:/usr/bin"), "");
  const auto started = std::chrono::steady_clock::now();
  const std::vector<CapturedCommand> results = RunCaptured(
      {{sh, "-c", "echo out; echo err >&2; exit 3"},
       {sh, "-c", "sleep 0.3; echo done"},
       {sh, "-c", "sleep 30"},
       {"/nonexistent/binary"}},
      std::chrono::milliseconds(1500));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_EQ(results.size(), 4u);
  EXPECT_TRUE(WIFEXITED(results[0].wait_status) && WEXITSTATUS(results[0].wait_status) == 3);
  EXPECT_EQ(results[0].output, "out\nerr\n");
  EXPECT_TRUE(WIFEXITED(results[1].wait_status) && WEXITSTATUS(results[1].wait_status) == 0);
  EXPECT_EQ(results[1].output, "done\n");
  EXPECT_TRUE(results[2].timed_out);
  EXPECT_TRUE(WIFEXITED(results[3].wait_status) && WEXITSTATUS(results[3].wait_status) == 127);
  EXPECT_NE(results[3].output.find("cannot execute /nonexistent/binary"), std::string::npos);
  EXPECT_LT(seconds, 5.0);  // side by side, and the sleeper did not hold it up
}

}  // namespace
}  // namespace headway::launcher
