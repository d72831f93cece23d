#include "deploy/node/node_supervisor.h"

#include <sys/wait.h>

#include <algorithm>
#include <utility>

namespace headway::node {
namespace {

std::string Seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", double(d.count()) / 1000.0);
  return buf;
}

}  // namespace

NodeSupervisor::NodeSupervisor(std::vector<launcher::ProcessSpec> workers, ProcessRunner* runner,
                               RestartPolicy policy)
    : runner_(runner), policy_(policy) {
  for (launcher::ProcessSpec& spec : workers) {
    HW_CHECK(spec.instance_id >= 0 && spec.tp_rank >= 0);
    Instance& inst = instances_[spec.instance_id];
    inst.ranks.push_back(std::move(spec));
  }
  for (auto& [id, inst] : instances_) {
    std::sort(inst.ranks.begin(), inst.ranks.end(),
              [](const launcher::ProcessSpec& a, const launcher::ProcessSpec& b) {
                return a.tp_rank < b.tp_rank;
              });
    inst.pids.assign(inst.ranks.size(), 0);
  }
}

std::vector<pid_t> NodeSupervisor::RunningPids(const Instance& inst) const {
  std::vector<pid_t> pids;
  for (pid_t pid : inst.pids) {
    if (pid > 0) pids.push_back(pid);
  }
  return pids;
}

Status NodeSupervisor::StartInstance(Instance& inst, Clock::time_point now) {
  for (size_t r = 0; r < inst.ranks.size(); ++r) {
    Result<pid_t> pid = runner_->Start(inst.ranks[r]);
    if (!pid.ok()) {
      runner_->Stop(RunningPids(inst), ProcessRunner::Mode::kNow);
      std::fill(inst.pids.begin(), inst.pids.end(), 0);
      return pid.status();
    }
    inst.pids[r] = *pid;
  }
  inst.started_at = now;
  inst.restart_at.reset();
  ++inst.starts;
  return Status::Ok();
}

Status NodeSupervisor::Start(Clock::time_point now) {
  for (auto& [id, inst] : instances_) {
    if (Status s = StartInstance(inst, now); !s.ok()) {
      StopAll(ProcessRunner::Mode::kNow);
      return s;
    }
  }
  return Status::Ok();
}

void NodeSupervisor::Failed(Instance& inst, Clock::time_point now,
                            std::vector<std::string>* log) {
  runner_->Stop(RunningPids(inst), ProcessRunner::Mode::kNow);
  std::fill(inst.pids.begin(), inst.pids.end(), 0);
  if (inst.starts > 0 && now - inst.started_at >= policy_.healthy_after) {
    inst.consecutive_failures = 0;
  }
  ++inst.consecutive_failures;
  std::chrono::milliseconds backoff = policy_.initial_backoff;
  for (int i = 1; i < inst.consecutive_failures && backoff < policy_.max_backoff; ++i) {
    backoff *= 2;
  }
  backoff = std::min(backoff, policy_.max_backoff);
  inst.restart_at = now + backoff;
  log->push_back("instance " + std::to_string(inst.ranks[0].instance_id) + " restarts in " +
                 Seconds(backoff) + " (failure " + std::to_string(inst.consecutive_failures) +
                 " in a row)");
}

Status NodeSupervisor::Poll(Clock::time_point now, std::vector<std::string>* log) {
  if (stopped_) return Status::Ok();
  while (std::optional<launcher::ExitedChild> exited = runner_->ReapExited()) {
    for (auto& [id, inst] : instances_) {
      auto it = std::find(inst.pids.begin(), inst.pids.end(), exited->pid);
      if (it == inst.pids.end()) continue;
      *it = 0;
      log->push_back(exited->name + " (pid " + std::to_string(exited->pid) + ") " +
                     launcher::DescribeWaitStatus(exited->wait_status));
      if (WIFEXITED(exited->wait_status) && WEXITSTATUS(exited->wait_status) == kWorkerUsageExit) {
        runner_->Stop(RunningPids(inst), ProcessRunner::Mode::kNow);
        std::fill(inst.pids.begin(), inst.pids.end(), 0);
        return Status::FailedPrecondition(
            exited->name + " refused its configuration or command line (exit status " +
            std::to_string(kWorkerUsageExit) + "); restarting it cannot help");
      }
      if (WIFEXITED(exited->wait_status) && WEXITSTATUS(exited->wait_status) == 0) {
        Released(inst, now, log);
      } else {
        Failed(inst, now, log);
      }
      break;
    }
  }
  for (auto& [id, inst] : instances_) {
    if (!inst.restart_at || now < *inst.restart_at) continue;
    if (Status s = StartInstance(inst, now); !s.ok()) {
      log->push_back("instance " + std::to_string(id) + " did not start: " + s.message());
      Failed(inst, now, log);
      continue;
    }
    log->push_back("instance " + std::to_string(id) + " restarted (start " +
                   std::to_string(inst.starts) + ")");
  }
  return Status::Ok();
}

void NodeSupervisor::Released(Instance& inst, Clock::time_point now,
                              std::vector<std::string>* log) {
  // Its other ranks were released too and are on their way out.
  runner_->Stop(RunningPids(inst), ProcessRunner::Mode::kNow);
  std::fill(inst.pids.begin(), inst.pids.end(), 0);
  inst.restart_at = now;
  log->push_back("instance " + std::to_string(inst.ranks[0].instance_id) +
                 " was released by the coordinator (drained); starting it again");
}

void NodeSupervisor::StopAll(ProcessRunner::Mode mode) {
  stopped_ = true;
  std::vector<pid_t> pids;
  for (auto& [id, inst] : instances_) {
    for (pid_t pid : RunningPids(inst)) pids.push_back(pid);
    std::fill(inst.pids.begin(), inst.pids.end(), 0);
    inst.restart_at.reset();
  }
  if (!pids.empty()) runner_->Stop(pids, mode);
}

std::vector<NodeSupervisor::InstanceStatus> NodeSupervisor::Instances() const {
  std::vector<InstanceStatus> out;
  for (const auto& [id, inst] : instances_) {
    InstanceStatus s;
    s.instance_id = id;
    s.pids = RunningPids(inst);
    s.running = !s.pids.empty();
    s.starts = inst.starts;
    s.consecutive_failures = inst.consecutive_failures;
    s.restart_at = inst.restart_at;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace headway::node
