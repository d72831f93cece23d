// Worker step micro-benchmark on the real model, in process (no ZeroMQ):
// one sequence is prefilled with a --prompt-tokens prompt, then decoded for
// --decode-tokens steps through StepExecutor (greedy). Each of --runs runs
// uses a fresh executor; figures are medians over runs. Prints one JSON
// object: decode tokens/s (1 / median step time), median and p90 decode step
// milliseconds, prefill tokens/s.
//
//   headway-worker-step-bench --model PATH [--threads 2] [--runs 3]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/gguf.h"
#include "common/model_spec.h"
#include "kernels/threads.h"
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

// Appends a step for seq 1 with fresh blocks for every slot as it grows.
void AddStep(const LlamaModel& model, proto::StepPlan* plan, const std::vector<int32_t>& tokens,
             uint32_t start_pos, int* have_blocks, int* next_block) {
  proto::SequenceStep* s = plan->add_seqs();
  s->set_seq_id(1);
  s->set_is_new(start_pos == 0);
  s->set_start_pos(start_pos);
  s->set_sample(true);
  for (int32_t t : tokens) s->add_token_ids(t);
  const int need = int((start_pos + tokens.size() + kBlockSize - 1) / kBlockSize);
  if (need > *have_blocks) {
    for (int slot = 0; slot < model.num_slots(); ++slot) {
      proto::SlotDelta* d = s->add_deltas();
      d->set_slot(slot);
      d->set_first_logical(*have_blocks);
      for (int i = *have_blocks; i < need; ++i) d->add_appended((*next_block)++);
    }
    *have_blocks = need;
  }
}

int Run(const std::string& model_path, int threads, int runs, int prompt_tokens,
        int decode_tokens) {
  cpu::SetNumThreads(threads);
  auto file = GgufFile::Open(model_path);
  if (!file.ok()) return std::fprintf(stderr, "%s\n", file.status().ToString().c_str()), 1;
  auto spec = LoadModelSpec(**file);
  if (!spec.ok()) return std::fprintf(stderr, "%s\n", spec.status().ToString().c_str()), 1;
  auto weights = ModelWeights::Load(**file, *spec, ShardForRank(*spec, 1, 0));
  if (!weights.ok()) return std::fprintf(stderr, "%s\n", weights.status().ToString().c_str()), 1;
  auto model = LlamaModel::Create(*spec, std::move(*weights));
  if (!model.ok()) return std::fprintf(stderr, "%s\n", model.status().ToString().c_str()), 1;

  std::vector<double> step_seconds, prefill_seconds;
  for (int r = 0; r < runs; ++r) {
    auto pool = KvPool::Create({kBlockSize, spec->head_dim}, int64_t(64) << 20);
    if (!pool.ok()) return std::fprintf(stderr, "%s\n", pool.status().ToString().c_str()), 1;
    StepExecutor executor(model->get(), pool->get(), StepExecutorOptions{});
    int have = 0, next = 0;
    uint64_t step_id = 0;
    std::vector<int32_t> prompt(prompt_tokens);
    for (int i = 0; i < prompt_tokens; ++i) prompt[i] = 100 + 37 * i % 4000;
    proto::StepPlan plan;
    plan.set_step_id(++step_id);
    AddStep(**model, &plan, prompt, 0, &have, &next);
    auto t0 = std::chrono::steady_clock::now();
    proto::StepResult res = executor.Execute(plan);
    prefill_seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    uint32_t pos = uint32_t(prompt_tokens);
    for (int i = 0; i < decode_tokens && res.error().empty(); ++i) {
      proto::StepPlan p;
      p.set_step_id(++step_id);
      AddStep(**model, &p, {res.tokens(0).token_id()}, pos++, &have, &next);
      t0 = std::chrono::steady_clock::now();
      res = executor.Execute(p);
      step_seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (!res.error().empty()) return std::fprintf(stderr, "%s\n", res.error().c_str()), 1;
  }
  const double step_ms = 1e3 * Median(step_seconds);
  std::printf(
      "{\"model\": \"%s\", \"threads\": %d, \"runs\": %d, \"prompt_tokens\": %d, "
      "\"decode_tokens\": %d, \"decode_tokens_per_s\": %.2f, \"decode_step_ms_median\": %.2f, "
      "\"decode_step_ms_p90\": %.2f, \"prefill_tokens_per_s\": %.1f}\n",
      spec->name.c_str(), threads, runs, prompt_tokens, decode_tokens, 1e3 / step_ms, step_ms,
      1e3 * Percentile(step_seconds, 0.9), prompt_tokens / Median(prefill_seconds));
  return 0;
}

}  // namespace
}  // namespace headway

int main(int argc, char** argv) {
  const char* home = std::getenv("HOME");
  const char* dir = std::getenv("HEADWAY_MODEL_DIR");
  std::string model = std::string(dir ? dir : std::string(home ? home : "") +
                                                  "/.cache/headway/models") +
                      "/SmolLM2-135M-Instruct.Q4_1.gguf";
  int threads = 2, runs = 3, prompt_tokens = 32, decode_tokens = 32;
  CLI::App app{"Worker step benchmark (decode tokens/s of one sequence)"};
  app.add_option("--model", model, "GGUF path");
  app.add_option("--threads", threads, "OpenMP and OpenBLAS threads");
  app.add_option("--runs", runs, "runs (fresh executor each)");
  app.add_option("--prompt-tokens", prompt_tokens, "prompt length");
  app.add_option("--decode-tokens", decode_tokens, "decode steps per run");
  CLI11_PARSE(app, argc, argv);
  return headway::Run(model, threads, runs, prompt_tokens, decode_tokens);
}
