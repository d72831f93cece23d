#include "deploy/launcher/captured_commands.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace headway::launcher {

std::string FindExecutable(const std::string& name, const char* path_env) {
  if (name.find('/') != std::string::npos) return name;
  const std::string path = path_env != nullptr ? path_env : "/usr/bin:/bin";
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find(':', begin);
    if (end == std::string::npos) end = path.size();
    const std::string dir = end > begin ? path.substr(begin, end - begin) : ".";
    const std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    begin = end + 1;
  }
  return "";
}

std::vector<CapturedCommand> RunCaptured(const std::vector<std::vector<std::string>>& argvs,
                                         std::chrono::milliseconds timeout) {
  std::vector<CapturedCommand> results(argvs.size());
  std::vector<pid_t> pids(argvs.size(), -1);
  std::vector<int> fds(argvs.size(), -1);
  for (size_t i = 0; i < argvs.size(); ++i) {
    std::vector<char*> argv;
    for (const std::string& arg : argvs[i]) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) {
      results[i].output = std::string("pipe failed: ") + std::strerror(errno);
      continue;
    }
    const pid_t pid = fork();
    if (pid < 0) {
      results[i].output = std::string("fork failed: ") + std::strerror(errno);
      close(out[0]);
      close(out[1]);
      continue;
    }
    if (pid == 0) {
      const int null_fd = open("/dev/null", O_RDONLY);
      if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      dup2(out[1], STDERR_FILENO);
      execv(argv[0], argv.data());
      const std::string why = std::string("cannot execute ") + argv[0] + ": " +
                              std::strerror(errno) + "\n";
      ssize_t ignored = write(STDERR_FILENO, why.data(), why.size());
      (void)ignored;
      _exit(127);
    }
    close(out[1]);
    pids[i] = pid;
    fds[i] = out[0];
  }

  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::vector<pollfd> polled;
    std::vector<size_t> owner;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i] < 0) continue;
      polled.push_back({fds[i], POLLIN, 0});
      owner.push_back(i);
    }
    if (polled.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    const int ready = poll(polled.data(), polled.size(), int(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) break;
    for (size_t k = 0; k < polled.size(); ++k) {
      if (polled[k].revents == 0) continue;
      char buf[4096];
      const ssize_t n = read(polled[k].fd, buf, sizeof buf);
      if (n > 0) {
        results[owner[k]].output.append(buf, size_t(n));
      } else if (n == 0 || errno != EINTR) {
        close(polled[k].fd);
        fds[owner[k]] = -1;
      }
    }
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (fds[i] >= 0) {
      // Still writing at the deadline.
      close(fds[i]);
      kill(pids[i], SIGKILL);
      results[i].timed_out = true;
    }
    if (pids[i] < 0) continue;
    int status = 0;
    if (!results[i].timed_out) {
      // Output closed: the command is exiting, or left a child holding the
      // pipe; give it until the deadline, then kill it.
      while (waitpid(pids[i], &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() >= deadline) {
          kill(pids[i], SIGKILL);
          results[i].timed_out = true;
          break;
        }
        usleep(10000);
      }
      if (!results[i].timed_out) {
        results[i].wait_status = status;
        continue;
      }
    }
    while (waitpid(pids[i], &status, 0) < 0 && errno == EINTR) {
    }
    results[i].wait_status = status;
  }
  return results;
}

}  // namespace headway::launcher
