// Micro-benchmark of the CPU kernels, printed as one JSON object:
//   * decode attention over the paged KV pool (8 sequences, one new token
//     each, SmolLM2-135M layer shape: 9 query heads, 3 KV heads, head_dim 64,
//     block 16, shuffled block ids) at contexts 1K and 8K, for each KV cache
//     dtype (--kv-cache-dtypes), timed in turn within each repeat, as GB/s of
//     K/V bytes read and as speed-up over float32 measured in the same run;
//   * prefill attention of one 2,048-token prompt in 512-token chunks (as
//     the scheduler's default max_num_batched_tokens cuts it), same layer
//     shape, as GFLOP/s of the causal QK^T and PV products;
//   * memcpy bandwidth measured in the same run (one thread and all compute
//     threads), the ceiling decode attention should approach;
//   * sgemm GFLOP/s for [16, 576] x [576, 1536]^T (an MLP up-projection of a
//     16-token batch).
// Every figure is the median of --repeats timed runs after one warm-up run.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/kv_dtype_flags.h"
#include "kernels/attention.h"
#include "kernels/cpu/kv_codec.h"
#include "kernels/matmul.h"
#include "kernels/threads.h"

namespace headway {
namespace {

double MedianSeconds(int repeats, const std::function<void()>& fn) {
  fn();  // warm-up: page faults, compute-pool and OpenBLAS thread start
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

struct MemcpyResult {
  double one_thread_gbps;
  double all_threads_gbps;
};

// Bytes copied per second (each byte is read once and written once).
MemcpyResult MeasureMemcpy(size_t bytes, int repeats) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const double one = MedianSeconds(repeats, [&] { std::memcpy(dst.data(), src.data(), bytes); });
  const double all = MedianSeconds(repeats, [&] {
    const int64_t n = cpu::NumThreads();
    cpu::ParallelFor(n, 1, [&](int64_t t_begin, int64_t t_end) {
      for (int64_t t = t_begin; t < t_end; ++t) {
        const size_t begin = bytes * size_t(t) / size_t(n), end = bytes * size_t(t + 1) / size_t(n);
        std::memcpy(dst.data() + begin, src.data() + begin, end - begin);
      }
    });
  });
  return {bytes / one / 1e9, bytes / all / 1e9};
}

struct AttentionResult {
  double seconds;
  double kv_bytes;
};

// A pool of `num_blocks` blocks of random rows in [-1, 1], in layout.dtype.
std::vector<uint8_t> RandomPool(const KvCacheLayout& layout, int num_blocks, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint8_t> pool(size_t(num_blocks) * layout.BlockBytes());
  std::vector<float> row(size_t(layout.head_dim));
  for (size_t at = 0; at < pool.size(); at += layout.RowBytes()) {
    for (float& x : row) x = dist(rng);
    cpu::EncodeKvRow(row.data(), layout.head_dim, layout.dtype, pool.data() + at);
  }
  return pool;
}

// Decode attention over one pool per dtype, the dtypes timed in turn within
// each repeat (so a noisy neighbour slows them alike): one result per dtype,
// the median of its repeats.
std::vector<AttentionResult> MeasureDecodeAttention(int num_seqs, int context,
                                                    const std::vector<KvCacheDtype>& dtypes,
                                                    int repeats) {
  const int num_heads = 9, num_kv_heads = 3, head_dim = 64, block_size = 16;
  const int blocks_per_slot = (context + block_size - 1) / block_size;
  const int num_blocks = num_seqs * num_kv_heads * blocks_per_slot;

  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<KvCacheLayout> layouts;
  std::vector<std::vector<uint8_t>> pools;
  for (KvCacheDtype dtype : dtypes) {
    layouts.push_back(KvCacheLayout{block_size, head_dim, dtype});
    pools.push_back(RandomPool(layouts.back(), num_blocks, 1));
  }
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);  // blocks scattered over the pool

  std::vector<int32_t> query_start(num_seqs + 1), start_pos(num_seqs, context - 1);
  std::iota(query_start.begin(), query_start.end(), 0);
  const BatchLayout batch{num_seqs, query_start.data(), start_pos.data()};
  const LayerBlockTable table{ids.data(), num_kv_heads, blocks_per_slot};
  const std::vector<SlotSpec> specs(num_kv_heads);
  std::vector<float> q(size_t(num_seqs) * num_heads * head_dim), out(q.size());
  for (float& x : q) x = dist(rng);
  const float scale = 1.0f / std::sqrt(float(head_dim));

  auto run = [&](size_t d) {
    cpu::PagedAttention(q.data(), pools[d].data(), batch, table, specs.data(), layouts[d],
                        num_heads, scale, out.data());
  };
  std::vector<std::vector<double>> seconds(dtypes.size());
  for (size_t d = 0; d < dtypes.size(); ++d) run(d);  // warm-up
  for (int r = 0; r < repeats; ++r) {
    for (size_t d = 0; d < dtypes.size(); ++d) {
      const auto start = std::chrono::steady_clock::now();
      run(d);
      seconds[d].push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  std::vector<AttentionResult> results;
  for (size_t d = 0; d < dtypes.size(); ++d) {
    std::sort(seconds[d].begin(), seconds[d].end());
    const double kv_bytes =
        double(num_seqs) * num_kv_heads * context * 2 * layouts[d].RowBytes();
    results.push_back({seconds[d][seconds[d].size() / 2], kv_bytes});
  }
  return results;
}

// Prefill attention of one `prompt`-token sequence run as chunks of `chunk`
// rows, each chunk after AppendKv of its rows: GFLOP/s counting 4 * head_dim
// flops per (query head, visible key) pair.
double MeasurePrefillAttentionGflops(int prompt, int chunk, int repeats) {
  const int num_heads = 9, num_kv_heads = 3, head_dim = 64, block_size = 16;
  const KvCacheLayout layout{block_size, head_dim};
  const int blocks_per_slot = (prompt + block_size - 1) / block_size;
  const int num_blocks = num_kv_heads * blocks_per_slot;
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const std::vector<uint8_t> pool = RandomPool(layout, num_blocks, 3);
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const LayerBlockTable table{ids.data(), num_kv_heads, blocks_per_slot};
  const std::vector<SlotSpec> specs(num_kv_heads);
  std::vector<float> q(size_t(chunk) * num_heads * head_dim), out(q.size());
  for (float& x : q) x = dist(rng);
  const float scale = 1.0f / std::sqrt(float(head_dim));
  const double seconds = MedianSeconds(repeats, [&] {
    for (int begin = 0; begin < prompt; begin += chunk) {
      const int32_t query_start[2] = {0, std::min(chunk, prompt - begin)};
      const int32_t start_pos[1] = {begin};
      const BatchLayout batch{1, query_start, start_pos};
      cpu::PagedAttention(q.data(), pool.data(), batch, table, specs.data(), layout, num_heads,
                          scale, out.data());
    }
  });
  const double pairs = double(prompt) * (prompt + 1) / 2 * num_heads;
  return pairs * 4 * head_dim / seconds / 1e9;
}

double MeasureSgemmGflops(int m, int n, int k, int repeats) {
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(size_t(m) * k), w(size_t(n) * k), y(size_t(m) * n);
  for (float& v : x) v = dist(rng);
  for (float& v : w) v = dist(rng);
  const double seconds =
      MedianSeconds(repeats, [&] { cpu::MatmulTransB(x.data(), w.data(), m, n, k, y.data()); });
  return 2.0 * m * n * k / seconds / 1e9;
}

}  // namespace
}  // namespace headway

int main(int argc, char** argv) {
  CLI::App app{"Headway CPU kernel micro-benchmark (JSON on stdout)"};
  int repeats = 15;
  int num_seqs = 8;
  std::vector<int> contexts = {1024, 8192};
  size_t memcpy_mib = 256;
  std::vector<std::string> dtype_names = {"float32", "float16", "q8_0", "q4_0", "q4_0_hadamard"};
  app.add_option("--repeats", repeats, "timed runs per figure (median reported)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seqs", num_seqs, "decode sequences per batch")->check(CLI::PositiveNumber);
  app.add_option("--contexts", contexts, "context lengths (tokens)");
  app.add_option("--memcpy-mib", memcpy_mib, "memcpy buffer size, MiB")
      ->check(CLI::PositiveNumber);
  app.add_option("--kv-cache-dtypes", dtype_names,
                 "KV cache dtypes of decode attention (float32 first for the speed-ups)");
  CLI11_PARSE(app, argc, argv);
  const std::optional<std::vector<headway::KvCacheDtype>> parsed =
      headway::bench::ParseKvCacheDtypeFlag(dtype_names);
  if (!parsed) return 2;
  const std::vector<headway::KvCacheDtype>& dtypes = *parsed;

  const headway::MemcpyResult copy = headway::MeasureMemcpy(memcpy_mib << 20, repeats);
  std::printf("{\n  \"threads\": %d,\n", headway::cpu::NumThreads());
  std::printf("  \"memcpy_gbps_one_thread\": %.2f,\n", copy.one_thread_gbps);
  std::printf("  \"memcpy_gbps_all_threads\": %.2f,\n", copy.all_threads_gbps);
  std::printf("  \"decode_attention\": [\n");
  for (size_t i = 0; i < contexts.size(); ++i) {
    double float32_seconds = 0.0;
    const std::vector<headway::AttentionResult> results =
        headway::MeasureDecodeAttention(num_seqs, contexts[i], dtypes, repeats);
    for (size_t j = 0; j < dtypes.size(); ++j) {
      const headway::AttentionResult& r = results[j];
      if (dtypes[j] == headway::KvCacheDtype::kFloat32) float32_seconds = r.seconds;
      const double gbps = r.kv_bytes / r.seconds / 1e9;
      std::printf(
          "    {\"kv_cache_dtype\": \"%s\", \"seqs\": %d, \"context\": %d, \"kv_mib\": %.1f, "
          "\"ms\": %.3f, \"kv_gbps\": %.2f, \"fraction_of_memcpy\": %.2f",
          headway::KvCacheDtypeName(dtypes[j]), num_seqs, contexts[i], r.kv_bytes / (1 << 20),
          r.seconds * 1e3, gbps, gbps / copy.all_threads_gbps);
      if (float32_seconds > 0.0) std::printf(", \"speedup_vs_float32\": %.2f", float32_seconds / r.seconds);
      const bool last = i + 1 == contexts.size() && j + 1 == dtypes.size();
      std::printf("}%s\n", last ? "" : ",");
    }
  }
  std::printf("  ],\n");
  const int prompt = 2048, chunk = 512;
  std::printf("  \"prefill_attention\": {\"prompt\": %d, \"chunk\": %d, \"gflops\": %.2f},\n",
              prompt, chunk, headway::MeasurePrefillAttentionGflops(prompt, chunk, repeats));
  const int m = 16, n = 1536, k = 576;
  std::printf("  \"sgemm\": {\"m\": %d, \"n\": %d, \"k\": %d, \"gflops\": %.2f}\n}\n", m, n, k,
              headway::MeasureSgemmGflops(m, n, k, repeats));
  return 0;
}
