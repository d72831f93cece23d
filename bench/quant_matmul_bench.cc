// QuantMatmulTransB (weights kept quantised) against MatmulTransB (OpenBLAS
// sgemm on weights dequantised to f32) for SmolLM2-135M's decode shapes,
// printed as one JSON object:
//   attn_q / attn_output [m,576] x [576,576]^T Q4_1, ffn_gate / ffn_up
//   [m,576] x [1536,576]^T Q4_1, ffn_down [m,1536] x [576,1536]^T Q4_1,
//   lm_head [m,576] x [49152,576]^T Q8_0 (the tied token_embd);
// for each batch of m activation rows and each thread count (OpenMP and
// OpenBLAS set alike).
//
// Two cache states: "hot" calls one matrix over and over (it stays in cache:
// the compute cost), "cold" cycles through copies of the matrix totalling at
// least --cold-mb, as a decode step walks 30 layers of weights, so weights
// come from DRAM (the realistic case). The machine may be shared, so each
// repeat times both kernels back to back and the figures are medians over
// repeats: of each time and of the per-repeat ratio quant / f32 (< 1: the
// quantised kernel is faster). `crossover_m` is the smallest m measured at
// which sgemm wins (median ratio > 1), or null if it never does.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "kernels/matmul.h"
#include "kernels/quant_matmul.h"
#include "worker/dequant.h"

namespace headway {
namespace {

struct Shape {
  std::string name;
  int n;
  int k;
  GgmlType type;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Seconds(const std::chrono::steady_clock::time_point& start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Random blocks of `type` whose f16 scales are moderate normal numbers; the
// timing does not depend on the values.
std::vector<uint8_t> RandomQuantised(GgmlType type, int n, int k, std::mt19937_64& rng) {
  const uint64_t bytes = GgmlBytes(type, uint64_t(n) * k).value();
  const uint64_t block_bytes = GgmlBytes(type, 32).value();
  std::vector<uint8_t> w(bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : w) b = uint8_t(byte(rng));
  const uint16_t d = 0x2000, m = 0xA000;  // 2^-7 and -2^-7
  for (uint64_t off = 0; off < bytes; off += block_bytes) {
    std::memcpy(&w[off], &d, 2);
    if (type == GgmlType::kQ4_1) std::memcpy(&w[off + 2], &m, 2);
  }
  return w;
}

struct Copies {
  std::vector<std::vector<uint8_t>> quant;
  std::vector<std::vector<float>> f32;
};

// `count_quant` / `count_f32` copies of one random matrix in both forms.
Copies MakeCopies(const Shape& s, int count_quant, int count_f32) {
  std::mt19937_64 rng(1);
  Copies c;
  c.quant.push_back(RandomQuantised(s.type, s.n, s.k, rng));
  std::vector<float> f32(size_t(s.n) * s.k);
  if (!Dequantize(s.type, c.quant[0].data(), f32.data(), f32.size()).ok()) std::abort();
  for (int i = 1; i < count_quant; ++i) c.quant.push_back(c.quant[0]);
  for (int i = 0; i < count_f32; ++i) c.f32.push_back(f32);
  return c;
}

nlohmann::json Measure(const Shape& s, const std::vector<int>& ms, int threads, bool cold,
                       double cold_bytes, int repeats) {
  const size_t quant_bytes = GgmlBytes(s.type, uint64_t(s.n) * s.k).value();
  const size_t f32_bytes = size_t(s.n) * s.k * 4;
  const int count_quant = cold ? int(std::ceil(cold_bytes / quant_bytes)) : 1;
  const int count_f32 = cold ? int(std::ceil(cold_bytes / f32_bytes)) : 1;
  const Copies copies = MakeCopies(s, count_quant, count_f32);
  const int max_m = *std::max_element(ms.begin(), ms.end());
  std::vector<float> x(size_t(max_m) * s.k), y(size_t(max_m) * s.n);
  std::mt19937_64 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);

  nlohmann::json out = nlohmann::json::array();
  for (int m : ms) {
    // One timed pass calls every copy once; the per-call time is the pass
    // time over the copy count.
    auto quant_pass = [&] {
      const auto start = std::chrono::steady_clock::now();
      for (const auto& w : copies.quant) {
        cpu::QuantMatmulTransB(x.data(), w.data(), s.type, m, s.n, s.k, y.data());
      }
      return Seconds(start) / copies.quant.size();
    };
    auto f32_pass = [&] {
      const auto start = std::chrono::steady_clock::now();
      for (const auto& w : copies.f32) cpu::MatmulTransB(x.data(), w.data(), m, s.n, s.k, y.data());
      return Seconds(start) / copies.f32.size();
    };
    quant_pass();  // warm-up: page faults, thread pools
    f32_pass();
    std::vector<double> tq, tf, ratio;
    for (int r = 0; r < repeats; ++r) {
      tq.push_back(quant_pass());
      tf.push_back(f32_pass());
      ratio.push_back(tq.back() / tf.back());
    }
    out.push_back({{"m", m},
                   {"quant_us", Median(tq) * 1e6},
                   {"f32_us", Median(tf) * 1e6},
                   {"ratio_quant_over_f32", Median(ratio)},
                   {"quant_weight_gbps", quant_bytes / Median(tq) / 1e9},
                   {"f32_weight_gbps", f32_bytes / Median(tf) / 1e9}});
  }
  return out;
}

}  // namespace
}  // namespace headway

int main(int argc, char** argv) {
  using namespace headway;
  CLI::App app{"Quantised-weight matmul vs f32 sgemm at decode shapes (JSON on stdout)"};
  int repeats = 15;
  double cold_mb = 96.0;
  std::vector<int> ms = {1, 4, 8, 16};
  std::vector<int> thread_counts = {1, 2};
  app.add_option("--repeats", repeats, "timed repeats per figure (median)")
      ->check(CLI::PositiveNumber);
  app.add_option("--cold-mb", cold_mb, "bytes of matrix copies cycled for the cold figures, MiB")
      ->check(CLI::PositiveNumber);
  app.add_option("--m", ms, "activation rows (batch sizes)")->check(CLI::PositiveNumber);
  app.add_option("--threads", thread_counts, "thread counts")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  std::sort(ms.begin(), ms.end());

  const std::vector<Shape> shapes = {
      {"attn_q_576x576_q4_1", 576, 576, GgmlType::kQ4_1},
      {"ffn_up_1536x576_q4_1", 1536, 576, GgmlType::kQ4_1},
      {"ffn_down_576x1536_q4_1", 576, 1536, GgmlType::kQ4_1},
      {"lm_head_49152x576_q8_0", 49152, 576, GgmlType::kQ8_0},
  };
  nlohmann::json results = nlohmann::json::array();
  for (int threads : thread_counts) {
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    for (const bool cold : {false, true}) {
      for (const Shape& s : shapes) {
        nlohmann::json rows = Measure(s, ms, threads, cold, cold_mb * 1024 * 1024, repeats);
        nlohmann::json crossover = nullptr;
        for (const auto& row : rows) {
          if (row["ratio_quant_over_f32"].get<double>() > 1.0) {
            crossover = row["m"];
            break;
          }
        }
        results.push_back({{"shape", s.name},
                           {"n", s.n},
                           {"k", s.k},
                           {"threads", threads},
                           {"cache", cold ? "cold" : "hot"},
                           {"crossover_m", crossover},
                           {"by_m", rows}});
        std::fprintf(stderr, "done %s threads=%d %s\n", s.name.c_str(), threads,
                     cold ? "cold" : "hot");
      }
    }
  }
  nlohmann::json doc = {{"repeats", repeats},
                        {"cold_mb", cold_mb},
                        {"simd", cpu::internal::QuantMatmulHasSimd()},
                        {"results", results}};
  std::printf("%s\n", doc.dump(2).c_str());
  return 0;
}
