// The paired prefill sweep of QuantMatmulTransBF32Act (quant_paired_sweep.inc
// draws the layout): two weight rows per 16-lane vector. Internal to
// kernels/cpu.
#pragma once

namespace headway::cpu::paired {

// True where the CPU and the OS run AVX-512F code (CPUID and XCR0, as
// __builtin_cpu_supports reads them).
bool CpuHasAvx512();

// y[r, i0 + c] = x[r, :] . (weight row c of the group) for r < m, c < rows,
// from the group's weights in the paired layout at `wp` ((rows + 1) / 2
// pairs of 2k floats); y is [m, n] row-major. The bits of the AVX2 scratch
// tiles. REQUIRES: k % 8 == 0, 0 < rows, i0 + rows <= n.
//   Avx512: one zmm register per pair. REQUIRES: CpuHasAvx512().
//   Avx2: the same code on two ymm registers per pair, for tests on any
//         AVX2 machine (slower: it spills).
void SweepAvx512(const float* x, const float* wp, int rows, int m, int i0, int n, int k,
                 float* y);
void SweepAvx2(const float* x, const float* wp, int rows, int m, int i0, int n, int k,
               float* y);

}  // namespace headway::cpu::paired
