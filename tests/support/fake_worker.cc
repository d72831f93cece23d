#include "tests/support/fake_worker.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "comm/control_channel.h"

namespace headway::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

}  // namespace

struct FakeWorker::Impl {
  struct Seq {
    std::vector<std::vector<int32_t>> rows;  // [slot][logical]
    int num_positions = 0;
  };

  explicit Impl(FakeWorkerOptions o) : options(std::move(o)) {}

  void Error(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    errors.push_back(e);
  }

  void Run();
  proto::StepResult Answer(const proto::StepPlan& plan);
  // The check_plans bookkeeping of one plan; records what it breaks.
  void Check(const proto::StepPlan& plan);

  const FakeWorkerOptions options;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<bool> silent{false};
  std::atomic<bool> registered{false};
  std::atomic<bool> got_shutdown{false};
  std::atomic<bool> shutdown_fault{false};
  std::atomic<bool> drain{false};
  std::atomic<bool> leave{false};
  std::atomic<int64_t> num_plans{0};
  std::atomic<int64_t> num_sampled_tokens{0};
  mutable std::mutex mu;
  std::vector<std::string> errors;       // guarded by mu
  std::vector<int64_t> latencies_ns;     // guarded by mu
  std::map<uint64_t, Seq> seqs;          // guarded by mu
  std::map<int32_t, int> used_blocks;    // guarded by mu: block -> sequences holding it
  uint64_t last_step_id = 0;             // guarded by mu
};

void FakeWorker::Impl::Run() {
  auto client =
      ControlClient::Connect(options.address, PeerName(options.instance_id, options.tp_rank));
  if (!client.ok()) return Error(client.status().ToString());
  const ModelSpec& spec = options.spec;
  proto::Envelope reg;
  proto::RegisterRequest* r = reg.mutable_register_request();
  r->set_instance_id(uint32_t(options.instance_id));
  r->set_tp_rank(uint32_t(options.tp_rank));
  r->set_tp_size(uint32_t(options.tp_size));
  r->set_model_name(spec.name);
  r->set_num_layers(spec.num_layers);
  r->set_num_local_kv_heads(spec.num_kv_heads / options.tp_size);
  r->set_head_dim(spec.head_dim);
  r->set_block_size(options.block_size);
  r->set_kv_cache_dtype(KvCacheDtypeName(options.kv_cache_dtype));
  r->set_kv_cache_dtype_sliding(KvCacheDtypeName(options.kv_cache_dtype));
  r->set_block_bytes(
      KvCacheLayout{options.block_size, spec.head_dim, options.kv_cache_dtype}.BlockBytes());
  r->set_num_blocks(options.num_blocks);
  // One dtype: a chunk is a block (common/kv_arena.h).
  r->set_chunk_bytes(r->block_bytes());
  r->set_num_chunks(options.num_blocks);
  r->set_vocab_size(spec.vocab_size);
  r->set_pid(getpid());
  if (!(*client)->Send(reg).ok()) return Error("cannot send RegisterRequest");
  const milliseconds heartbeat_interval(options.heartbeat_interval_ms);
  const milliseconds poll_interval(options.poll_interval_ms);
  Clock::time_point last_sent = Clock::now();
  std::optional<Clock::time_point> result_sent;  // the last StepResult's, with record_step_latency
  while (!stop) {
    if (leave.exchange(false)) {
      proto::Envelope goodbye;
      goodbye.mutable_leaving()->set_reason("test");
      if (!(*client)->Send(goodbye).ok()) Error("cannot send Leaving");
      // As a worker does (worker_loop.cc): wait for the Shutdown answering
      // it, so that the coordinator reads Leaving before the socket closes.
      const Clock::time_point until = Clock::now() + milliseconds(5000);
      while (Clock::now() < until && !got_shutdown) {
        std::optional<proto::Envelope> in = (*client)->Receive(poll_interval);
        if (in && in->has_shutdown()) {
          shutdown_fault = in->shutdown().fault();
          got_shutdown = true;
        }
      }
      break;
    }
    if (drain.exchange(false)) {
      proto::Envelope request;
      request.mutable_drain_request()->set_reason("test");
      if (!(*client)->Send(request).ok()) Error("cannot send DrainRequest");
    }
    if (!silent && Clock::now() - last_sent > heartbeat_interval) {
      proto::Envelope hb;
      hb.mutable_heartbeat()->set_sent_unix_ms(0);
      (void)(*client)->Send(hb);
      last_sent = Clock::now();
    }
    std::optional<proto::Envelope> env = (*client)->Receive(poll_interval);
    if (!env || silent) continue;
    if (env->has_register_response()) {
      if (!env->register_response().accepted()) Error("rejected: " + env->register_response().error());
      registered = env->register_response().accepted();
    } else if (env->has_shutdown()) {
      if (!got_shutdown) shutdown_fault = env->shutdown().fault();
      got_shutdown = true;
    } else if (env->has_step_plan()) {
      if (result_sent) {
        const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               Clock::now() - *result_sent).count();
        std::lock_guard<std::mutex> lock(mu);
        latencies_ns.push_back(ns);
      }
      if (options.silent_after_plans >= 0 && num_plans >= options.silent_after_plans) {
        silent = true;
        continue;
      }
      ++num_plans;
      if (options.step_delay_ms > 0) std::this_thread::sleep_for(milliseconds(options.step_delay_ms));
      proto::Envelope reply;
      *reply.mutable_step_result() = Answer(env->step_plan());
      if (!(*client)->Send(reply).ok()) Error("cannot send StepResult");
      last_sent = Clock::now();
      if (options.record_step_latency) result_sent = last_sent;
    }
  }
}

proto::StepResult FakeWorker::Impl::Answer(const proto::StepPlan& plan) {
  if (options.check_plans) Check(plan);
  proto::StepResult result;
  result.set_step_id(plan.step_id());
  result.set_tp_rank(uint32_t(options.tp_rank));
  if (options.tp_rank != 0) return result;  // rank 0 samples
  for (const proto::SequenceStep& step : plan.seqs()) {
    if (!step.sample()) continue;
    proto::SampledToken* t = result.add_tokens();
    t->set_seq_id(step.seq_id());
    t->set_token_id(options.token_id);
    t->set_logprob(-0.25f);
    for (int k = 0; k < int(step.sampling().num_logprobs()); ++k) {
      proto::TopLogprob* top = t->add_top_logprobs();
      top->set_token_id(options.token_id + k);
      top->set_logprob(-0.25f - k);
    }
  }
  num_sampled_tokens += result.tokens_size();
  return result;
}

void FakeWorker::Impl::Check(const proto::StepPlan& plan) {
  std::lock_guard<std::mutex> lock(mu);
  auto error = [&](const std::string& e) {
    errors.push_back("step " + std::to_string(plan.step_id()) + ": " + e);
  };
  if (plan.step_id() <= last_step_id) error("step_id did not increase");
  last_step_id = plan.step_id();
  for (uint64_t id : plan.released_seq_ids()) {
    auto it = seqs.find(id);
    if (it == seqs.end()) {
      error("release of unknown sequence " + std::to_string(id));
      continue;
    }
    for (const auto& row : it->second.rows) {
      for (int32_t b : row) {
        if (--used_blocks[b] == 0) used_blocks.erase(b);
      }
    }
    seqs.erase(it);
  }
  const int block_size = options.block_size;
  const int num_slots = options.spec.num_layers * (options.spec.num_kv_heads / options.tp_size);
  for (const proto::SequenceStep& step : plan.seqs()) {
    std::string who = "seq " + std::to_string(step.seq_id()) + ": ";
    bool known = seqs.count(step.seq_id()) > 0;
    if (step.is_new() == known) error(who + "is_new disagrees with the worker's state");
    Seq& seq = seqs[step.seq_id()];
    if (seq.rows.empty()) seq.rows.resize(num_slots);
    // A prefix-cache hit: a new sequence starts after its cached positions,
    // whose full blocks it may share with live sequences.
    const int num_cached = step.is_new() ? int(step.start_pos()) : 0;
    if (step.is_new() && num_cached % block_size != 0) error(who + "cached prefix is not whole blocks");
    if (step.is_new()) seq.num_positions = num_cached;
    if (int(step.start_pos()) != seq.num_positions) {
      error(who + "start_pos " + std::to_string(step.start_pos()) + " but " +
            std::to_string(seq.num_positions) + " computed");
    }
    if (step.token_ids().empty()) error(who + "no tokens");
    for (const proto::SlotDelta& d : step.deltas()) {
      if (int(d.slot()) >= num_slots) {
        error(who + "slot out of range");
        continue;
      }
      auto& row = seq.rows[d.slot()];
      if (d.first_logical() != row.size()) error(who + "delta does not append at the row's end");
      for (int32_t b : d.appended()) {
        if (b < 0 || b >= options.num_blocks) error(who + "block id out of range");
        bool shared_prefix = int(row.size() + 1) * block_size <= num_cached;
        if (used_blocks[b]++ > 0 && !shared_prefix) {
          error(who + "block " + std::to_string(b) + " already in use");
        }
        row.push_back(b);
      }
    }
    seq.num_positions = int(step.start_pos()) + step.token_ids_size();
    for (const auto& row : seq.rows) {
      if (int(row.size()) * block_size < seq.num_positions) error(who + "row does not cover the positions");
    }
  }
}

FakeWorker::FakeWorker(FakeWorkerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {
  impl_->thread = std::thread([impl = impl_.get()] { impl->Run(); });
}

FakeWorker::~FakeWorker() {
  impl_->stop = true;
  impl_->thread.join();
}

void FakeWorker::RequestStop() { impl_->stop = true; }
bool FakeWorker::registered() const { return impl_->registered; }
bool FakeWorker::got_shutdown() const { return impl_->got_shutdown; }
bool FakeWorker::shutdown_fault() const { return impl_->shutdown_fault; }
void FakeWorker::RequestDrain() { impl_->drain = true; }
void FakeWorker::Leave() { impl_->leave = true; }
bool FakeWorker::silent() const { return impl_->silent; }
void FakeWorker::GoSilent() { impl_->silent = true; }
int64_t FakeWorker::num_plans() const { return impl_->num_plans; }
int64_t FakeWorker::num_sampled_tokens() const { return impl_->num_sampled_tokens; }

std::vector<std::string> FakeWorker::errors() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->errors;
}

size_t FakeWorker::num_live_sequences() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->seqs.size();
}

std::vector<int64_t> FakeWorker::TakeStepLatencies() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<int64_t> out;
  out.swap(impl_->latencies_ns);
  return out;
}

}  // namespace headway::testing
