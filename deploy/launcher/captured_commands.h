// Short commands run side by side with their output collected: the
// launcher's preflight runs one ssh session per host at once, so that a
// deployment of many hosts checks in the time of the slowest.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace headway::launcher {

struct CapturedCommand {
  int wait_status = -1;   // as from waitpid; -1 when it could not be started
  bool timed_out = false; // killed (SIGKILL) at the deadline
  std::string output;     // stdout and stderr, interleaved as written
};

// `name` found in `path_env` (a $PATH value; null = /usr/bin:/bin), or ""
// when no directory of it holds an executable file of that name. A name
// containing '/' is returned as it is.
std::string FindExecutable(const std::string& name, const char* path_env);

// Starts every argv (argv[0] an absolute path) at once with stdin on
// /dev/null and waits until all have exited, or until `timeout` has passed,
// when the rest are killed. Returns one entry per argv, in order. A command
// that cannot be started has wait_status -1 and the reason in `output`.
// Blocks the calling thread; the children stay in its process group, so a
// terminal's Ctrl-C reaches them too.
std::vector<CapturedCommand> RunCaptured(const std::vector<std::vector<std::string>>& argvs,
                                         std::chrono::milliseconds timeout);

}  // namespace headway::launcher
