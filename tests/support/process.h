// Child processes and ports for integration and end-to-end tests.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace headway::testing {

// A child process that is stopped (SIGTERM, then SIGKILL after 5 s) when the
// object goes out of scope, on every path out of a test. Its stdout and
// stderr go to `log_path` (appended) so a failing test can show them.
// Once it has exited, a sanitizer report in what it wrote to the log (a
// sanitizer build, README "Tests" > "Sanitizers") fails the current test,
// whatever its exit status: many tests stop their children with SIGTERM and
// do not look at how they exited.
class ChildProcess {
 public:
  // Starts `argv[0]` with arguments argv[1..]. Returns an object whose
  // pid() is -1 if fork/exec failed (the log says why).
  ChildProcess(std::vector<std::string> argv, std::string log_path);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // True while the process has not exited (reaps it if it has).
  bool Running();
  // Waits up to `timeout` for exit; returns the wait status, or -1 on timeout.
  int WaitExit(std::chrono::milliseconds timeout);
  // Sends `signal` (no-op once exited).
  void Signal(int signal);
  // SIGTERM, wait up to `grace`, then SIGKILL; returns the wait status.
  int Stop(std::chrono::milliseconds grace = std::chrono::seconds(5));
  // The log's contents so far.
  std::string Log() const;
  const std::string& log_path() const { return log_path_; }

 private:
  // Called once the child is reaped: ADD_FAILURE with any sanitizer report
  // that appeared in the log after log_start_.
  void CheckSanitizerReports();

  pid_t pid_ = -1;
  int status_ = -1;
  std::uintmax_t log_start_ = 0;  // the log's size (bytes) before the child started
  bool exited_ = false;
  std::string log_path_;
};

// A TCP port on 127.0.0.1 that was free a moment ago, drawn at random from
// the 12,000 ports below the kernel's ephemeral range, which the kernel
// never hands out by itself (port-0 binds and outgoing connections take
// theirs from that range): only another test drawing the same port could
// take it before use. -1 when 200 draws found none free.
int FreePort();

// A fresh, empty directory under the system temp dir.
std::string MakeTempDir(const std::string& prefix);

// A MakeTempDir(prefix) directory, removed with all it holds on scope exit.
struct ScopedTempDir {
  explicit ScopedTempDir(const std::string& prefix) : path(MakeTempDir(prefix)) {}
  ~ScopedTempDir();
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  std::string path;  // "" when it could not be made
};

// The whole content of the file at `path`; "" when it cannot be read.
std::string ReadText(const std::string& path);

}  // namespace headway::testing
