#include "worker/worker_loop.h"

#include <chrono>
#include <string>

#include <spdlog/spdlog.h>

namespace headway {
namespace {

using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

bool Stopped(const WorkerLoopOptions& options) {
  return options.stop != nullptr && options.stop->load();
}

uint64_t UnixMs() {
  return uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count());
}

}  // namespace

Status Register(ControlClient& client, const proto::RegisterRequest& request,
                const WorkerLoopOptions& options) {
  proto::Envelope env;
  *env.mutable_register_request() = request;
  HW_RETURN_IF_ERROR(client.Send(env).WithContext("sending RegisterRequest"));
  const Clock::time_point start = Clock::now();
  while (MsSince(start) < options.register_timeout_ms) {
    if (Stopped(options)) return Status::Aborted("stopped while waiting for registration");
    std::optional<proto::Envelope> in =
        client.Receive(std::chrono::milliseconds(options.poll_interval_ms));
    if (!in) continue;
    if (in->has_register_response()) {
      if (!in->register_response().accepted()) {
        return Status::FailedPrecondition("coordinator refused registration: " +
                                          in->register_response().error());
      }
      return Status::Ok();
    }
    if (in->has_shutdown()) {
      return Status::Aborted("coordinator sent Shutdown before registering: " +
                             in->shutdown().reason());
    }
    spdlog::debug("dropping a message received before RegisterResponse");
  }
  return Status::Unavailable("no RegisterResponse from the coordinator within " +
                             std::to_string(options.register_timeout_ms) + " ms");
}

Status ServeSteps(ControlClient& client, StepExecutor& executor,
                  const WorkerLoopOptions& options) {
  Clock::time_point last_received = Clock::now();
  Clock::time_point last_sent = Clock::now();
  while (!Stopped(options)) {
    std::optional<proto::Envelope> in =
        client.Receive(std::chrono::milliseconds(options.poll_interval_ms));
    if (in) {
      last_received = Clock::now();
      if (in->has_step_plan()) {
        proto::Envelope out;
        *out.mutable_step_result() = executor.Execute(in->step_plan());
        if (!out.step_result().error().empty()) {
          spdlog::error("step {} rejected: {}", in->step_plan().step_id(),
                        out.step_result().error());
        }
        HW_RETURN_IF_ERROR(client.Send(out).WithContext("sending StepResult"));
        // Time spent computing is not the coordinator's silence.
        last_sent = last_received = Clock::now();
      } else if (in->has_shutdown()) {
        spdlog::info("coordinator asked to shut down: {}", in->shutdown().reason());
        return Status::Ok();
      }
      // Heartbeats only refresh last_received; anything else is ignored.
    } else if (MsSince(last_received) > options.heartbeat_timeout_ms) {
      return Status::Unavailable("coordinator silent for " +
                                 std::to_string(MsSince(last_received)) + " ms (timeout " +
                                 std::to_string(options.heartbeat_timeout_ms) + " ms)");
    }
    if (MsSince(last_sent) >= options.heartbeat_interval_ms) {
      proto::Envelope hb;
      hb.mutable_heartbeat()->set_sent_unix_ms(UnixMs());
      HW_RETURN_IF_ERROR(client.Send(hb).WithContext("sending Heartbeat"));
      last_sent = Clock::now();
    }
  }
  return Status::Ok();
}

}  // namespace headway
