#include "worker/worker_loop.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "comm/status_proto.h"

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

// Runs TransferPlans on one dedicated thread, one at a time in arrival
// order, so that a transfer (up to its timeout_ms) neither delays heartbeats
// nor holds back the StepResult of a prefill that finished meanwhile:
// compute and transfer overlap. Only the control thread touches the socket
// (ZeroMQ sockets are single-threaded), so results are handed back to it.
class TransferThread {
 public:
  TransferThread(KvSender& sender, int tp_rank)
      : sender_(sender), tp_rank_(tp_rank), thread_([this] { Run(); }) {}

  // Drops the plans still queued (the coordinator is going away or has
  // told this worker to stop) and waits for the one in progress, which its
  // timeout_ms bounds; its result is dropped too.
  ~TransferThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
      if (!queue_.empty()) {
        spdlog::warn("stopping with {} queued KV transfer(s) not started", queue_.size());
      }
      queue_.clear();
    }
    cv_.notify_all();
    thread_.join();
  }

  // True while a plan is queued or running or a result awaits TakeResults.
  bool pending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !queue_.empty() || running_ || !results_.empty();
  }

  void Enqueue(proto::TransferPlan plan) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({std::move(plan), Clock::now()});
    }
    cv_.notify_all();
  }

  // The results finished since the last call, in plan order.
  std::deque<proto::TransferResult> TakeResults() {
    std::lock_guard<std::mutex> lock(mu_);
    std::deque<proto::TransferResult> r;
    r.swap(results_);
    return r;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return quit_ || !queue_.empty(); });
      if (quit_) return;
      Queued queued = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      lock.unlock();
      proto::TransferResult result = sender_.Execute(queued.plan, tp_rank_, queued.received);
      lock.lock();
      running_ = false;
      results_.push_back(std::move(result));
    }
  }

  KvSender& sender_;
  const int tp_rank_;
  mutable std::mutex mu_;
  std::condition_variable cv_;                   // a plan or quit for the transfer thread
  struct Queued {
    proto::TransferPlan plan;
    Clock::time_point received;  // its timeout counts from here
  };
  std::deque<Queued> queue_;                     // guarded by mu_
  std::deque<proto::TransferResult> results_;    // guarded by mu_
  bool running_ = false;                         // guarded by mu_
  bool quit_ = false;                            // guarded by mu_
  std::thread thread_;
};

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

// How long a worker stopped by a signal waits for the coordinator's answer
// to its Leaving before it closes its socket.
constexpr std::chrono::milliseconds kLeavingAnswerWait(1000);

Status ServeSteps(ControlClient& client, StepExecutor& executor, ComputeThread& compute,
                  const WorkerLoopOptions& options) {
  // The step running on `compute` writes its result here; it is read once
  // compute.Wait says the step is done. Declared before `running`, which
  // waits for the step on the way out, so the step never outlives it.
  proto::StepResult step_result;
  // Waits for a step still running when ServeSteps returns.
  struct WaitOnExit {
    ComputeThread& compute;
    ~WaitOnExit() { compute.Wait(std::nullopt); }
  } running{compute};
  // Declared after `running`, so it stops first: on the way out a running
  // transfer finishes (bounded by its plan's timeout) and queued ones are
  // dropped.
  std::unique_ptr<TransferThread> transfers;
  if (options.kv_sender != nullptr) {
    transfers = std::make_unique<TransferThread>(*options.kv_sender, executor.tp_rank());
  }
  Clock::time_point last_received = Clock::now();
  Clock::time_point last_sent = Clock::now();
  const std::chrono::milliseconds poll(options.poll_interval_ms);
  // While a transfer is pending the loop turns over at least this often,
  // so its result goes out within about this long of being ready.
  const std::chrono::milliseconds transfer_poll(std::min(1, options.poll_interval_ms));
  std::optional<Clock::time_point> drain_sent;
  while (!Stopped(options)) {
    if (options.drain != nullptr && options.drain->load() && !drain_sent) {
      proto::Envelope out;
      out.mutable_drain_request()->set_reason("the worker is stopping (SIGTERM)");
      HW_RETURN_IF_ERROR(client.Send(out).WithContext("sending DrainRequest"));
      spdlog::info("asked the coordinator to drain this instance (at most {} ms)",
                   options.drain_timeout_ms);
      drain_sent = last_sent = Clock::now();
    }
    if (drain_sent &&
        MsSince(*drain_sent) > options.drain_timeout_ms + options.heartbeat_timeout_ms) {
      spdlog::warn("the coordinator did not release this worker {} ms after its DrainRequest; "
                   "leaving", MsSince(*drain_sent));
      return Status::Ok();
    }
    const bool transfer_pending = transfers != nullptr && transfers->pending();
    // While a step runs, wait on the compute thread (so its result goes out
    // the moment it is ready) and only peek at the socket; while a transfer
    // is pending, wait on the socket for transfer_poll at most.
    std::optional<proto::StepResult> result;
    if (compute.busy() &&
        compute.Wait(transfer_pending ? std::chrono::milliseconds(0) : poll)) {
      result = std::move(step_result);
    }
    std::chrono::milliseconds wait = poll;
    if (result || (compute.busy() && !transfer_pending)) {
      wait = std::chrono::milliseconds(0);
    } else if (transfer_pending) {
      wait = transfer_poll;
    }
    std::optional<proto::Envelope> in = client.Receive(wait);
    if (in) {
      last_received = Clock::now();
      if (in->has_step_plan()) {
        if (compute.busy()) {
          // The coordinator sends one plan at a time; a second one is a
          // protocol error, answered without touching the running step.
          proto::Envelope out;
          out.mutable_step_result()->set_step_id(in->step_plan().step_id());
          out.mutable_step_result()->set_tp_rank(executor.tp_rank());
          const Status overlap = Status::FailedPrecondition(
              "step " + std::to_string(in->step_plan().step_id()) +
              " arrived while another step was running");
          out.mutable_step_result()->set_error(overlap.message());
          out.mutable_step_result()->set_code(StatusCodeToProto(overlap.code()));
          spdlog::error("{}", out.step_result().error());
          HW_RETURN_IF_ERROR(client.Send(out).WithContext("sending StepResult"));
          last_sent = Clock::now();
        } else {
          // From here, so the compute thread's wake-up is the worker's time.
          const Clock::time_point start = Clock::now();
          compute.Start([&executor, &step_result, start,
                         plan = std::move(*in->mutable_step_plan())] {
            step_result = executor.Execute(plan);
            step_result.set_seconds(std::chrono::duration<double>(Clock::now() - start).count());
          });
        }
      } else if (in->has_transfer_plan()) {
        if (transfers != nullptr) {
          transfers->Enqueue(std::move(*in->mutable_transfer_plan()));
        } else {
          proto::Envelope out;
          out.mutable_transfer_result()->set_transfer_id(in->transfer_plan().transfer_id());
          out.mutable_transfer_result()->set_tp_rank(uint32_t(executor.tp_rank()));
          const Status disabled =
              Status::FailedPrecondition("KV transfer is not enabled on this worker");
          out.mutable_transfer_result()->set_error(disabled.message());
          out.mutable_transfer_result()->set_code(StatusCodeToProto(disabled.code()));
          spdlog::error("{}", out.transfer_result().error());
          HW_RETURN_IF_ERROR(client.Send(out).WithContext("sending TransferResult"));
          last_sent = Clock::now();
        }
      } else if (in->has_shutdown()) {
        if (options.on_shutdown) options.on_shutdown();
        if (in->shutdown().fault()) {
          return Status::Aborted("the coordinator removed this worker: " +
                                 in->shutdown().reason());
        }
        spdlog::info("coordinator asked to shut down: {}", in->shutdown().reason());
        return Status::Ok();
      }
      // Heartbeats only refresh last_received; anything else is ignored.
    } else if (MsSince(last_received) > options.heartbeat_timeout_ms) {
      if (drain_sent) {
        spdlog::warn("coordinator silent for {} ms while draining; leaving", MsSince(last_received));
        return Status::Ok();
      }
      return Status::Unavailable("coordinator silent for " +
                                 std::to_string(MsSince(last_received)) + " ms (timeout " +
                                 std::to_string(options.heartbeat_timeout_ms) + " ms)");
    }
    if (transfer_pending) {
      for (proto::TransferResult& done : transfers->TakeResults()) {
        if (!done.error().empty()) spdlog::error("{}", done.error());
        proto::Envelope out;
        *out.mutable_transfer_result() = std::move(done);
        HW_RETURN_IF_ERROR(client.Send(out).WithContext("sending TransferResult"));
        last_sent = Clock::now();
      }
    }
    if (result) {
      if (!result->error().empty()) {
        spdlog::error("step {} {}: {}", result->step_id(), result->fatal() ? "failed" : "rejected",
                      result->error());
      }
      const bool fatal = result->fatal();
      const std::string error = result->error();
      proto::Envelope out;
      *out.mutable_step_result() = std::move(*result);
      HW_RETURN_IF_ERROR(client.Send(out).WithContext("sending StepResult"));
      last_sent = Clock::now();
      if (fatal) return Status::Unavailable("the TP group is broken: " + error);
    }
    if (MsSince(last_sent) >= options.heartbeat_interval_ms) {
      proto::Envelope hb;
      hb.mutable_heartbeat()->set_sent_unix_ms(UnixMs());
      HW_RETURN_IF_ERROR(client.Send(hb).WithContext("sending Heartbeat"));
      last_sent = Clock::now();
    }
  }
  // Stopped by a signal: say so, so that the coordinator reports an orderly
  // stop rather than a lost worker, and wait (briefly) for the Shutdown that
  // answers it. The coordinator reads connection ends before messages
  // (comm/control_channel.h), so a socket closed at once could be seen
  // closed before the Leaving it carried. Best effort: the coordinator may
  // be gone.
  proto::Envelope leaving;
  leaving.mutable_leaving()->set_reason("the worker was stopped (SIGINT)");
  if (Status s = client.Send(leaving); !s.ok()) {
    spdlog::info("could not say goodbye: {}", s.message());
    return Status::Ok();
  }
  const Clock::time_point until = Clock::now() + kLeavingAnswerWait;
  while (Clock::now() < until) {
    std::optional<proto::Envelope> in = client.Receive(poll);
    if (in && in->has_shutdown()) break;
  }
  return Status::Ok();
}

}  // namespace headway
