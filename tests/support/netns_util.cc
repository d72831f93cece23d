#include "tests/support/netns_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

namespace headway::testing::netns {
namespace {

// True while `pid` runs; a zombie (dead, not yet reaped by its parent)
// counts as gone.
bool ProcessRunning(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  // "pid (comm) S ...": the state follows the last ')', as comm may hold any.
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

}  // namespace

bool RunQuietly(const std::string& command) {
  const std::string quiet = "(" + command + ") >/dev/null 2>&1";
  const int rc = std::system(quiet.c_str());
  return rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
}

std::string FindIp() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

std::vector<std::string> Orphans(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> orphans;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return orphans;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    // <prefix><tag>-<pid>-...: the pid follows the tag.
    const size_t tag_end = name.find('-', prefix.size());
    if (tag_end == std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str() + tag_end + 1));
    if (pid > 0 && !ProcessRunning(pid)) orphans.push_back(name);
  }
  closedir(d);
  return orphans;
}

std::vector<std::string> ExecArgv(const std::string& ip_path, const std::string& ns,
                                  const std::vector<std::string>& argv,
                                  const std::vector<std::string>& env) {
  std::vector<std::string> out = {ip_path, "netns", "exec", ns, "/usr/bin/env"};
  out.insert(out.end(), env.begin(), env.end());
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

Status RunIn(const std::string& ns, const std::function<void()>& fn) {
  const std::string path = kNetnsDir + ns;
  Status status;
  std::thread thread([&] {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      status = Status::Internal("open " + path + ": " + std::strerror(errno));
      return;
    }
    const int rc = setns(fd, CLONE_NEWNET);
    const int setns_errno = errno;
    close(fd);
    if (rc != 0) {
      status = Status::Internal("setns " + path + ": " + std::strerror(setns_errno));
      return;
    }
    fn();
  });
  thread.join();
  return status;
}

}  // namespace headway::testing::netns
