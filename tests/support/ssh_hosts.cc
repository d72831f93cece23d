#include "tests/support/ssh_hosts.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "tests/support/control_keys.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kSshd[] = "/usr/sbin/sshd";
constexpr char kSshKeygen[] = "/usr/bin/ssh-keygen";

std::string Tail(const ChildProcess& p, size_t max_chars) {
  const std::string log = p.Log();
  return p.log_path() + ":\n" + (log.size() > max_chars ? log.substr(log.size() - max_chars) : log);
}

// Runs `argv` to completion; true when it exits 0.
bool RunToEnd(const std::vector<std::string>& argv, const std::string& log) {
  ChildProcess p(argv, log);
  const int status = p.WaitExit(std::chrono::seconds(30));
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// True once something accepts TCP connections on `address`:22, within 10 s.
// Call from a thread in the namespace that reaches `address`.
bool WaitForSshd(const std::string& address) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(22);
    inet_pton(AF_INET, address.c_str(), &sa.sin_addr);
    const bool listening = connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
    close(fd);
    if (listening) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace

SshHosts::SshHosts(const std::string& dir, std::vector<HostState> states)
    : dir_(dir), states_(std::move(states)), lan_("ssh", int(states_.size()) + 1) {}

SshHosts::~SshHosts() { sshd_.clear(); }  // before the LAN goes

void SshHosts::Start() {
  ASSERT_TRUE(RunToEnd({kSshKeygen, "-q", "-t", "ed25519", "-N", "", "-f", dir_ + "/host_key"},
                       dir_ + "/keygen.log"));
  ASSERT_TRUE(RunToEnd({kSshKeygen, "-q", "-t", "ed25519", "-N", "", "-f", dir_ + "/client_key"},
                       dir_ + "/keygen.log"));
  std::filesystem::copy_file(dir_ + "/client_key.pub", dir_ + "/authorized_keys");
  std::istringstream host_pub(ReadText(dir_ + "/host_key.pub"));
  std::string key_type, key_body;
  host_pub >> key_type >> key_body;
  std::string hosts = "127.0.0.1 localhost\n" + lan_.address(0) + " launchhost\n";
  std::ofstream known(dir_ + "/known_hosts");
  for (int i = 1; i <= num_hosts(); ++i) {
    hosts += lan_.address(i) + " " + HostName(i) + "\n";
    known << HostName(i) << "," << lan_.address(i) << " " << key_type << " " << key_body << "\n";
  }
  known.close();
  ASSERT_TRUE(lan_.WriteHosts(hosts).ok());
  // sshd's privilege separation directory (the ssh.service unit makes it).
  std::error_code ec;
  std::filesystem::create_directories("/run/sshd", ec);

  const std::string model_dir = std::filesystem::path(SmolLm2Path()).parent_path().string();
  for (int i = 1; i <= num_hosts(); ++i) {
    const HostState state = states_[size_t(i - 1)];
    if (state == HostState::kNoSshd) continue;
    std::string host_models = model_dir;
    if (state != HostState::kServing) {
      host_models = dir_ + "/models-" + HostName(i);
      std::filesystem::create_directories(host_models);
    }
    if (state == HostState::kWrongModel) {
      // Same name and size, other bytes: only the checksum tells.
      const std::string path =
          host_models + "/" + std::filesystem::path(SmolLm2Path()).filename().string();
      std::ofstream(path, std::ios::binary).close();
      std::filesystem::resize_file(path, std::filesystem::file_size(SmolLm2Path()));
    }
    const std::string config = dir_ + "/sshd_config-" + HostName(i);
    std::ofstream(config) << "ListenAddress " << lan_.address(i) << ":22\n"
                          << "HostKey " << dir_ << "/host_key\n"
                          << "AuthorizedKeysFile " << dir_ << "/authorized_keys\n"
                          << "PidFile none\n"
                          << "UsePAM no\n"
                          << "StrictModes no\n"
                          << "PermitRootLogin prohibit-password\n"
                          << "PubkeyAuthentication yes\n"
                          << "PasswordAuthentication no\n"
                          << "KbdInteractiveAuthentication no\n"
                          << "SetEnv HEADWAY_MODEL_DIR=" << host_models << "\n";
    sshd_.push_back(std::make_unique<ChildProcess>(
        lan_.ExecArgv(i, {kSshd, "-D", "-e", "-f", config}),
        dir_ + "/sshd-" + HostName(i) + ".log"));
  }
  for (int i = 1; i <= num_hosts(); ++i) {
    if (states_[size_t(i - 1)] == HostState::kNoSshd) continue;
    bool listening = false;
    const Status joined = lan_.RunInNamespace(0, [&] { listening = WaitForSshd(lan_.address(i)); });
    ASSERT_TRUE(joined.ok()) << joined.ToString();
    ASSERT_TRUE(listening) << HostName(i) << "'s sshd does not listen\n" << Logs();
  }
}

std::string SshHosts::LaunchSection() const {
  return "launch:\n  user: root\n  port: 22\n  key: " + dir_ + "/client_key\n  known_hosts: " +
         dir_ + "/known_hosts\n  connect_timeout_s: 5\n";
}

std::string SshHosts::Logs() const {
  std::string all;
  for (const auto& p : sshd_) all += Tail(*p, 1500) + "\n";
  return all;
}

bool CannotRunSshHosts(std::string* why) {
  if (geteuid() != 0) {
    *why = "needs root (network namespaces, sshd)";
    return true;
  }
  if (access(kSshd, X_OK) != 0 || access(kSshKeygen, X_OK) != 0) {
    *why = std::string(kSshd) + " not found: install openssh-server (deploy/setup.sh)";
    return true;
  }
  return false;
}

std::string SshDeploymentYaml(const std::string& pools, const std::string& coordinator_host,
                              int http_port, int control_port, bool kv_transfer,
                              const std::string& keys_dir) {
  std::string keys_error;
  const std::string security = ControlPlaneKeysYaml(keys_dir, &keys_error);
  EXPECT_TRUE(keys_error.empty()) << keys_error;
  std::string yaml = "model:\n  path: " +
                     std::filesystem::path(SmolLm2Path()).filename().string() +
                     "\n  served_name: smollm2\n"
                     "coordinator:\n  http_host: 0.0.0.0\n  http_port: " +
                     std::to_string(http_port) + "\n  control_address: tcp://" +
                     coordinator_host + ":" + std::to_string(control_port) +
                     "\n  control_bind: tcp://0.0.0.0:" + std::to_string(control_port) +
                     "\ncache:\n  block_size: 16\n  kv_memory_mb: 64\n"
                     "scheduler:\n  max_num_seqs: 8\n  max_num_batched_tokens: 256\n"
                     "  max_model_len: 1024\n";
  if (kv_transfer) yaml += "kv_transfer:\n  transports: tcp\n  timeout_ms: 5000\n";
  return yaml + security + pools;
}

std::vector<ProcInfo> Processes() {
  std::vector<ProcInfo> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    ProcInfo info;
    info.pid = pid_t(std::stol(name));
    std::string raw = ReadText(entry.path().string() + "/cmdline");
    for (char& c : raw) {
      if (c == '\0') c = ' ';
    }
    info.cmdline = raw;
    struct stat st;
    if (stat((entry.path().string() + "/ns/net").c_str(), &st) == 0) info.net_ns = st.st_ino;
    out.push_back(info);
  }
  return out;
}

ino_t NamespaceInode(const std::string& netns_name) {
  struct stat st;
  return stat(("/run/netns/" + netns_name).c_str(), &st) == 0 ? st.st_ino : 0;
}

bool IsHeadwayProcess(const ProcInfo& p) {
  return p.cmdline.find("bin/headway-") != std::string::npos &&
         p.cmdline.find("bin/headway-launch") == std::string::npos;
}

std::vector<ProcInfo> HeadwayProcessesOf(const std::string& dir) {
  std::vector<ProcInfo> found;
  for (const ProcInfo& p : Processes()) {
    if (p.cmdline.find(dir) != std::string::npos && IsHeadwayProcess(p)) found.push_back(p);
  }
  return found;
}

int FlagValue(const std::string& cmdline, const std::string& flag) {
  std::istringstream words(cmdline);
  std::string word;
  int value = -1;
  while (words >> word) {
    if (word == flag && !(words >> value)) return -1;
  }
  return value;
}

}  // namespace headway::testing
