// CUDA linear layers (kernels/cuda/matmul.h), printed as one JSON object:
//
//   gemm:   cuBLAS bf16 GEMM (Blas::GemmBf16, bf16 inputs in place) and
//           Blas::MatmulTransB (f32 activations rounded to bf16 first, as
//           the worker calls it) at --size^3 (8192 by default), in TFLOP/s
//           (2 m n k flops per product), and MatmulTransB's share of the raw
//           GEMM's rate (1: the conversion costs nothing).
//   decode: SmolLM2-135M's decode shapes (ffn_up k=576 n=1536, ffn_down
//           k=1536 n=576, lm_head k=576 n=49152) at m = 1, 4, 8 rows:
//           DequantGemv on Q4_1 blocks against MatmulTransB on the bf16
//           matrix, microseconds per call and GB/s of weight bytes read
//           (Q4_1: 20 bytes per 32 weights; bf16: 2 bytes per weight).
//           "hot" calls one matrix over and over (it stays in the 50 MB L2
//           of an H200); "cold" cycles through copies totalling at least
//           --cold-mb, so weights come from HBM, as a decode step walks its
//           layers.
//
// Times are CUDA event times (cuda::EventTimer) after --warmup calls:
// medians over --runs samples; a decode sample times --calls back-to-back
// calls and divides, as one small GEMV is shorter than the timer's
// resolution. Without a GPU it prints {"skipped": "<reason>"} and exits 0.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/gguf.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/runtime.h"

namespace headway {
namespace {

using nlohmann::json;

// SplitMix64: fast enough for the 67M values of the large GEMM.
struct FastRandom {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float Uniform() { return float(Next() >> 40) * (1.0f / float(1 << 24)) * 2.0f - 1.0f; }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

[[noreturn]] void Fail(const Status& status) {
  std::printf("%s\n", json{{"error", status.ToString()}}.dump().c_str());
  std::exit(1);
}

void Check(const Status& status) {
  if (!status.ok()) Fail(status);
}

template <typename T>
T Take(Result<T> result) {
  if (!result.ok()) Fail(result.status());
  return std::move(result).value();
}

template <typename T>
cuda::DeviceBuffer Upload(const std::vector<T>& host, cuda::Stream stream) {
  cuda::DeviceBuffer buffer = Take(cuda::DeviceBuffer::Allocate(host.size() * sizeof(T)));
  Check(cuda::CopyToDevice(buffer.data(), host.data(), host.size() * sizeof(T), stream));
  Check(cuda::Synchronize(stream, "upload"));
  return buffer;
}

std::vector<float> RandomF32(size_t n, uint64_t seed) {
  FastRandom rng{seed};
  std::vector<float> v(n);
  for (float& x : v) x = rng.Uniform();
  return v;
}

std::vector<bf16_bits> RandomBf16(size_t n, uint64_t seed) {
  FastRandom rng{seed};
  std::vector<bf16_bits> v(n);
  for (bf16_bits& x : v) x = FloatToBf16(rng.Uniform());
  return v;
}

// Q4_1 blocks (f16 d | f16 m | u8 qs[16]) with random quants, d in
// [2^-8, 2^-7) and m in (-2^-3, -2^-4]: finite halves built from their bits.
std::vector<uint8_t> RandomQ4_1(int n, int k, uint64_t seed) {
  FastRandom rng{seed};
  std::vector<uint8_t> bytes(size_t(n) * (k / 32) * 20);
  for (uint8_t& b : bytes) b = uint8_t(rng.Next());
  for (size_t off = 0; off < bytes.size(); off += 20) {
    const uint16_t d = uint16_t(0x1C00u | (rng.Next() & 0x3FFu));  // exponent -8
    const uint16_t m = uint16_t(0xAC00u | (rng.Next() & 0x3FFu));  // -(exponent -4)
    bytes[off] = uint8_t(d), bytes[off + 1] = uint8_t(d >> 8);
    bytes[off + 2] = uint8_t(m), bytes[off + 3] = uint8_t(m >> 8);
  }
  return bytes;
}

// Median over `runs` samples of the time of `calls` calls of fn(i), i the
// call's running index, in microseconds per call.
template <typename Fn>
double TimeUs(cuda::Stream stream, int warmup, int runs, int calls, Fn fn) {
  int64_t i = 0;
  for (int w = 0; w < warmup; ++w) fn(i++);
  Check(cuda::Synchronize(stream, "warm-up"));
  cuda::EventTimer timer;
  std::vector<double> samples;
  for (int r = 0; r < runs; ++r) {
    timer.Start(stream);
    for (int c = 0; c < calls; ++c) fn(i++);
    timer.Stop(stream);
    samples.push_back(1000.0 * timer.ElapsedMs() / calls);
  }
  Check(cuda::Synchronize(stream, "timed calls"));
  return Median(samples);
}

struct DecodeShape {
  std::string name;
  int k;
  int n;
};

}  // namespace
}  // namespace headway

int main(int argc, char** argv) {
  using namespace headway;
  CLI::App app{"CUDA bf16 GEMM and dequantising GEMV at SmolLM2 decode shapes (JSON on stdout)"};
  int size = 8192;
  int warmup = 3;
  int runs = 20;
  int calls = 50;
  double cold_mb = 192.0;
  std::vector<int> ms = {1, 4, 8};
  app.add_option("--size", size, "m = n = k of the large GEMM")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed calls first")->check(CLI::NonNegativeNumber);
  app.add_option("--runs", runs, "timed samples per figure (median)")->check(CLI::Range(1, 1000));
  app.add_option("--calls", calls, "decode calls per sample")->check(CLI::Range(1, 10000));
  app.add_option("--cold-mb", cold_mb, "MiB of weight copies cycled for the cold figures")
      ->check(CLI::PositiveNumber);
  app.add_option("--m", ms, "decode activation rows")
      ->check(CLI::Range(1, cuda::kMaxDequantGemvRows));
  CLI11_PARSE(app, argc, argv);

  if (cuda::DeviceCount() == 0) {
    std::printf("%s\n", json{{"skipped", cuda::NoDeviceReason()}}.dump().c_str());
    return 0;
  }
  const cuda::DeviceInfo info = Take(cuda::SetDevice(0));
  const cuda::Stream stream = Take(cuda::CreateStream());
  std::unique_ptr<cuda::Blas> blas = Take(cuda::Blas::Create(stream));

  json out;
  out["device"] = info.name;
  out["runs"] = runs;
  out["warmup"] = warmup;

  // ---- Large GEMM ----
  {
    const size_t elems = size_t(size) * size;
    cuda::DeviceBuffer a = Upload(RandomBf16(elems, 1), stream);
    cuda::DeviceBuffer b = Upload(RandomBf16(elems, 2), stream);
    cuda::DeviceBuffer x = Upload(RandomF32(elems, 3), stream);
    cuda::DeviceBuffer y = Take(cuda::DeviceBuffer::Allocate(elems * sizeof(float)));
    const double flops = 2.0 * double(size) * size * size;
    const double gemm_us = TimeUs(stream, warmup, runs, 1, [&](int64_t) {
      Check(blas->GemmBf16(a.as<bf16_bits>(), b.as<bf16_bits>(), size, size, size, y.as<float>()));
    });
    const double matmul_us = TimeUs(stream, warmup, runs, 1, [&](int64_t) {
      Check(blas->MatmulTransB(x.as<float>(), b.as<bf16_bits>(), size, size, size, y.as<float>()));
    });
    const double gemm_tflops = flops / (gemm_us * 1e-6) / 1e12;
    const double matmul_tflops = flops / (matmul_us * 1e-6) / 1e12;
    out["gemm"] = {{"m", size},
                   {"n", size},
                   {"k", size},
                   {"gemm_bf16_us", gemm_us},
                   {"gemm_bf16_tflops", gemm_tflops},
                   {"matmul_trans_b_us", matmul_us},
                   {"matmul_trans_b_tflops", matmul_tflops},
                   {"matmul_trans_b_over_gemm_bf16", matmul_tflops / gemm_tflops}};
  }

  // ---- Decode shapes ----
  const std::vector<DecodeShape> shapes = {
      {"ffn_up", 576, 1536}, {"ffn_down", 1536, 576}, {"lm_head", 576, 49152}};
  const int max_m = *std::max_element(ms.begin(), ms.end());
  json decode = json::array();
  for (const DecodeShape& s : shapes) {
    const size_t q_bytes = size_t(s.n) * (s.k / 32) * 20;
    const size_t bf_bytes = size_t(s.n) * s.k * sizeof(bf16_bits);
    const double cold_bytes = cold_mb * 1024.0 * 1024.0;
    const int q_copies = std::max(1, int(cold_bytes / double(q_bytes)) + 1);
    const int bf_copies = std::max(1, int(cold_bytes / double(bf_bytes)) + 1);
    // Copies are device-to-device duplicates of one random matrix.
    std::vector<cuda::DeviceBuffer> wq, wb;
    wq.push_back(Upload(RandomQ4_1(s.n, s.k, 10), stream));
    wb.push_back(Upload(RandomBf16(size_t(s.n) * s.k, 11), stream));
    for (int c = 1; c < q_copies; ++c) {
      wq.push_back(Take(cuda::DeviceBuffer::Allocate(q_bytes)));
      Check(cuda::CopyDeviceToDevice(wq.back().data(), wq[0].data(), q_bytes, stream));
    }
    for (int c = 1; c < bf_copies; ++c) {
      wb.push_back(Take(cuda::DeviceBuffer::Allocate(bf_bytes)));
      Check(cuda::CopyDeviceToDevice(wb.back().data(), wb[0].data(), bf_bytes, stream));
    }
    cuda::DeviceBuffer x = Upload(RandomF32(size_t(max_m) * s.k, 12), stream);
    cuda::DeviceBuffer y = Take(cuda::DeviceBuffer::Allocate(size_t(max_m) * s.n * 4));
    Check(cuda::Synchronize(stream, "weight copies"));

    for (int m : ms) {
      json entry = {
          {"shape", s.name},       {"k", s.k}, {"n", s.n}, {"m", m}, {"q4_1_bytes", q_bytes},
          {"bf16_bytes", bf_bytes}};
      for (const bool cold : {false, true}) {
        const double dq_us = TimeUs(stream, warmup, runs, calls, [&](int64_t i) {
          const auto& w = wq[cold ? size_t(i % q_copies) : 0];
          cuda::DequantGemv(x.as<float>(), w.as<uint8_t>(), GgmlType::kQ4_1, m, s.n, s.k,
                            y.as<float>(), stream);
        });
        const double mm_us = TimeUs(stream, warmup, runs, calls, [&](int64_t i) {
          const auto& w = wb[cold ? size_t(i % bf_copies) : 0];
          Check(blas->MatmulTransB(x.as<float>(), w.as<bf16_bits>(), m, s.n, s.k, y.as<float>()));
        });
        entry[cold ? "cold" : "hot"] = {
            {"dequant_gemv_us", dq_us},
            {"dequant_gemv_gbps", double(q_bytes) / (dq_us * 1e-6) / 1e9},
            {"matmul_trans_b_us", mm_us},
            {"matmul_trans_b_gbps", double(bf_bytes) / (mm_us * 1e-6) / 1e9},
            {"dequant_gemv_over_matmul_trans_b_time", dq_us / mm_us}};
      }
      decode.push_back(entry);
    }
  }
  out["decode"] = decode;
  out["cold_mb"] = cold_mb;
  out["calls_per_sample"] = calls;
  Check(cuda::Synchronize(stream, "end"));
  std::printf("%s\n", out.dump().c_str());
  blas.reset();
  cuda::DestroyStream(stream);
  return 0;
}
