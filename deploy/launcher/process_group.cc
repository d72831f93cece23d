#include "deploy/launcher/process_group.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace headway::launcher {

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) {
    return "exited with status " + std::to_string(WEXITSTATUS(wait_status));
  }
  if (WIFSIGNALED(wait_status)) {
    int sig = WTERMSIG(wait_status);
    const char* name = strsignal(sig);
    return "killed by signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
  }
  return "stopped (wait status " + std::to_string(wait_status) + ")";
}

ProcessGroup::ProcessGroup(const sigset_t& child_sigmask) : child_sigmask_(child_sigmask) {}

ProcessGroup::~ProcessGroup() { StopAll(); }

Result<pid_t> ProcessGroup::Start(const ProcessSpec& spec) {
  HW_CHECK(spec.local && !spec.argv.empty());
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls are allowed.
  std::vector<char*> argv;
  for (const std::string& arg : spec.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const int stdin_fd = spec.stdin_fd;

  int exec_pipe[2];
  if (pipe2(exec_pipe, O_CLOEXEC) != 0) {
    return Status::Unavailable(std::string("pipe failed: ") + std::strerror(errno));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(exec_pipe[0]);
    close(exec_pipe[1]);
    return Status::Unavailable("cannot fork for " + spec.name + ": " + std::strerror(err));
  }
  if (pid == 0) {
    close(exec_pipe[0]);
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);  // the launcher died before prctl took effect
    // Background shells start jobs with SIGINT ignored; children get defaults.
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &child_sigmask_, nullptr);
    if (stdin_fd >= 0) dup2(stdin_fd, STDIN_FILENO);
    execv(argv[0], argv.data());
    int err = errno;
    ssize_t ignored = write(exec_pipe[1], &err, sizeof(err));
    (void)ignored;
    _exit(127);
  }
  close(exec_pipe[1]);
  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(exec_pipe[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  close(exec_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
    int status = 0;
    waitpid(pid, &status, 0);
    return Status::FailedPrecondition("cannot execute " + spec.argv[0] + " (" + spec.name +
                                      "): " + std::strerror(exec_errno));
  }
  children_.push_back({spec.name, pid});
  return pid;
}

std::optional<ExitedChild> ProcessGroup::ReapExited() {
  for (size_t i = 0; i < children_.size(); ++i) {
    int status = 0;
    pid_t r = waitpid(children_[i].pid, &status, WNOHANG);
    if (r == children_[i].pid || (r < 0 && errno == ECHILD)) {
      ExitedChild exited{children_[i].name, children_[i].pid, r > 0 ? status : 0};
      children_.erase(children_.begin() + static_cast<std::ptrdiff_t>(i));
      return exited;
    }
  }
  return std::nullopt;
}

std::vector<ExitedChild> ProcessGroup::Stop(const std::vector<pid_t>& pids,
                                            std::chrono::milliseconds grace, int signal) {
  std::vector<Child> stopping;
  for (const Child& child : children_) {
    if (std::find(pids.begin(), pids.end(), child.pid) != pids.end()) stopping.push_back(child);
  }
  for (const Child& child : stopping) kill(child.pid, signal);
  std::vector<ExitedChild> exits;
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (true) {
    for (size_t i = 0; i < stopping.size();) {
      int status = 0;
      const pid_t r = waitpid(stopping[i].pid, &status, WNOHANG);
      if (r == stopping[i].pid || (r < 0 && errno == ECHILD)) {
        exits.push_back({stopping[i].name, stopping[i].pid, r > 0 ? status : 0});
        stopping.erase(stopping.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    if (stopping.empty() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const Child& child : stopping) {
    kill(child.pid, SIGKILL);
    int status = 0;
    while (waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
    }
    exits.push_back({child.name, child.pid, status});
  }
  for (const ExitedChild& e : exits) {
    children_.erase(std::remove_if(children_.begin(), children_.end(),
                                   [&](const Child& c) { return c.pid == e.pid; }),
                    children_.end());
  }
  return exits;
}

void ProcessGroup::StopAll(std::chrono::milliseconds grace, int signal) {
  Stop(RunningPids(), grace, signal);
}

std::vector<pid_t> ProcessGroup::RunningPids() const {
  std::vector<pid_t> pids;
  for (const Child& child : children_) pids.push_back(child.pid);
  return pids;
}

}  // namespace headway::launcher
