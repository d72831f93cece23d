// The worker's side of the control protocol (DESIGN.md "Step protocol"):
// register with the coordinator, then serve StepPlans until told to stop.
#pragma once

#include <atomic>
#include <functional>

#include "comm/control_channel.h"
#include "common/status.h"
#include "proto/control.pb.h"
#include "worker/compute_thread.h"
#include "worker/kv_sender.h"
#include "worker/step_executor.h"

namespace headway {

struct WorkerLoopOptions {
  int heartbeat_interval_ms = 1000;  // send a Heartbeat after this long without sending
  int heartbeat_timeout_ms = 10000;  // give up after this long without hearing the coordinator
  int register_timeout_ms = 30000;   // wait this long for the RegisterResponse
  int poll_interval_ms = 50;         // how often the stop flag is looked at
  // Set (e.g. by a SIGINT handler) to stop cleanly: ServeSteps sends the
  // coordinator a Leaving message, waits up to a second for the Shutdown
  // that answers it, and returns; may be nullptr.
  const std::atomic<bool>* stop = nullptr;
  // Set (e.g. by a SIGTERM handler) to leave gracefully: ServeSteps sends
  // the coordinator one DrainRequest and serves on until its orderly
  // Shutdown, which comes once the instance's requests have ended (at most
  // drain_timeout_ms). May be nullptr.
  const std::atomic<bool>* drain = nullptr;
  int drain_timeout_ms = 25000;  // the coordinator's; this side waits a heartbeat timeout more
  // Called when the coordinator sends Shutdown, before ServeSteps waits for a
  // running step to end (which a stalled TP peer can delay until the
  // collective timeout); may be empty.
  std::function<void()> on_shutdown;
  // Executes TransferPlans (kv_transfer enabled); nullptr = answer them with
  // an error. Transfers run on a transfer thread of their own, one at a time
  // in arrival order, while the control thread keeps serving StepPlans and
  // heartbeats; each TransferResult is sent within about 1 ms of being
  // ready. On Shutdown or `stop`, ServeSteps waits for the transfer in
  // progress (bounded by its plan's timeout_ms) and drops queued ones
  // without answering them. Must outlive ServeSteps.
  KvSender* kv_sender = nullptr;
};

// Sends `request` and waits for the coordinator's RegisterResponse; other
// messages arriving first are dropped. Errors: FailedPrecondition carrying
// the coordinator's reason when refused; Unavailable when no answer comes
// within register_timeout_ms; Aborted when `stop` is set while waiting.
Status Register(ControlClient& client, const proto::RegisterRequest& request,
                const WorkerLoopOptions& options);

// Serves steps: each StepPlan is executed on `compute` (the thread that runs
// every kernel of this worker) and answered with its StepResult, while this
// thread keeps reading messages and sending heartbeats;
// each TransferPlan is queued for the transfer thread (see kv_sender) and
// answered with its TransferResult once done, in plan order; a Heartbeat
// goes out whenever nothing was sent for heartbeat_interval_ms.
// Returns OK on an orderly Shutdown message or when `stop` is set, and after
// a drain when the coordinator neither released this worker within
// drain_timeout_ms + heartbeat_timeout_ms nor was heard for
// heartbeat_timeout_ms (it was asked to leave: leaving is no failure); Aborted
// on a Shutdown for a fault (Shutdown.fault: the coordinator took the
// instance down); Unavailable when
// the coordinator stayed silent for heartbeat_timeout_ms (a dead
// coordinator must not leave workers behind) or a send fails; Unavailable
// after a step failed fatally (StepResult.fatal: a TP collective broke), once
// that result is sent.
// REQUIRES: !compute.busy(); `executor`'s model was created on `compute`.
// A step still running when it returns is waited for first.
Status ServeSteps(ControlClient& client, StepExecutor& executor, ComputeThread& compute,
                  const WorkerLoopOptions& options);

}  // namespace headway
