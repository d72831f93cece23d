// Two instances of quant_paired_sweep.inc: under `#pragma GCC target` (clang:
// `#pragma clang attribute`) for AVX-512F, and for the AVX2 baseline. Each lives in an anonymous namespace
// (internal linkage), so the linker never merges an AVX-512 copy of a
// function into code that runs on AVX2-only machines; the shared helpers
// (quant_blocks_avx2.h) are defined before the pragma, for the baseline, and
// inlined into the AVX-512 functions.
#include "kernels/cpu/quant_matmul_paired.h"

#include <cstddef>

#include "kernels/cpu/quant_blocks_avx2.h"

#ifdef HEADWAY_QUANT_AVX2

namespace headway::cpu::paired {
namespace {

// clang ignores GCC's target pragmas; its own attribute pragma does the same.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f")
#endif
namespace avx512_impl {

struct Ops {
  using V = __m512;
  static constexpr int kPairsPerTile = 4;
  static V Zero() { return _mm512_setzero_ps(); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  // The same 8 floats in both halves. The masked form, every lane selected,
  // compiles to the plain vbroadcastf64x4; the plain intrinsic trips GCC
  // 12's -Wmaybe-uninitialized on its undefined source operand.
  static V Broadcast8(const float* p) {
    return _mm512_castpd_ps(_mm512_mask_broadcast_f64x4(
        _mm512_setzero_pd(), 0xFF, _mm256_castps_pd(_mm256_loadu_ps(p))));
  }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  // Keeps a loaded weight vector in its register. Without it GCC folds the
  // load into every FMA that uses it, R loads where one is enough, and the
  // tile waits on its load ports instead of its FMA units.
  static void Pin(V& v) { asm("" : "+v"(v)); }
  // Through memory: once per output per call, and free of the cast and
  // extract intrinsics that trip the warning.
  static void Reduce(V acc, float* lo, float* hi) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc);
    *lo = avx2::ReduceLanesAvx2(_mm256_load_ps(lanes));
    *hi = avx2::ReduceLanesAvx2(_mm256_load_ps(lanes + 8));
  }
};

#include "kernels/cpu/quant_paired_sweep.inc"

}  // namespace avx512_impl
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace avx2_impl {

struct Ops {
  struct V {
    __m256 lo, hi;
  };
  static constexpr int kPairsPerTile = 4;
  static V Zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V Load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static V Broadcast8(const float* p) {
    const __m256 v = _mm256_loadu_ps(p);
    return {v, v};
  }
  static V Fma(V a, V b, V c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  // 16 ymm registers cannot hold this tile anyway: let the compiler choose.
  static void Pin(V&) {}
  static void Reduce(V acc, float* lo, float* hi) {
    *lo = avx2::ReduceLanesAvx2(acc.lo);
    *hi = avx2::ReduceLanesAvx2(acc.hi);
  }
};

#include "kernels/cpu/quant_paired_sweep.inc"

}  // namespace avx2_impl
}  // namespace

bool CpuHasAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

void SweepAvx512(const float* x, const float* wp, int rows, int m, int i0, int n, int k,
                 float* y) {
  avx512_impl::PairedSweep(x, wp, rows, m, i0, n, k, y);
}

void SweepAvx2(const float* x, const float* wp, int rows, int m, int i0, int n, int k,
               float* y) {
  avx2_impl::PairedSweep(x, wp, rows, m, i0, n, k, y);
}

}  // namespace headway::cpu::paired

#endif  // HEADWAY_QUANT_AVX2
