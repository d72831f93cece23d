// e^x on 8 f32 lanes, shared by the CPU kernels that need it in bulk
// (attention's softmax, the SwiGLU and GELU activations). Internal to
// kernels/cpu.
#pragma once

#include <immintrin.h>

namespace headway::cpu::avx2 {

// e^x for x clamped to [-87, 88], the range where e^x is a normal f32:
// Cephes expf (range reduction by ln 2 in two parts, degree-6 polynomial),
// relative error below 1e-7 (Moshier, Cephes Math Library, expf.c). Every
// lane takes exactly these roundings, so a value's result does not depend
// on its lane or its neighbours.
inline __m256 Exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_floor_ps(
      _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504f), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 mantissa =
      _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  // n <= 127 after the clamp, so the biased exponent stays below 255.
  const __m256i exponent =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(mantissa, _mm256_castsi256_ps(exponent));
}

}  // namespace headway::cpu::avx2
