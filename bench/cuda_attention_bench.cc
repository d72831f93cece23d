// Micro-benchmark of the CUDA paged attention, printed as one JSON object:
//   * copy_bandwidth_gbs: cudaMemcpy device to device of --copy-mib MiB,
//     counting bytes read + written, the ceiling decode attention aims at;
//   * decode: 8 sequences, one new token each, Llama-3-8B layer shape (32
//     query heads, 8 KV heads, head_dim 128, block 16, shuffled block ids)
//     at contexts 1K, 8K, 32K, for each KV cache dtype of
//     --kv-cache-dtypes: median time, the K/V bytes the kernel must read
//     (scales included), their rate, its fraction of the copy bandwidth and
//     the speed-up over float32 measured in the same run; at 1K the output
//     is also checked against cpu::PagedAttention on the same bytes;
//   * prefill: one 4096-token chunk and 4 chunks of 2048, empty prefix,
//     causal, float32 K/V, as TFLOP/s with FLOPs = 4 * heads * head_dim *
//     (visible keys summed over rows).
// Times are medians of --repeats runs (CUDA events) after one warm-up run.
// Exits 0 with {"skipped": ...} where no GPU exists.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/kv_dtype_flags.h"
#include "kernels/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/runtime.h"
#include "kernels/kv_cache.h"
#include "kernels/reference/reference.h"

namespace headway {
namespace {

constexpr int kNumHeads = 32;
constexpr int kNumKvHeads = 8;
constexpr int kHeadDim = 128;
constexpr int kBlockSize = 16;
constexpr size_t kPatternFloats = size_t(1) << 22;  // 16 MiB of random values, tiled

// Dies with a message on a runtime error: a benchmark has no caller to tell.
void Check(const Status &status) {
  if (!status.ok()) {
    std::fprintf(stderr, "cuda_attention_bench: %s\n", status.ToString().c_str());
    std::exit(1);
  }
}

template <typename T>
T Unwrap(Result<T> result) {
  Check(result.status());
  return std::move(result).value();
}

// Median milliseconds of `fn` on the default stream, after one warm-up run.
double MedianMs(int repeats, const std::function<void()> &fn) {
  fn();
  Check(cuda::Synchronize(nullptr, "warm-up"));
  std::vector<double> ms;
  cuda::EventTimer timer;
  for (int i = 0; i < repeats; ++i) {
    timer.Start(nullptr);
    fn();
    timer.Stop(nullptr);
    ms.push_back(timer.ElapsedMs());
  }
  Check(cuda::CheckLastError("timed runs"));
  Check(cuda::Synchronize(nullptr, "timed runs"));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::vector<float> RandomPattern(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float &x : v) x = dist(rng);
  return v;
}

// A device buffer of `n` floats holding `pattern` repeated.
cuda::DeviceBuffer TiledBuffer(size_t n, const std::vector<float> &pattern) {
  cuda::DeviceBuffer buffer = Unwrap(cuda::DeviceBuffer::Allocate(std::max<size_t>(n, 1) * 4));
  for (size_t at = 0; at < n; at += pattern.size()) {
    const size_t count = std::min(pattern.size(), n - at);
    Check(cuda::CopyToDevice(buffer.as<float>() + at, pattern.data(), count * 4, nullptr));
  }
  Check(cuda::Synchronize(nullptr, "fill"));
  return buffer;
}

// `pattern` as rows of kHeadDim values encoded in `dtype`
// (reference::QuantizeKvRow): K/V bytes to tile a pool with.
std::vector<uint8_t> EncodedRows(const std::vector<float> &pattern, KvCacheDtype dtype) {
  const KvCacheLayout layout{kBlockSize, kHeadDim, dtype};
  const size_t rows = pattern.size() / kHeadDim;
  std::vector<uint8_t> bytes(rows * layout.RowBytes());
  for (size_t r = 0; r < rows; ++r) {
    reference::QuantizeKvRow(pattern.data() + r * kHeadDim, kHeadDim, dtype,
                             bytes.data() + r * layout.RowBytes());
  }
  return bytes;
}

// A device buffer of `n` bytes holding `pattern` repeated.
cuda::DeviceBuffer TiledBytes(size_t n, const std::vector<uint8_t> &pattern) {
  cuda::DeviceBuffer buffer = Unwrap(cuda::DeviceBuffer::Allocate(std::max<size_t>(n, 1)));
  for (size_t at = 0; at < n; at += pattern.size()) {
    const size_t count = std::min(pattern.size(), n - at);
    Check(cuda::CopyToDevice(buffer.as<uint8_t>() + at, pattern.data(), count, nullptr));
  }
  Check(cuda::Synchronize(nullptr, "fill"));
  return buffer;
}

template <typename T>
cuda::DeviceBuffer Upload(const std::vector<T> &host) {
  cuda::DeviceBuffer buffer =
      Unwrap(cuda::DeviceBuffer::Allocate(std::max<size_t>(host.size(), 1) * sizeof(T)));
  Check(cuda::CopyToDevice(buffer.data(), host.data(), host.size() * sizeof(T), nullptr));
  Check(cuda::Synchronize(nullptr, "upload"));
  return buffer;
}

double CopyBandwidthGbs(size_t bytes, int repeats) {
  cuda::DeviceBuffer src = Unwrap(cuda::DeviceBuffer::Allocate(bytes));
  cuda::DeviceBuffer dst = Unwrap(cuda::DeviceBuffer::Allocate(bytes));
  Check(cuda::Memset(src.data(), 1, bytes, nullptr));
  const double ms = MedianMs(
      repeats, [&] { Check(cuda::CopyDeviceToDevice(dst.data(), src.data(), bytes, nullptr)); });
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
}

// Sequences of `q_len` new rows after `prefix` cached positions each, full
// attention, block ids a shuffled range; pool and q tiled from one pattern.
struct Workload {
  int num_seqs = 0;
  int prefix = 0;
  int q_len = 0;
  std::vector<int32_t> query_start, start_pos, token_seq, positions, block_ids;
  int max_blocks = 0;
  size_t num_blocks = 0;
};

Workload MakeWorkload(int num_seqs, int prefix, int q_len, uint64_t seed) {
  Workload w;
  w.num_seqs = num_seqs;
  w.prefix = prefix;
  w.q_len = q_len;
  const int context = prefix + q_len;
  w.max_blocks = (context + kBlockSize - 1) / kBlockSize;
  w.num_blocks = size_t(num_seqs) * kNumKvHeads * w.max_blocks;
  w.block_ids.resize(w.num_blocks);
  std::iota(w.block_ids.begin(), w.block_ids.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(w.block_ids.begin(), w.block_ids.end(), rng);
  w.query_start.push_back(0);
  for (int s = 0; s < num_seqs; ++s) {
    w.start_pos.push_back(prefix);
    w.query_start.push_back(w.query_start.back() + q_len);
    for (int j = 0; j < q_len; ++j) {
      w.token_seq.push_back(s);
      w.positions.push_back(prefix + j);
    }
  }
  return w;
}

struct Measured {
  double ms = 0.0;
  int splits = 0;
  bool output_finite = false;
  double max_abs_error_vs_cpu = -1.0;  // -1: not checked
};

// Times cuda::PagedAttention on `w` over K/V in `dtype`; with `check`,
// compares with the CPU on the same bytes.
Measured TimeAttention(const Workload &w, const std::vector<float> &pattern, KvCacheDtype dtype,
                       int repeats, bool check) {
  const KvCacheLayout layout{kBlockSize, kHeadDim, dtype};
  const int n_tokens = w.num_seqs * w.q_len;
  const size_t q_floats = size_t(n_tokens) * kNumHeads * kHeadDim;
  const size_t pool_bytes = w.num_blocks * layout.BlockBytes();
  const std::vector<uint8_t> rows = EncodedRows(pattern, dtype);
  cuda::DeviceBuffer pool = TiledBytes(pool_bytes, rows);
  cuda::DeviceBuffer q = TiledBuffer(q_floats, pattern);
  cuda::DeviceBuffer out = Unwrap(cuda::DeviceBuffer::Allocate(q_floats * 4));
  cuda::DeviceBuffer workspace = Unwrap(cuda::DeviceBuffer::Allocate(
      cuda::PagedAttentionWorkspaceBytes(n_tokens, kNumHeads, kHeadDim)));
  cuda::DeviceBuffer query_start = Upload(w.query_start);
  cuda::DeviceBuffer start_pos = Upload(w.start_pos);
  cuda::DeviceBuffer token_seq = Upload(w.token_seq);
  cuda::DeviceBuffer positions = Upload(w.positions);
  cuda::DeviceBuffer block_ids = Upload(w.block_ids);
  const std::vector<SlotSpec> host_specs(kNumKvHeads);  // full attention
  cuda::DeviceBuffer specs = Upload(host_specs);

  cuda::DeviceBatch batch;
  batch.num_seqs = w.num_seqs;
  batch.num_tokens = n_tokens;
  batch.query_start = query_start.as<int32_t>();
  batch.start_pos = start_pos.as<int32_t>();
  batch.token_seq = token_seq.as<int32_t>();
  batch.positions = positions.as<int32_t>();
  batch.max_query_len = w.q_len;
  batch.max_context_len = w.prefix + w.q_len;
  LayerBlockTable table{block_ids.as<int32_t>(), kNumKvHeads, w.max_blocks};
  const float scale = 1.0f / std::sqrt(float(kHeadDim));

  Measured m;
  m.splits = cuda::PagedAttentionSplits(batch, kNumHeads, kNumKvHeads, kHeadDim);
  m.ms = MedianMs(repeats, [&] {
    cuda::PagedAttention(q.as<float>(), pool.as<uint8_t>(), batch, table, specs.as<SlotSpec>(),
                         layout, kNumHeads, scale, workspace.data(), out.as<float>(), nullptr);
  });
  std::vector<float> got(q_floats);
  Check(cuda::CopyToHost(got.data(), out.data(), q_floats * 4, nullptr));
  Check(cuda::Synchronize(nullptr, "output"));
  m.output_finite = std::all_of(got.begin(), got.end(), [](float x) { return std::isfinite(x); });
  if (check) {
    std::vector<uint8_t> host_pool(pool_bytes);
    std::vector<float> host_q(q_floats), want(q_floats);
    for (size_t i = 0; i < pool_bytes; ++i) host_pool[i] = rows[i % rows.size()];
    for (size_t i = 0; i < q_floats; ++i) host_q[i] = pattern[i % pattern.size()];
    const BatchLayout host_batch{w.num_seqs, w.query_start.data(), w.start_pos.data()};
    const LayerBlockTable host_table{w.block_ids.data(), kNumKvHeads, w.max_blocks};
    cpu::PagedAttention(host_q.data(), host_pool.data(), host_batch, host_table, host_specs.data(),
                        layout, kNumHeads, scale, want.data());
    double worst = 0.0;
    for (size_t i = 0; i < q_floats; ++i) {
      const double d = std::fabs(double(got[i]) - double(want[i]));
      worst = std::isnan(d) ? INFINITY : std::max(worst, d);
    }
    m.max_abs_error_vs_cpu = worst;
  }
  return m;
}

std::string Number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", x);
  return buf;
}

int Run(int repeats, int copy_mib, const std::vector<KvCacheDtype> &dtypes) {
  const cuda::DeviceInfo info = Unwrap(cuda::SetDevice(0));
  const std::vector<float> pattern = RandomPattern(kPatternFloats, 7);
  const double copy_gbs = CopyBandwidthGbs(size_t(copy_mib) << 20, std::max(repeats, 10));

  std::string json = "{\"device\": \"" + info.name +
                     "\", \"num_sms\": " + std::to_string(info.num_sms) +
                     ", \"copy_bandwidth_gbs\": " + Number(copy_gbs) + ", \"decode\": [";
  const int kDecodeSeqs = 8;
  bool first = true;
  std::map<int, double> float32_ms;  // context -> median ms, when float32 is measured
  for (KvCacheDtype dtype : dtypes) {
    for (int context : {1024, 8192, 32768}) {
      const Workload w = MakeWorkload(kDecodeSeqs, context - 1, 1, uint64_t(context));
      const Measured m = TimeAttention(w, pattern, dtype, repeats, context == 1024);
      if (dtype == KvCacheDtype::kFloat32) float32_ms[context] = m.ms;
      const double kv_bytes = double(kDecodeSeqs) * kNumKvHeads * context *
                              double(KvCacheLayout{kBlockSize, kHeadDim, dtype}.RowBytes()) * 2;
      const double gbs = kv_bytes / (m.ms * 1e-3) / 1e9;
      json += std::string(first ? "" : ", ") + "{\"kv_cache_dtype\": \"" + KvCacheDtypeName(dtype) +
              "\", \"context\": " + std::to_string(context) +
              ", \"num_seqs\": " + std::to_string(kDecodeSeqs) +
              ", \"splits\": " + std::to_string(m.splits) + ", \"median_ms\": " + Number(m.ms) +
              ", \"kv_bytes_read\": " + Number(kv_bytes) + ", \"bandwidth_gbs\": " + Number(gbs) +
              ", \"fraction_of_copy\": " + Number(gbs / copy_gbs) +
              ", \"output_finite\": " + (m.output_finite ? "true" : "false");
      if (m.max_abs_error_vs_cpu >= 0.0) {
        json += ", \"max_abs_error_vs_cpu\": " + Number(m.max_abs_error_vs_cpu);
      }
      if (float32_ms.count(context) > 0) {
        json += ", \"speedup_vs_float32\": " + Number(float32_ms[context] / m.ms);
      }
      json += "}";
      first = false;
    }
  }
  json += "], \"prefill\": [";
  first = true;
  for (const auto &[num_seqs, chunk] : {std::pair{1, 4096}, std::pair{4, 2048}}) {
    const Workload w = MakeWorkload(num_seqs, 0, chunk, uint64_t(chunk) + 1);
    const Measured m =
        TimeAttention(w, pattern, KvCacheDtype::kFloat32, std::min(repeats, 10), false);
    // Causal over an empty prefix: row j sees j + 1 keys.
    const double visible_keys = double(num_seqs) * chunk * (chunk + 1.0) / 2.0;
    const double flops = 4.0 * kNumHeads * kHeadDim * visible_keys;
    json += std::string(first ? "" : ", ") + "{\"num_seqs\": " + std::to_string(num_seqs) +
            ", \"chunk\": " + std::to_string(chunk) + ", \"splits\": " + std::to_string(m.splits) +
            ", \"median_ms\": " + Number(m.ms) + ", \"flops\": " + Number(flops) +
            ", \"tflops\": " + Number(flops / (m.ms * 1e-3) / 1e12) +
            ", \"output_finite\": " + (m.output_finite ? "true" : "false") + "}";
    first = false;
  }
  json += "]}";
  std::printf("%s\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace headway

int main(int argc, char **argv) {
  CLI::App app{"CUDA paged attention micro-benchmark (one JSON object on stdout)"};
  int repeats = 20;
  int copy_mib = 2048;
  app.add_option("--repeats", repeats, "timed runs per figure (median)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--copy-mib", copy_mib, "bytes of the device copy, MiB")
      ->check(CLI::Range(1, 16384));
  std::vector<std::string> dtype_names = {"float32", "float16", "q8_0", "q4_0", "q4_0_hadamard"};
  app.add_option("--kv-cache-dtypes", dtype_names,
                 "KV cache dtypes of the decode figures (float32 first for the "
                 "speed-ups)");
  CLI11_PARSE(app, argc, argv);
  const std::optional<std::vector<headway::KvCacheDtype>> dtypes =
      headway::bench::ParseKvCacheDtypeFlag(dtype_names);
  if (!dtypes) return 2;
  if (headway::cuda::DeviceCount() == 0) {
    std::string reason = headway::cuda::NoDeviceReason();
    std::replace(reason.begin(), reason.end(), '"', '\'');
    std::printf("{\"skipped\": \"%s\"}\n", reason.c_str());
    return 0;
  }
  return headway::Run(repeats, copy_mib, *dtypes);
}
