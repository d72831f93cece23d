// A fake Headway worker for tests and benchmarks of the real coordinator:
// one thread with a ZeroMQ DEALER that registers as one rank of an
// instance (rank 0 of TP 1 unless told otherwise; proto/control.proto), sends heartbeats, and answers every
// StepPlan at once (or after a set delay) with one sampled token for each
// sequence the plan asks to sample. Nothing is computed: the answer is
// always `token_id`, with logprob -0.25 and top logprobs token_id + k at
// -0.25 - k.
//
// With check_plans (the default) it also keeps every sequence's head-wise
// block table as the plans' deltas build it and records an error when a
// plan breaks the step protocol: a step_id that does not increase, is_new
// disagreeing with its state, a start_pos other than the positions computed
// so far, a delta that does not append at its row's end, a block id out of
// range or held by two sequences (other than a shared prefix-cache block),
// a row that does not cover the positions, a release of an unknown
// sequence. Without check_plans it only answers, so that a benchmark times
// the coordinator rather than the fake.
//
// Its death: destroying the object closes its control connection, as the
// kernel does for a killed process. It never exits on Shutdown (a real
// worker does): a later message gets it a second Shutdown.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/model_spec.h"

namespace headway::testing {

struct FakeWorkerOptions {
  std::string address;            // the coordinator's control address, e.g. tcp://127.0.0.1:5557
  ModelSpec spec;                 // registered as the instance's layers, KV heads, head_dim, vocab
  int instance_id = 0;
  // Registered as this rank of a TP group of tp_size (num_kv_heads must
  // divide by it: each rank registers its share). Only rank 0 returns tokens.
  int tp_rank = 0;
  int tp_size = 1;
  int32_t token_id = 0;           // answered for every sampled sequence
  int silent_after_plans = -1;    // >= 0: stop all traffic after this many plans
  int step_delay_ms = 0;          // simulated compute time per step
  int block_size = 16;            // registered block_size (positions per block)
  int num_blocks = 3000;          // registered KV pool size, blocks
  // Registered as every slot's KV cache dtype (sets the block bytes):
  // the deployment's cache.kv_cache_dtype, which the coordinator checks.
  KvCacheDtype kv_cache_dtype = Config().kv_cache_dtype;
  bool check_plans = true;        // false: answer only (see the file comment)
  // true: keep the time from each StepResult sent to the next StepPlan
  // received (TakeStepLatencies).
  bool record_step_latency = false;
  int heartbeat_interval_ms = 100;  // while not silent
  // Longest wait for a message before the thread looks at its stop and
  // drain flags again; each idle wait is a wake-up, which many idle fakes on
  // few cores feel. A message ends the wait at once.
  int poll_interval_ms = 10;
};

class FakeWorker {
 public:
  // Starts the worker's thread, which connects and registers at once.
  // Connection errors show in errors(). `options.spec` must be a loaded
  // model's (num_layers, num_kv_heads, head_dim, vocab_size > 0).
  explicit FakeWorker(FakeWorkerOptions options);
  // Stops and joins the thread; the control connection closes.
  ~FakeWorker();
  FakeWorker(const FakeWorker&) = delete;
  FakeWorker& operator=(const FakeWorker&) = delete;

  // Every accessor below is thread-safe.

  // Asks the thread to stop and returns at once (the destructor joins it):
  // many fakes stop within one poll_interval_ms instead of one each.
  void RequestStop();

  // The coordinator accepted the RegisterRequest.
  bool registered() const;
  // A Shutdown arrived; shutdown_fault() is the first Shutdown's fault flag.
  bool got_shutdown() const;
  bool shutdown_fault() const;
  // Sends a DrainRequest at the next loop iteration, as a worker does on SIGTERM.
  void RequestDrain();
  // Sends Leaving at the next loop iteration, waits for the Shutdown that
  // answers it and stops, as a worker does on SIGINT.
  void Leave();
  // Silent: sends nothing (no heartbeat, no StepResult) and ignores what comes.
  bool silent() const;
  void GoSilent();
  // StepPlans answered since the start.
  int64_t num_plans() const;
  // Tokens sampled (one per sequence with sample set) since the start.
  int64_t num_sampled_tokens() const;
  // The protocol errors found so far (check_plans), and connection errors.
  std::vector<std::string> errors() const;
  // Sequences the worker holds state for (0 without check_plans).
  size_t num_live_sequences() const;
  // With record_step_latency: the scheduling latencies recorded since the
  // previous call, in nanoseconds, in arrival order, and forgets them. One
  // latency is the steady-clock time from a StepResult's send returning to
  // the instance's next StepPlan being received; it includes this thread's
  // wake-up, so on an oversubscribed host it is an upper bound on the
  // coordinator's own share.
  std::vector<int64_t> TakeStepLatencies();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace headway::testing
