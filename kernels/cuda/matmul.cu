// Linear layers on a CUDA device: cuBLAS bf16 GEMMs for dequantised weights
// and a dequantising GEMV over GGUF blocks for decode batches.
//
// DequantGemv layout of work: one warp per weight row (output column of y),
// kRowsPerCta rows per CTA. The warp walks the row in groups of 8 values;
// lane l takes groups l, l + 32, l + 64, ... . A group never straddles a
// block (8 divides 32 and 256), so a lane dequantises its 8 weights from one
// block with byte loads (GGUF blocks are 18, 20, 22, 34, 144 or 210 bytes, so
// block starts are not 4-byte aligned and wide loads would be misaligned),
// then multiplies them with the matching 8 activations of each of the m
// rows. Per-lane sums are combined with a warp butterfly.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/cublas_library.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul.h"
#include "kernels/quant_blocks.h"

namespace headway::cuda {
namespace {

Status CublasError(const CublasLibrary& lib, const char* what, cublasStatus_t status) {
  return Status::Unavailable(std::string(what) + ": cuBLAS error " + lib.status_name(status) +
                             ": " + lib.status_string(status));
}

cublasHandle_t Handle(void* handle) { return static_cast<cublasHandle_t>(handle); }

// ---- Dequantising GEMV ----

constexpr int kGroup = 8;       // weights a lane dequantises at once
constexpr int kRowsPerCta = 4;  // one warp per weight row
constexpr int kGemvThreads = 32 * kRowsPerCta;
static_assert(32 % kGroup == 0 && 256 % kGroup == 0, "a group must not straddle a block");

__device__ __forceinline__ float HalfAt(const uint8_t* p) {
  const unsigned short bits = (unsigned short)(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(bits));  // exact, subnormals and inf included
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K super-block
// (ggml-quants.c get_scale_min_k4, as worker/dequant.cc ScaleMinK4).
__device__ __forceinline__ void ScaleMinK4(int j, const uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

template <GgmlType kType>
struct Block;
// kValues values per block of kBytes bytes; Load writes the kGroup weights
// starting at value `j0` (a multiple of kGroup, < kValues) of the block at
// `b`, with worker/dequant.cc's formulas (multiplications in its order;
// Q4_1 and Q4_K's last step as one FMA, as kernels/quant_matmul.h's f32
// path computes them).
template <>
struct Block<GgmlType::kQ8_0> {
  static constexpr int kValues = 32, kBytes = 34;
  __device__ static void Load(const uint8_t* b, int j0, float* w) {
    const float d = HalfAt(b);
#pragma unroll
    for (int i = 0; i < kGroup; ++i) w[i] = float(int8_t(b[2 + j0 + i])) * d;
  }
};
template <>
struct Block<GgmlType::kQ4_0> {
  static constexpr int kValues = 32, kBytes = 18;
  __device__ static void Load(const uint8_t* b, int j0, float* w) {
    const float d = HalfAt(b);
    const uint8_t* qs = b + 2 + (j0 % 16);
    const int shift = j0 < 16 ? 0 : 4;  // values 16..31 are the high nibbles
#pragma unroll
    for (int i = 0; i < kGroup; ++i) w[i] = float(((qs[i] >> shift) & 0x0F) - 8) * d;
  }
};
template <>
struct Block<GgmlType::kQ4_1> {
  static constexpr int kValues = 32, kBytes = 20;
  __device__ static void Load(const uint8_t* b, int j0, float* w) {
    const float d = HalfAt(b), m = HalfAt(b + 2);
    const uint8_t* qs = b + 4 + (j0 % 16);
    const int shift = j0 < 16 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < kGroup; ++i) w[i] = fmaf(float((qs[i] >> shift) & 0x0F), d, m);
  }
};
template <>
struct Block<GgmlType::kQ5_0> {
  static constexpr int kValues = 32, kBytes = 22;
  __device__ static void Load(const uint8_t* b, int j0, float* w) {
    const float d = HalfAt(b);
    const uint32_t qh = uint32_t(b[2]) | (uint32_t(b[3]) << 8) | (uint32_t(b[4]) << 16) |
                        (uint32_t(b[5]) << 24);  // bit j: the 5th bit of value j
    const uint8_t* qs = b + 6 + (j0 % 16);
    const int shift = j0 < 16 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const int q = ((qs[i] >> shift) & 0x0F) | int(((qh >> (j0 + i)) & 1u) << 4);
      w[i] = float(q - 16) * d;
    }
  }
};
template <>
struct Block<GgmlType::kF16> {
  static constexpr int kValues = 32, kBytes = 64;
  __device__ static void Load(const uint8_t* b, int j0, float* w) {
#pragma unroll
    for (int i = 0; i < kGroup; ++i) w[i] = HalfAt(b + 2 * (j0 + i));
  }
};
// f16 d | f16 dmin | u8 scales[12] | u8 qs[128]: 64-value chunk c holds
// sub-block 2c in the low nibbles of qs[32c .. 32c + 31] and 2c + 1 in the
// high nibbles.
template <>
struct Block<GgmlType::kQ4_K> {
  static constexpr int kValues = 256, kBytes = 144;
  __device__ static void Load(const uint8_t* b, int j0, float* w) {
    const float d = HalfAt(b), dmin = HalfAt(b + 2);
    const int chunk = j0 / 64, in_chunk = j0 % 64;
    const int sub = 2 * chunk + (in_chunk < 32 ? 0 : 1);
    int sc = 0, mn = 0;
    ScaleMinK4(sub, b + 4, &sc, &mn);
    const float d1 = d * float(sc), m1 = dmin * float(mn);
    const uint8_t* qs = b + 16 + 32 * chunk + (in_chunk % 32);
    const int shift = in_chunk < 32 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < kGroup; ++i) w[i] = fmaf(d1, float((qs[i] >> shift) & 0x0F), -m1);
  }
};
// u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d: value j in half
// h = j / 128, quarter g = (j % 128) / 32, l = j % 32 has its low 4 bits in
// ql[64h + 32(g % 2) + l] (high nibble for g >= 2), its top 2 bits in bits
// 2g, 2g + 1 of qh[32h + l], and scale scales[8h + 2g + l / 16].
template <>
struct Block<GgmlType::kQ6_K> {
  static constexpr int kValues = 256, kBytes = 210;
  __device__ static void Load(const uint8_t* b, int j0, float* w) {
    const float d = HalfAt(b + 208);
    const int h = j0 / 128, g = (j0 % 128) / 32, l0 = j0 % 32;
    const uint8_t* ql = b + 64 * h + 32 * (g % 2) + l0;
    const uint8_t* qh = b + 128 + 32 * h + l0;
    const int ql_shift = g < 2 ? 0 : 4;
    // The 8 values share one 16-value scale: l0 is a multiple of 8.
    const float scale = float(int8_t(b[192 + 8 * h + 2 * g + l0 / 16]));
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const int q = (((ql[i] >> ql_shift) & 0x0F) | (((qh[i] >> (2 * g)) & 3) << 4)) - 32;
      w[i] = d * scale * float(q);
    }
  }
};

template <GgmlType kType>
__global__ void __launch_bounds__(kGemvThreads)
    DequantGemvKernel(const float* x, const uint8_t* w_quant, int m, int n, int k, float* y) {
  using B = Block<kType>;
  static_assert(B::kValues % kGroup == 0);
  static_assert(B::kValues == quant::BlockValues(kType) && B::kBytes == quant::BlockBytes(kType));
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kRowsPerCta + threadIdx.x / 32;
  if (row >= n) return;  // whole warps leave together: the shuffles below stay full
  const size_t row_bytes = size_t(k / B::kValues) * B::kBytes;
  const uint8_t* wr = w_quant + size_t(row) * row_bytes;

  float acc[kMaxDequantGemvRows];
#pragma unroll
  for (int r = 0; r < kMaxDequantGemvRows; ++r) acc[r] = 0.0f;

  const int n_groups = k / kGroup;
  for (int g = lane; g < n_groups; g += 32) {
    const int j = g * kGroup;  // first value of the group in the row
    float w[kGroup];
    B::Load(wr + size_t(j / B::kValues) * B::kBytes, j % B::kValues, w);
#pragma unroll
    for (int r = 0; r < kMaxDequantGemvRows; ++r) {
      if (r < m) {
        const float* xr = x + size_t(r) * k + j;
#pragma unroll
        for (int i = 0; i < kGroup; ++i) acc[r] = fmaf(w[i], xr[i], acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kMaxDequantGemvRows; ++r) {
    if (r < m) {
      float v = acc[r];
      for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
      if (lane == 0) y[size_t(r) * n + row] = v;
    }
  }
}

template <GgmlType kType>
void LaunchDequantGemv(const float* x, const uint8_t* w_quant, int m, int n, int k, float* y,
                       Stream stream) {
  const unsigned grid = unsigned((n + kRowsPerCta - 1) / kRowsPerCta);
  DequantGemvKernel<kType><<<grid, kGemvThreads, 0, stream>>>(x, w_quant, m, n, k, y);
}

__global__ void ZeroKernel(float* y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    y[i] = 0.0f;
  }
}

void Zero(float* y, int64_t n, Stream stream) {
  if (n <= 0) return;
  const int64_t blocks = (n + 255) / 256;
  ZeroKernel<<<unsigned(blocks < 65535 ? blocks : 65535), 256, 0, stream>>>(y, n);
}

}  // namespace

Result<std::unique_ptr<Blas>> Blas::Create(Stream stream) {
  HW_ASSIGN_OR_RETURN(const CublasLibrary* lib, OpenCublas());
  cublasHandle_t handle = nullptr;
  if (cublasStatus_t s = lib->create(&handle); s != CUBLAS_STATUS_SUCCESS) {
    return CublasError(*lib, "cublasCreate", s);
  }
  cublasStatus_t s = lib->set_stream(handle, stream);
  if (s == CUBLAS_STATUS_SUCCESS) s = lib->set_math_mode(handle, CUBLAS_DEFAULT_MATH);
  if (s != CUBLAS_STATUS_SUCCESS) {
    lib->destroy(handle);
    return CublasError(*lib, "cublasSetStream / cublasSetMathMode", s);
  }
  return std::unique_ptr<Blas>(new Blas(lib, handle, stream));
}

Blas::~Blas() {
  if (handle_ != nullptr) lib_->destroy(Handle(handle_));
}

Status Blas::MatmulTransB(const float* x, const bf16_bits* w, int m, int n, int k, float* y) {
  if (m < 0 || n < 0 || k < 0) return Status::InvalidArgument("MatmulTransB: negative shape");
  if (m == 0 || n == 0) return Status::Ok();
  if (k == 0) {  // an empty sum; cuBLAS would leave y untouched
    Zero(y, int64_t(m) * n, stream_);
    return Status::Ok();
  }
  const size_t need = size_t(m) * size_t(k) * sizeof(bf16_bits);
  if (x_bf16_.bytes() < need) {
    // Grow geometrically so a batch that creeps up does not reallocate every
    // step. cudaFree inside the old buffer's destructor waits for the device,
    // so no enqueued GEMM still reads it.
    x_bf16_ = DeviceBuffer();
    const size_t grown = need + need / 2;
    HW_ASSIGN_OR_RETURN(x_bf16_, DeviceBuffer::Allocate(grown));
  }
  bf16_bits* x_bf16 = x_bf16_.as<bf16_bits>();
  F32ToBf16(x, int64_t(m) * k, x_bf16, stream_);
  return GemmBf16(x_bf16, w, m, n, k, y);
}

Status Blas::GemmBf16(const bf16_bits* a, const bf16_bits* b, int m, int n, int k, float* y) {
  if (m < 0 || n < 0 || k < 0) return Status::InvalidArgument("GemmBf16: negative shape");
  if (m == 0 || n == 0) return Status::Ok();
  if (k == 0) {
    Zero(y, int64_t(m) * n, stream_);
    return Status::Ok();
  }
  // cuBLAS is column-major. A row-major matrix [r, c] with leading dimension
  // c is, to cuBLAS, the column-major matrix [c, r]: its transpose. So:
  //   y row-major [m, n]  = column-major C [n, m] = y^T, ldc = n;
  //   b row-major [n, k]  = column-major [k, n] = b^T, ld k: op T gives b;
  //   a row-major [m, k]  = column-major [k, m] = a^T, ld k: op N keeps a^T.
  // y = a b^T  <=>  y^T = b a^T, i.e. C [n, m] = op_T(B_mem) [n, k] x
  // op_N(A_mem) [k, m] with cuBLAS's (M, N, K) = (n, m, k), the weight matrix
  // as cuBLAS's A and the activations as its B.
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t s = lib_->gemm_ex(Handle(handle_), CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha,
                                         b, CUDA_R_16BF, k, a, CUDA_R_16BF, k, &beta, y,
                                         CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) return CublasError(*lib_, "cublasGemmEx (bf16)", s);
  return Status::Ok();
}

bool DequantGemvSupported(GgmlType type) { return quant::IsKernelBlockType(type); }

void DequantGemv(const float* x, const uint8_t* w_quant, GgmlType type, int m, int n, int k,
                 float* y, Stream stream) {
  // Shapes are the caller's bug, validated when weights load; launch nothing
  // rather than read out of bounds.
  if (m < 1 || m > kMaxDequantGemvRows || n <= 0 || k <= 0 || k % 32 != 0) return;
  switch (type) {
    case GgmlType::kQ8_0:
      LaunchDequantGemv<GgmlType::kQ8_0>(x, w_quant, m, n, k, y, stream);
      break;
    case GgmlType::kQ4_0:
      LaunchDequantGemv<GgmlType::kQ4_0>(x, w_quant, m, n, k, y, stream);
      break;
    case GgmlType::kQ4_1:
      LaunchDequantGemv<GgmlType::kQ4_1>(x, w_quant, m, n, k, y, stream);
      break;
    case GgmlType::kQ5_0:
      LaunchDequantGemv<GgmlType::kQ5_0>(x, w_quant, m, n, k, y, stream);
      break;
    case GgmlType::kF16:
      LaunchDequantGemv<GgmlType::kF16>(x, w_quant, m, n, k, y, stream);
      break;
    case GgmlType::kQ4_K:
      if (k % 256 == 0) LaunchDequantGemv<GgmlType::kQ4_K>(x, w_quant, m, n, k, y, stream);
      break;
    case GgmlType::kQ6_K:
      if (k % 256 == 0) LaunchDequantGemv<GgmlType::kQ6_K>(x, w_quant, m, n, k, y, stream);
      break;
    default:
      break;
  }
}

}  // namespace headway::cuda
