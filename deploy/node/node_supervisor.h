// The workers one node runs, supervised instance by instance (DESIGN.md
// "Configuration and deployment": one instance's ranks restart together;
// the others keep serving). Pure logic over a ProcessRunner and a clock that
// the caller passes in, so tests drive it without processes or sleeps.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "deploy/launcher/launch_plan.h"
#include "deploy/launcher/process_group.h"

namespace headway::node {

using Clock = std::chrono::steady_clock;

// Starts, reaps and stops processes: launcher::ProcessGroup in headway-node,
// a fake in tests.
class ProcessRunner {
 public:
  virtual ~ProcessRunner() = default;
  // As launcher::ProcessGroup::Start.
  virtual Result<pid_t> Start(const launcher::ProcessSpec& spec) = 0;
  // One child that has exited, without blocking; nullopt if none.
  virtual std::optional<launcher::ExitedChild> ReapExited() = 0;
  // Stops `pids` (a signal, a grace period, SIGKILL) and returns once all
  // are reaped. kNow: the workers exit at once (their instance is broken or
  // the node goes away with its launcher); kDrain: each worker asks the
  // coordinator to drain its instance and exits when released (SIGTERM),
  // so the grace period covers the drain.
  enum class Mode { kNow, kDrain };
  virtual void Stop(const std::vector<pid_t>& pids, Mode mode) = 0;
};

struct RestartPolicy {
  // Wait before the first restart of an instance; doubles per consecutive
  // failure up to max_backoff.
  std::chrono::milliseconds initial_backoff{1000};
  std::chrono::milliseconds max_backoff{30000};
  // An instance that stayed up this long has recovered: its next failure
  // waits initial_backoff again.
  std::chrono::milliseconds healthy_after{60000};
};

// Exit status of a worker refused for its configuration or command line:
// starting it again cannot help, so the node gives up (Poll's error).
constexpr int kWorkerUsageExit = 2;

class NodeSupervisor {
 public:
  // `workers`: the plan's workers on this node (launcher::WorkersOn), each
  // with its instance_id and tp_rank. `runner` must outlive this.
  NodeSupervisor(std::vector<launcher::ProcessSpec> workers, ProcessRunner* runner,
                 RestartPolicy policy);

  // Starts every worker, instance by instance. Error: the first worker that
  // could not be started (what did start is stopped again).
  Status Start(Clock::time_point now);

  // Reaps the workers that exited and starts the instances whose restart is
  // due; call it after SIGCHLD and at least every 100 ms. A worker that
  // exits takes its instance's other ranks on this node down with it (a TP
  // group cannot go on without a rank). Exit status 0 means the coordinator
  // released the instance (a drain ended: a rolling restart): it starts
  // again at once, no failure counted. Any other end is a failure: the
  // instance starts again after its backoff; a restart that fails to start
  // counts as one more failure. Appends a line per event to *log.
  // Error (FailedPrecondition, naming the worker): a worker exited with
  // kWorkerUsageExit; nothing of that instance is restarted.
  Status Poll(Clock::time_point now, std::vector<std::string>* log);

  // Stops every worker (ProcessRunner::Mode); nothing restarts afterwards.
  void StopAll(ProcessRunner::Mode mode);

  // Per instance on this node, in instance order: for status and tests.
  struct InstanceStatus {
    int instance_id = -1;
    bool running = false;
    int starts = 0;                          // successful starts so far
    int consecutive_failures = 0;
    std::optional<Clock::time_point> restart_at;
    std::vector<pid_t> pids;                 // of the running ranks, rank order
  };
  std::vector<InstanceStatus> Instances() const;

 private:
  struct Instance {
    std::vector<launcher::ProcessSpec> ranks;
    std::vector<pid_t> pids;  // one per rank; 0 when not running
    Clock::time_point started_at;
    int starts = 0;
    int consecutive_failures = 0;
    std::optional<Clock::time_point> restart_at;
  };

  // Starts every rank of `inst`; on failure stops the ranks it started.
  Status StartInstance(Instance& inst, Clock::time_point now);
  // Stops the still running ranks of `inst` and schedules its restart.
  void Failed(Instance& inst, Clock::time_point now, std::vector<std::string>* log);
  // A rank exited 0: the same, restarting at once with no failure counted.
  void Released(Instance& inst, Clock::time_point now, std::vector<std::string>* log);
  std::vector<pid_t> RunningPids(const Instance& inst) const;

  ProcessRunner* const runner_;
  const RestartPolicy policy_;
  std::map<int, Instance> instances_;  // by instance id
  bool stopped_ = false;
};

}  // namespace headway::node
