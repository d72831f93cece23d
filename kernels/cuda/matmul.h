// Linear layers on a CUDA device: y = x * W^T with W stored as bf16
// (dequantised from the GGUF file at load) through cuBLAS, and a fused
// dequantising GEMV that reads the file's quantised blocks directly for
// decode-sized batches. Layouts as kernels/matmul.h: x [m, k] f32 row-major,
// W [n, k] row-major (rows are outputs), y [m, n] f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/gguf.h"
#include "common/status.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/runtime.h"

namespace headway::cuda {

struct CublasLibrary;  // cublas_library.h

// A cuBLAS handle bound to one stream and its scratch: the bf16 copy of the
// activations. Not thread-safe; one per worker.
class Blas {
 public:
  // Opens cuBLAS on first use (cublas_library.h).
  // Errors: Unavailable when cuBLAS cannot be opened or cannot start (the
  // message has the loader's reason or cuBLAS's status).
  static Result<std::unique_ptr<Blas>> Create(Stream stream);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // y = x * W^T: x is rounded to bf16 (F32ToBf16 into scratch grown as
  // needed), then cublasGemmEx with bf16 inputs, f32 accumulation
  // (CUBLAS_COMPUTE_32F) and f32 output.
  //   x: [m, k] f32; w: [n, k] bf16; y: [m, n] f32 (device)
  // Errors: Unavailable from cuBLAS or a failed scratch allocation.
  Status MatmulTransB(const float* x, const bf16_bits* w, int m, int n, int k, float* y);

  // y = a * b^T with bf16 inputs already in place, the raw cuBLAS figure the
  // GEMM micro-benchmark compares against.
  Status GemmBf16(const bf16_bits* a, const bf16_bits* b, int m, int n, int k, float* y);

  Stream stream() const { return stream_; }

 private:
  Blas(const CublasLibrary* lib, void* handle, Stream stream)
      : lib_(lib), handle_(handle), stream_(stream) {}
  const CublasLibrary* lib_;
  void* handle_;  // cublasHandle_t
  Stream stream_;
  DeviceBuffer x_bf16_;
};

// True for the weight types DequantGemv reads: Q8_0, Q4_0, Q4_1, Q5_0, Q4_K,
// Q6_K and F16 (kernels/quant_matmul.h draws their blocks).
bool DequantGemvSupported(GgmlType type);

// y = x * W^T for small m, W kept in its GGUF blocks on the device
// (kernels/quant_matmul.h layouts: row i at w_quant + i * row_bytes).
// Weights are dequantised in registers exactly as worker/dequant.h does;
// activations stay f32; f32 accumulation. One warp per output row reads the
// row once for all m activation rows.
//   x: [m, k] f32; y: [m, n] f32
// REQUIRES: DequantGemvSupported(type); 1 <= m <= kMaxDequantGemvRows;
// k % 32 == 0 (k % 256 == 0 for Q4_K and Q6_K); n >= 1. A call that breaks
// them launches nothing and leaves y as it was (validate shapes when the
// weights load). w_quant needs no alignment: blocks are read bytewise.
constexpr int kMaxDequantGemvRows = 8;
void DequantGemv(const float* x, const uint8_t* w_quant, GgmlType type, int m, int n, int k,
                 float* y, Stream stream);

}  // namespace headway::cuda
