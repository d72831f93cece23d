#include "deploy/launcher/signals.h"

#include <filesystem>

namespace headway::launcher {
namespace {

sigset_t SupervisorSignals() {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGCHLD);
  return mask;
}

}  // namespace

sigset_t BlockSupervisorSignals() {
  const sigset_t mask = SupervisorSignals();
  sigset_t original;
  sigprocmask(SIG_BLOCK, &mask, &original);
  return original;
}

std::optional<int> WaitSignal(std::chrono::milliseconds timeout) {
  const sigset_t mask = SupervisorSignals();
  timespec ts{static_cast<time_t>(timeout.count() / 1000),
              static_cast<long>((timeout.count() % 1000) * 1000000)};
  siginfo_t info;
  const int sig = sigtimedwait(&mask, &info, &ts);
  if (sig < 0) return std::nullopt;  // EAGAIN (timeout) or EINTR
  return sig;
}

std::string OwnDirectory() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

}  // namespace headway::launcher
