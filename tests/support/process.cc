#include "tests/support/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <random>
#include <thread>
#include <utility>

namespace headway::testing {

ChildProcess::ChildProcess(std::vector<std::string> argv, std::string log_path)
    : log_path_(std::move(log_path)) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(log_path_, ec);
  log_start_ = ec ? 0 : size;
  pid_ = fork();
  if (pid_ == 0) {
    // Child: never outlive the test process.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    dprintf(STDERR_FILENO, "exec %s failed\n", args[0]);
    _exit(127);
  }
}

ChildProcess::~ChildProcess() { Stop(); }

bool ChildProcess::Running() {
  if (pid_ <= 0 || exited_) return false;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exited_ = true;
    status_ = status;
    CheckSanitizerReports();
    return false;
  }
  return true;
}

int ChildProcess::WaitExit(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (Running()) {
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status_;
}

void ChildProcess::Signal(int signal) {
  if (Running()) kill(pid_, signal);
}

int ChildProcess::Stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return -1;
  if (!Running()) return status_;
  kill(pid_, SIGTERM);
  if (WaitExit(grace) != -1) return status_;
  kill(pid_, SIGKILL);
  return WaitExit(std::chrono::seconds(5));
}

void ChildProcess::CheckSanitizerReports() {
  std::string log = Log();
  if (log_start_ >= log.size()) return;
  log.erase(0, log_start_);
  // Every sanitizer ends a report with "SUMMARY: <Name>Sanitizer: ...".
  size_t summary = std::string::npos;
  for (const char* name : {"Address", "Leak", "Thread", "UndefinedBehavior"}) {
    summary = std::min(summary, log.find(std::string("SUMMARY: ") + name + "Sanitizer:"));
  }
  if (summary == std::string::npos) return;
  // The first report starts at its "==<pid>==ERROR: ...Sanitizer", "WARNING:
  // ThreadSanitizer" or "<file>:<line>: runtime error:" line.
  size_t start = summary;
  for (const char* marker : {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                             "WARNING: ThreadSanitizer", ": runtime error: "}) {
    start = std::min(start, log.find(marker));
  }
  start = log.rfind('\n', start);
  start = start == std::string::npos ? 0 : start + 1;
  constexpr size_t kMaxReport = 16384;  // the top frames of several reports
  ADD_FAILURE() << "sanitizer report from child " << pid_ << " (log " << log_path_ << "):\n"
                << log.substr(start, kMaxReport);
}

std::string ChildProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

// Whether a TCP socket can bind 127.0.0.1:`port` now.
bool CanBind(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(uint16_t(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// The kernel's ephemeral port range [first, last]
// (/proc/sys/net/ipv4/ip_local_port_range; Linux's default if unreadable).
std::pair<int, int> EphemeralRange() {
  int first = 32768, last = 60999;
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  in >> first >> last;
  return {first, last};
}

}  // namespace

int FreePort() {
  // Below the ephemeral range: the kernel hands those ports to every bind to
  // port 0 and to the source side of every outgoing connection, so one
  // picked from there can be taken by any test's client before the process
  // it is meant for binds it. Ports below it are only ever taken by name.
  const int first = std::max(1024, EphemeralRange().first - 12000);
  const int last = EphemeralRange().first - 1;
  thread_local std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(first, std::max(first, last));
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = pick(rng);
    if (CanBind(port)) return port;
  }
  return -1;
}

ScopedTempDir::~ScopedTempDir() {
  std::error_code ec;
  if (!path.empty()) std::filesystem::remove_all(path, ec);
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  char* dir = mkdtemp(tmpl.data());
  return dir ? std::string(dir) : std::string();
}

}  // namespace headway::testing
