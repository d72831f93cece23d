// Greedy token selection and top log-probabilities on a CUDA device, one CTA
// per row of logits. Candidates are (value, id) pairs ranked by value, then
// by lower id (cpu::Sample's tie rule); id -1 marks "no candidate".
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/sampling.h"

namespace headway::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
static_assert(kThreads % 32 == 0 && kThreads <= 1024);
constexpr int kMaxTop = 32;  // TopLogprobs' largest k (kernels/cuda/sampling.h)

struct Candidate {
  float value;
  int32_t id;  // -1: none
};

// True when a ranks strictly before b. A real candidate beats none.
__device__ __forceinline__ bool Better(Candidate a, Candidate b) {
  if (a.id < 0) return false;
  if (b.id < 0) return true;
  return a.value > b.value || (a.value == b.value && a.id < b.id);
}

// The best candidate of the CTA, in every thread. `scratch` [kWarps].
__device__ Candidate BlockBest(Candidate c, Candidate* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) {
    Candidate other;
    other.value = __shfl_xor_sync(0xffffffffu, c.value, offset);
    other.id = __shfl_xor_sync(0xffffffffu, c.id, offset);
    if (Better(other, c)) c = other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = c;
  __syncthreads();
  Candidate best = scratch[0];
  for (int w = 1; w < kWarps; ++w) {
    if (Better(scratch[w], best)) best = scratch[w];
  }
  __syncthreads();
  return best;
}


// log(sum(exp(row - max_value))) for the row's maximum `max_value` (finite):
// a logit's log-probability is then (logit - max_value) - this, which keeps
// f32 precision where max_value + log(sum) would round at large logits.
__device__ float ShiftedLogSumExp(const float* row, int vocab, float max_value, float* scratch) {
  float sum = 0.0f;
  for (int v = threadIdx.x; v < vocab; v += kThreads) sum += expf(row[v] - max_value);
  return logf(BlockSum<kWarps>(sum, scratch));
}

// The best finite-or-+inf logit of the row: -inf (and NaN) never qualify.
__device__ Candidate RowArgmax(const float* row, int vocab, Candidate* scratch) {
  Candidate c{-INFINITY, -1};
  for (int v = threadIdx.x; v < vocab; v += kThreads) {
    const float x = row[v];
    if (x > c.value) c = Candidate{x, v};  // ascending ids: strict > keeps the lowest
  }
  return BlockBest(c, scratch);
}

__global__ void __launch_bounds__(kThreads)
    GreedySampleKernel(const float* logits, int vocab, int32_t* token, float* logprob) {
  __shared__ Candidate best_scratch[kWarps];
  __shared__ float sum_scratch[kWarps];
  const float* row = logits + size_t(blockIdx.x) * vocab;
  const Candidate best = RowArgmax(row, vocab, best_scratch);
  if (best.id < 0) {  // every logit is -inf
    if (threadIdx.x == 0) {
      token[blockIdx.x] = -1;
      logprob[blockIdx.x] = -INFINITY;
    }
    return;  // uniform across the CTA: no barrier is skipped by part of it
  }
  const float log_sum = ShiftedLogSumExp(row, vocab, best.value, sum_scratch);
  if (threadIdx.x == 0) {
    token[blockIdx.x] = best.id;
    logprob[blockIdx.x] = -log_sum;  // (best - max) - log_sum with best == max
  }
}

// k rounds of a block-wide selection, each over the candidates ranked after
// the previous pick: O(k * vocab) reads of a row that stays in L2, simple
// and exact in its tie rule. -inf logits rank after all finite ones (by id),
// as in a full sort; NaN never qualifies.
__global__ void __launch_bounds__(kThreads)
    TopLogprobsKernel(const float* logits, int vocab, int k, int32_t* ids, float* logprobs) {
  __shared__ Candidate best_scratch[kWarps];
  __shared__ float sum_scratch[kWarps];
  const float* row = logits + size_t(blockIdx.x) * vocab;
  int32_t* out_ids = ids + size_t(blockIdx.x) * k;
  float* out_lp = logprobs + size_t(blockIdx.x) * k;

  const Candidate top = RowArgmax(row, vocab, best_scratch);
  const float log_sum = top.id < 0 ? 0.0f : ShiftedLogSumExp(row, vocab, top.value, sum_scratch);

  Candidate prev{0.0f, -1};
  for (int t = 0; t < k; ++t) {
    Candidate c{-INFINITY, -1};
    for (int v = threadIdx.x; v < vocab; v += kThreads) {
      const Candidate cand{row[v], v};
      if (cand.value != cand.value) continue;             // NaN
      if (prev.id >= 0 && !Better(prev, cand)) continue;  // already taken
      if (Better(cand, c)) c = cand;
    }
    const Candidate best = BlockBest(c, best_scratch);
    if (threadIdx.x == 0) {
      out_ids[t] = best.id;
      // A row of only -inf gives -inf log-probabilities (not NaN).
      out_lp[t] = best.id < 0 || top.id < 0 ? -INFINITY : (best.value - top.value) - log_sum;
    }
    prev = best;
    if (best.id < 0) {
      // Fewer than k candidates: the rest are empty. Uniform across the CTA.
      for (int r = t + 1 + int(threadIdx.x); r < k; r += kThreads) {
        out_ids[r] = -1;
        out_lp[r] = -INFINITY;
      }
      return;
    }
  }
}

}  // namespace

void GreedySample(const float* logits, int rows, int vocab, int32_t* token, float* logprob,
                  Stream stream) {
  if (rows <= 0) return;
  if (vocab < 0) vocab = 0;  // every row then gets token -1
  GreedySampleKernel<<<rows, kThreads, 0, stream>>>(logits, vocab, token, logprob);
}

void TopLogprobs(const float* logits, int rows, int vocab, int k, int32_t* ids, float* logprobs,
                 Stream stream) {
  if (rows <= 0 || k < 1 || k > kMaxTop) return;
  if (vocab < 0) vocab = 0;
  TopLogprobsKernel<<<rows, kThreads, 0, stream>>>(logits, vocab, k, ids, logprobs);
}

}  // namespace headway::cuda
