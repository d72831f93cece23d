// Signal and path helpers shared by headway-launch and headway-node, which
// take their signals synchronously (blocked, then sigtimedwait).
#pragma once

#include <signal.h>

#include <chrono>
#include <optional>
#include <string>

namespace headway::launcher {

// Blocks SIGINT, SIGTERM and SIGCHLD for the calling thread (they queue for
// WaitSignal); returns the mask it had, which children should start with.
sigset_t BlockSupervisorSignals();

// Waits up to `timeout` for one of SIGINT, SIGTERM, SIGCHLD; returns it, or
// nullopt on timeout. REQUIRES: BlockSupervisorSignals() was called.
std::optional<int> WaitSignal(std::chrono::milliseconds timeout);

// True for SIGINT and SIGTERM.
inline bool IsStopSignal(std::optional<int> sig) {
  return sig && (*sig == SIGINT || *sig == SIGTERM);
}

// The directory of the running executable, where the build puts its
// sibling binaries ("." if /proc/self/exe cannot be read).
std::string OwnDirectory();

}  // namespace headway::launcher
