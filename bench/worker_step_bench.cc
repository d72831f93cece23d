// Worker step micro-benchmark on the real model, in process (no ZeroMQ):
// --batch sequences (default 1) are each prefilled with a --prompt-tokens
// prompt (the first prefill is timed), then decoded together for
// --decode-tokens steps through StepExecutor (tokens fed are fixed, so every
// rank sees the same ones); decode_tokens_per_s = batch / median step. Each of --runs runs uses a fresh executor;
// figures are medians over runs.
//
// With --tp 1,3 and --collective shm,gloo it measures every combination in
// one invocation: each TP rank is a forked process with its own weights
// shard, KV pool and communicator (rendezvous through this process), as in a
// deployment. Rank 0 reports the time its collectives took per decode step
// (all-reduces and the logits gather, waiting for slower ranks included) and
// their share of the step. Prints one JSON object with one entry per
// configuration and the decode-throughput ratios against TP 1.
//
// With --kv-cache-dtypes float32,q8_0 it measures each KV cache dtype too
// (common/kv_layout.h), every configuration with each.
//
//   headway-worker-step-bench --model PATH [--threads 2] [--runs 3]
//       [--batch 1] [--tp 1,3] [--collective shm,gloo]
//       [--kv-cache-dtypes float32,float16,q8_0,q4_0]

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/kv_dtype_flags.h"
#include "comm/communicator.h"
#include "common/gguf.h"
#include "common/model_spec.h"
#include "kernels/threads.h"
#include "worker/decoder_model.h"
#include "worker/step_executor.h"

namespace headway {
namespace {

constexpr int kBlockSize = 16;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * v.size()))];
}

// One sequence's block bookkeeping: blocks held per slot so far.
struct SeqBlocks {
  uint64_t seq_id = 1;
  int have_blocks = 0;
};

// Appends a step for `seq` with fresh blocks for every slot as it grows.
void AddStep(const DecoderModel& model, proto::StepPlan* plan, const std::vector<int32_t>& tokens,
             uint32_t start_pos, SeqBlocks* seq, int* next_block) {
  proto::SequenceStep* s = plan->add_seqs();
  s->set_seq_id(seq->seq_id);
  s->set_is_new(start_pos == 0);
  s->set_start_pos(start_pos);
  s->set_sample(true);
  for (int32_t t : tokens) s->add_token_ids(t);
  const int need = int((start_pos + tokens.size() + kBlockSize - 1) / kBlockSize);
  if (need > seq->have_blocks) {
    for (int slot = 0; slot < model.num_slots(); ++slot) {
      proto::SlotDelta* d = s->add_deltas();
      d->set_slot(slot);
      d->set_first_logical(seq->have_blocks);
      for (int i = seq->have_blocks; i < need; ++i) d->add_appended((*next_block)++);
    }
    seq->have_blocks = need;
  }
}

struct BenchConfig {
  std::string model_path;
  int threads = 2;  // per rank
  int runs = 3;
  int prompt_tokens = 32;
  int decode_tokens = 32;
  int batch = 1;  // sequences decoded together
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kFloat32;
};

struct RankFigures {
  std::vector<double> step_seconds, prefill_seconds, collective_step_seconds;
};

// Enough KV memory for every sequence's prompt and decode tokens, at least 64 MiB.
int64_t PoolBytes(const BenchConfig& c, const ModelSpec& spec) {
  const int64_t blocks_per_slot = (c.prompt_tokens + c.decode_tokens) / kBlockSize + 2;
  const int64_t block_bytes =
      int64_t(KvCacheLayout{kBlockSize, spec.head_dim, c.kv_cache_dtype}.BlockBytes());
  const int64_t need = int64_t(c.batch) * spec.num_layers * spec.num_kv_heads * blocks_per_slot *
                       block_bytes;
  return std::max(need + (int64_t(8) << 20), int64_t(64) << 20);
}

Status RunRank(const BenchConfig& c, int tp, int rank, Communicator* comm, RankFigures* out) {
  cpu::SetNumThreads(c.threads);
  HW_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(c.model_path));
  HW_ASSIGN_OR_RETURN(ModelSpec spec, LoadModelSpec(*file));
  HW_RETURN_IF_ERROR(ValidateTpSize(spec, tp));
  HW_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights,
                      ModelWeights::Load(*file, spec, ShardForRank(spec, tp, rank)));
  HW_ASSIGN_OR_RETURN(std::unique_ptr<DecoderModel> model,
                      DecoderModel::Create(spec, std::move(weights), comm));
  for (int r = 0; r < c.runs; ++r) {
    HW_ASSIGN_OR_RETURN(std::unique_ptr<KvPool> pool,
                        KvPool::Create({kBlockSize, spec.head_dim, c.kv_cache_dtype},
                                       PoolBytes(c, spec)));
    StepExecutorOptions options;
    options.tp_rank = rank;
    StepExecutor executor(model.get(), pool.get(), options);
    int next = 0;
    uint64_t step_id = 0;
    std::vector<SeqBlocks> seqs(size_t(c.batch));
    for (int b = 0; b < c.batch; ++b) seqs[size_t(b)].seq_id = uint64_t(b + 1);
    proto::StepResult res;
    // Each sequence's prompt in a step of its own; the first one is timed.
    for (int b = 0; b < c.batch && res.error().empty(); ++b) {
      std::vector<int32_t> prompt(c.prompt_tokens);
      for (int i = 0; i < c.prompt_tokens; ++i) prompt[i] = 100 + (37 * i + 11 * b) % 4000;
      proto::StepPlan plan;
      plan.set_step_id(++step_id);
      AddStep(*model, &plan, prompt, 0, &seqs[size_t(b)], &next);
      auto t0 = std::chrono::steady_clock::now();
      res = executor.Execute(plan);
      if (b == 0) {
        out->prefill_seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    uint32_t pos = uint32_t(c.prompt_tokens);
    for (int i = 0; i < c.decode_tokens && res.error().empty(); ++i) {
      proto::StepPlan p;
      p.set_step_id(++step_id);
      for (SeqBlocks& seq : seqs) AddStep(*model, &p, {int32_t(200 + 7 * i)}, pos, &seq, &next);
      ++pos;
      const double collective_before = model->collective_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      res = executor.Execute(p);
      out->step_seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      out->collective_step_seconds.push_back(model->collective_seconds() - collective_before);
    }
    if (!res.error().empty()) return Status::Internal(res.error());
  }
  return Status::Ok();
}

// Runs one configuration, every rank a forked process; returns rank 0's
// figures as a JSON object (or an "error" member).
std::string RunConfig(const BenchConfig& c, int tp, const std::string& collective) {
  std::unique_ptr<RendezvousStore> store = NewInMemoryStore();
  std::vector<pid_t> pids;
  std::vector<std::thread> servers;
  int result_pipe[2];
  if (pipe(result_pipe) != 0) return "{\"error\": \"pipe failed\"}";
  for (int rank = 0; rank < tp; ++rank) {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return "{\"error\": \"socketpair failed\"}";
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      close(result_pipe[0]);
      std::unique_ptr<Communicator> comm;
      if (tp > 1) {
        std::unique_ptr<RendezvousStore> client = NewSocketStoreClient(fds[1]);
        CommunicatorOptions o;
        o.backend = collective;
        o.rank = rank;
        o.size = tp;
        o.key_prefix = "bench";
        Result<std::unique_ptr<Communicator>> created = CreateCommunicator(o, *client);
        if (!created.ok()) {
          std::fprintf(stderr, "rank %d: %s\n", rank, created.status().ToString().c_str());
          _exit(1);
        }
        comm = std::move(*created);
      }
      RankFigures f;
      Status s = RunRank(c, tp, rank, comm.get(), &f);
      if (rank == 0) {
        std::string json;
        if (!s.ok()) {
          json = "{\"error\": \"" + s.message() + "\"}";
        } else {
          const double step = Median(f.step_seconds);
          const double coll = Median(f.collective_step_seconds);
          char buf[512];
          std::snprintf(buf, sizeof buf,
                        "{\"tp_size\": %d, \"collective\": \"%s\", \"threads_per_rank\": %d, "
                        "\"batch\": %d, \"kv_cache_dtype\": \"%s\", "
                        "\"decode_tokens_per_s\": %.2f, \"decode_step_ms_median\": %.3f, "
                        "\"decode_step_ms_p90\": %.3f, \"collective_ms_per_step_median\": %.3f, "
                        "\"collective_share_of_step\": %.3f, \"prefill_tokens_per_s\": %.1f}",
                        tp, tp > 1 ? collective.c_str() : "none", c.threads, c.batch,
                        KvCacheDtypeName(c.kv_cache_dtype),
                        c.batch / step,
                        1e3 * step, 1e3 * Percentile(f.step_seconds, 0.9), 1e3 * coll,
                        coll / step, c.prompt_tokens / Median(f.prefill_seconds));
          json = buf;
        }
        if (write(result_pipe[1], json.data(), json.size()) < 0) _exit(1);
      } else if (!s.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
      }
      _exit(s.ok() ? 0 : 1);
    }
    close(fds[1]);
    pids.push_back(pid);
    servers.emplace_back([&store, fd = fds[0]] {
      (void)ServeRendezvousStore(*store, fd);
      close(fd);
    });
  }
  close(result_pipe[1]);
  std::string json;
  char buf[4096];
  ssize_t n;
  while ((n = read(result_pipe[0], buf, sizeof buf)) > 0) json.append(buf, size_t(n));
  close(result_pipe[0]);
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  for (std::thread& t : servers) t.join();
  return json.empty() ? "{\"error\": \"rank 0 reported nothing\"}" : json;
}

int Run(const BenchConfig& base, int total_threads, const std::vector<int>& tp_sizes,
        const std::vector<std::string>& collectives, const std::vector<KvCacheDtype>& dtypes) {
  signal(SIGPIPE, SIG_IGN);
  std::string entries;
  for (int tp : tp_sizes) {
    for (const std::string& collective : collectives) {
      for (KvCacheDtype dtype : dtypes) {
        BenchConfig c = base;
        c.threads = std::max(1, total_threads / tp);
        c.kv_cache_dtype = dtype;
        entries += (entries.empty() ? "" : ",\n  ") + RunConfig(c, tp, collective);
      }
      if (tp == 1) break;  // no collectives to vary
    }
  }
  std::printf("{\"model\": \"%s\", \"total_threads\": %d, \"runs\": %d, \"prompt_tokens\": %d, "
              "\"decode_tokens\": %d,\n \"configs\": [\n  %s]}\n",
              base.model_path.c_str(), total_threads, base.runs, base.prompt_tokens,
              base.decode_tokens, entries.c_str());
  return 0;
}

}  // namespace
}  // namespace headway

int main(int argc, char** argv) {
  const char* home = std::getenv("HOME");
  const char* dir = std::getenv("HEADWAY_MODEL_DIR");
  headway::BenchConfig c;
  c.model_path = std::string(dir ? dir : std::string(home ? home : "") +
                                             "/.cache/headway/models") +
                 "/SmolLM2-135M-Instruct.Q4_1.gguf";
  int threads = 2;
  std::vector<int> tp_sizes = {1};
  std::vector<std::string> collectives = {"shm"};
  CLI::App app{"Worker step benchmark (decode tokens/s of one sequence, TP 1 and TP N)"};
  app.add_option("--model", c.model_path, "GGUF path");
  app.add_option("--threads", threads, "compute threads in all (split over the TP ranks)");
  app.add_option("--runs", c.runs, "runs (fresh executor each)");
  app.add_option("--prompt-tokens", c.prompt_tokens, "prompt length");
  app.add_option("--decode-tokens", c.decode_tokens, "decode steps per run");
  app.add_option("--batch", c.batch, "sequences decoded together (each prefilled first)")
      ->check(CLI::Range(1, 256));
  app.add_option("--tp", tp_sizes, "TP sizes to measure, e.g. 1,3")->delimiter(',');
  app.add_option("--collective", collectives, "backends for TP > 1: shm, gloo")->delimiter(',');
  std::vector<std::string> dtype_names = {"float32"};
  app.add_option("--kv-cache-dtypes", dtype_names, "KV cache dtypes, e.g. float32,q8_0")
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  const std::optional<std::vector<headway::KvCacheDtype>> parsed =
      headway::bench::ParseKvCacheDtypeFlag(dtype_names);
  if (!parsed) return 2;
  const std::vector<headway::KvCacheDtype>& dtypes = *parsed;
  return headway::Run(c, threads, tp_sizes, collectives, dtypes);
}
