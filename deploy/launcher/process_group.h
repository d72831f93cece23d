// Child processes of the launcher: start, notice exits, stop.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "deploy/launcher/launch_plan.h"

namespace headway::launcher {

// A child that has exited.
struct ExitedChild {
  std::string name;
  pid_t pid = 0;
  int wait_status = 0;  // as from waitpid
};

// "exited with status 3" or "killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int wait_status);

// The children of one launcher. Not thread-safe. The destructor stops every
// child still running (StopAll with the default grace period).
class ProcessGroup {
 public:
  // `child_sigmask` is the signal mask children start with (the launcher
  // blocks the signals it waits for; its children must not inherit that).
  explicit ProcessGroup(const sigset_t& child_sigmask);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Forks and execs spec.argv. The child gets its own process group (so a
  // terminal's Ctrl-C reaches only the launcher, which then stops everything
  // in order) and PR_SET_PDEATHSIG = SIGTERM (so it never outlives the
  // launcher). Returns the pid. Errors: Unavailable if fork fails;
  // FailedPrecondition naming the binary if exec fails (checked synchronously
  // through a close-on-exec pipe, so a missing binary is reported here).
  // REQUIRES: spec.local, !spec.argv.empty().
  Result<pid_t> Start(const ProcessSpec& spec);

  // Reaps children that have exited, without blocking; returns the first one
  // found (the others stay to be reaped by later calls), or nullopt.
  std::optional<ExitedChild> ReapExited();

  // `signal` to the children `pids` names (others are ignored), wait up to
  // `grace` for them to exit, then SIGKILL the rest; reaps them all and
  // returns their exits. Other children are left as they are.
  std::vector<ExitedChild> Stop(const std::vector<pid_t>& pids,
                                std::chrono::milliseconds grace = std::chrono::seconds(10),
                                int signal = SIGTERM);

  // Stop(every running child, grace, signal). Returns once no child is left.
  void StopAll(std::chrono::milliseconds grace = std::chrono::seconds(10), int signal = SIGTERM);

  // Pids of the running children, in start order.
  std::vector<pid_t> RunningPids() const;

 private:
  struct Child {
    std::string name;
    pid_t pid = 0;
  };

  sigset_t child_sigmask_;
  std::vector<Child> children_;  // running (not yet reaped) children
};

}  // namespace headway::launcher
