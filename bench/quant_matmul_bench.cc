// The two quantised-weight matmul modes against MatmulTransB (OpenBLAS sgemm
// on weights dequantised to f32) for SmolLM2-135M's and Gemma 3 270M's
// K-quant shapes, printed as one JSON object:
//   f32act:  QuantMatmulTransBF32Act (f32 activations, batch-invariant)
//   int8act: reference::QuantMatmulTransB8BitAct (activations rounded to 8
//            bits, llama.cpp's method; not used in serving)
//   sgemm:   MatmulTransB on the dequantised f32 matrix
// Shapes: attn_q / attn_output [m,576] x [576,576]^T Q4_1, ffn_gate / ffn_up
// [m,576] x [1536,576]^T Q4_1, ffn_down [m,1536] x [576,1536]^T Q4_1,
// lm_head [m,576] x [49152,576]^T Q8_0 (the tied token_embd; only batches up
// to --lm-head-max-m, as prefill needs the head only on each sequence's last
// token); Gemma 3 270M's attn_output [m,1024] x [640,1024]^T Q4_K and
// ffn_down [m,2048] x [640,2048]^T Q6_K; for each batch of m activation rows
// and each thread count (OpenMP and OpenBLAS set alike). --shape keeps only
// the shapes whose name contains one of the given strings.
//
// Two cache states: "hot" calls one matrix over and over (it stays in cache:
// the compute cost), "cold" cycles through copies of the matrix totalling at
// least --cold-mb, as a decode step walks 30 layers of weights, so weights
// come from DRAM (the realistic case for decode). Cold figures are taken only
// up to --cold-max-m rows: beyond, each weight is reused by many rows and the
// cache state hardly matters. The machine may be shared, so each repeat times
// the three kernels back to back and the figures are medians over repeats:
// of each time and of the per-repeat ratios (< 1: the numerator is faster).
// `crossover_m` (per quantised mode) is the smallest m measured at which
// sgemm wins (median ratio over sgemm > 1), or null if it never does.
//
// Where the run-time dispatch picks a path other than AVX2 (AVX-512), each
// repeat also times f32act forced onto the AVX2 path (`avx2_us`,
// `ratio_f32act_over_avx2`): the AVX-512 gain, measured in the same run.
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
#include "kernels/threads.h"
#include "kernels/reference/quant_matmul_8bit_act.h"
#include "worker/dequant.h"

namespace headway {
namespace {

struct Shape {
  std::string name;
  int n;
  int k;
  GgmlType type;
  bool lm_head = false;  // capped at --lm-head-max-m rows
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Seconds(const std::chrono::steady_clock::time_point& start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Random blocks of `type` whose f16 scales (d; Q4_1's m; Q4_K's dmin) are
// moderate normal numbers; the timing does not depend on the values.
std::vector<uint8_t> RandomQuantised(GgmlType type, int n, int k, std::mt19937_64& rng) {
  const uint64_t bytes = GgmlBytes(type, uint64_t(n) * k).value();
  const uint64_t block_bytes = GgmlBytes(type, GgmlBlockValues(type).value()).value();
  std::vector<uint8_t> w(bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : w) b = uint8_t(byte(rng));
  const uint16_t d = 0x2000, m = 0xA000;  // 2^-7 and -2^-7
  const uint64_t d_offset = type == GgmlType::kQ6_K ? 208 : 0;
  for (uint64_t off = 0; off < bytes; off += block_bytes) {
    std::memcpy(&w[off + d_offset], &d, 2);
    if (type == GgmlType::kQ4_1) std::memcpy(&w[off + 2], &m, 2);
    if (type == GgmlType::kQ4_K) std::memcpy(&w[off + 2], &d, 2);  // dmin
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

using QuantFn = void (*)(const float*, const uint8_t*, GgmlType, int, int, int, float*);

void F32ActOnAvx2(const float* x, const uint8_t* w, GgmlType type, int m, int n, int k, float* y) {
  cpu::internal::QuantMatmulTransBF32ActOn(cpu::internal::QuantMatmulPath::kAvx2, x, w, type, m,
                                           n, k, y);
}

// True when f32act runs on a faster path than AVX2 that AVX2 can be compared to.
bool CompareWithAvx2() {
  using cpu::internal::QuantMatmulPath;
  return cpu::internal::QuantMatmulBestPath() == QuantMatmulPath::kAvx512 &&
         cpu::internal::QuantMatmulPathSupported(QuantMatmulPath::kAvx2);
}

nlohmann::json Measure(const Shape& s, const std::vector<int>& ms, bool cold, double cold_bytes,
                       int repeats) {
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
    auto quant_pass = [&](QuantFn fn) {
      const auto start = std::chrono::steady_clock::now();
      for (const auto& w : copies.quant) fn(x.data(), w.data(), s.type, m, s.n, s.k, y.data());
      return Seconds(start) / copies.quant.size();
    };
    auto f32_pass = [&] {
      const auto start = std::chrono::steady_clock::now();
      for (const auto& w : copies.f32) cpu::MatmulTransB(x.data(), w.data(), m, s.n, s.k, y.data());
      return Seconds(start) / copies.f32.size();
    };
    // Warm-up: page faults, thread pools.
    quant_pass(cpu::QuantMatmulTransBF32Act);
    quant_pass(reference::QuantMatmulTransB8BitAct);
    f32_pass();
    const bool avx2 = CompareWithAvx2();
    if (avx2) quant_pass(F32ActOnAvx2);
    std::vector<double> t_f32act, t_int8act, t_sgemm, r_f32act_sgemm, r_int8act_sgemm,
        r_f32act_int8act, t_avx2, r_f32act_avx2;
    for (int r = 0; r < repeats; ++r) {
      t_f32act.push_back(quant_pass(cpu::QuantMatmulTransBF32Act));
      if (avx2) {
        t_avx2.push_back(quant_pass(F32ActOnAvx2));
        r_f32act_avx2.push_back(t_f32act.back() / t_avx2.back());
      }
      t_int8act.push_back(quant_pass(reference::QuantMatmulTransB8BitAct));
      t_sgemm.push_back(f32_pass());
      r_f32act_sgemm.push_back(t_f32act.back() / t_sgemm.back());
      r_int8act_sgemm.push_back(t_int8act.back() / t_sgemm.back());
      r_f32act_int8act.push_back(t_f32act.back() / t_int8act.back());
    }
    const double flops = 2.0 * m * s.n * s.k;
    out.push_back({{"m", m},
                   {"f32act_us", Median(t_f32act) * 1e6},
                   {"int8act_us", Median(t_int8act) * 1e6},
                   {"sgemm_us", Median(t_sgemm) * 1e6},
                   {"ratio_f32act_over_sgemm", Median(r_f32act_sgemm)},
                   {"ratio_int8act_over_sgemm", Median(r_int8act_sgemm)},
                   {"ratio_f32act_over_int8act", Median(r_f32act_int8act)},
                   {"f32act_gflops", flops / Median(t_f32act) / 1e9},
                   {"sgemm_gflops", flops / Median(t_sgemm) / 1e9},
                   {"quant_weight_gbps_f32act", quant_bytes / Median(t_f32act) / 1e9},
                   {"f32_weight_gbps_sgemm", f32_bytes / Median(t_sgemm) / 1e9}});
    if (avx2) {
      out.back()["avx2_us"] = Median(t_avx2) * 1e6;
      out.back()["ratio_f32act_over_avx2"] = Median(r_f32act_avx2);
    }
  }
  return out;
}

nlohmann::json Crossover(const nlohmann::json& rows, const char* ratio_key) {
  for (const auto& row : rows) {
    if (row[ratio_key].get<double>() > 1.0) return row["m"];
  }
  return nullptr;
}

}  // namespace
}  // namespace headway

int main(int argc, char** argv) {
  using namespace headway;
  CLI::App app{
      "Quantised-weight matmul modes vs f32 sgemm at SmolLM2 and Gemma 3 shapes (JSON on stdout)"};
  int repeats = 15;
  double cold_mb = 96.0;
  int cold_max_m = 16;
  int lm_head_max_m = 64;
  std::vector<int> ms = {1, 4, 16, 64, 512};
  std::vector<int> thread_counts = {1, 2};
  std::vector<std::string> shape_filter;
  app.add_option("--repeats", repeats, "timed repeats per figure (median)")
      ->check(CLI::PositiveNumber);
  app.add_option("--cold-mb", cold_mb, "bytes of matrix copies cycled for the cold figures, MiB")
      ->check(CLI::PositiveNumber);
  app.add_option("--cold-max-m", cold_max_m, "largest m timed with cold weights")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lm-head-max-m", lm_head_max_m, "largest m timed for the LM head")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--m", ms, "activation rows (batch sizes)")->check(CLI::PositiveNumber);
  app.add_option("--threads", thread_counts, "thread counts")->check(CLI::PositiveNumber);
  app.add_option("--shape", shape_filter, "keep shapes whose name contains one of these");
  CLI11_PARSE(app, argc, argv);
  std::sort(ms.begin(), ms.end());

  const std::vector<Shape> shapes = {
      {"attn_q_576x576_q4_1", 576, 576, GgmlType::kQ4_1},
      {"ffn_up_1536x576_q4_1", 1536, 576, GgmlType::kQ4_1},
      {"ffn_down_576x1536_q4_1", 576, 1536, GgmlType::kQ4_1},
      {"lm_head_49152x576_q8_0", 49152, 576, GgmlType::kQ8_0, /*lm_head=*/true},
      {"gemma_attn_output_640x1024_q4_k", 640, 1024, GgmlType::kQ4_K},
      {"gemma_ffn_down_640x2048_q6_k", 640, 2048, GgmlType::kQ6_K},
  };
  auto selected = [&](const Shape& s) {
    if (shape_filter.empty()) return true;
    return std::any_of(shape_filter.begin(), shape_filter.end(), [&](const std::string& f) {
      return s.name.find(f) != std::string::npos;
    });
  };
  nlohmann::json results = nlohmann::json::array();
  for (int threads : thread_counts) {
    omp_set_num_threads(threads);  // the 8-bit-activation reference runs under OpenMP
    cpu::SetNumThreads(threads);
    openblas_set_num_threads(threads);
    for (const bool cold : {false, true}) {
      for (const Shape& s : shapes) {
        if (!selected(s)) continue;
        const int max_m = std::min(cold ? cold_max_m : ms.back(),
                                   s.lm_head ? lm_head_max_m : ms.back());
        std::vector<int> shape_ms;
        for (int m : ms) {
          if (m <= max_m) shape_ms.push_back(m);
        }
        if (shape_ms.empty()) continue;
        nlohmann::json rows = Measure(s, shape_ms, cold, cold_mb * 1024 * 1024, repeats);
        results.push_back(
            {{"shape", s.name},
             {"n", s.n},
             {"k", s.k},
             {"threads", threads},
             {"cache", cold ? "cold" : "hot"},
             {"crossover_m_f32act", Crossover(rows, "ratio_f32act_over_sgemm")},
             {"crossover_m_int8act", Crossover(rows, "ratio_int8act_over_sgemm")},
             {"by_m", rows}});
        std::fprintf(stderr, "done %s threads=%d %s\n", s.name.c_str(), threads,
                     cold ? "cold" : "hot");
      }
    }
  }
  nlohmann::json doc = {{"repeats", repeats},
                        {"cold_mb", cold_mb},
                        {"f32act_path", cpu::internal::QuantMatmulPathName(
                                            cpu::internal::QuantMatmulBestPath())},
                        {"int8act_simd", reference::internal::QuantMatmul8BitActHasSimd()},
                        {"results", results}};
  std::printf("%s\n", doc.dump(2).c_str());
  return 0;
}
