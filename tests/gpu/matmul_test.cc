// kernels/cuda/matmul.h against double-accumulating references.
//
// Blas::MatmulTransB is compared with reference::MatmulTransB applied to the
// bf16-ROUNDED x and W, so the only difference left is cuBLAS's f32
// accumulation order: |y - want| <= 1e-4 * sum_l |x_l w_l| + 1e-6 (the
// recursive-summation bound at k = 4096 is 2.4e-4 of it, random data stays
// orders of magnitude below; a wrong transpose is off by O(1) of it).
//
// DequantGemv is compared with headway::Dequantize (worker/dequant.h) of the
// same blocks followed by a double dot: its weights are exact (up to Q4_1 /
// Q4_K's FMA, one f32 rounding of a weight), so only f32 accumulation is
// left: 2e-5 * sum_l |x_l w_l| + 1e-6, with (k / 256 + 5) * 2^-24 the
// worst-case bound of its per-lane-then-butterfly order at k <= 2048.
#include "kernels/cuda/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/cublas_library.h"
#include "kernels/reference/reference.h"
#include "tests/gpu/gpu_test.h"
#include "tests/support/gguf_writer.h"
#include "worker/dequant.h"

namespace headway {
namespace {

using testing::RecordError;
using testing::Sync;
using testing::ToDevice;
using testing::ToHost;

// Per output (r, i): the largest |got - want| / (rel * sum_l |x_l w_l| + 1e-6);
// <= 1 passes. Also reports the largest absolute error.
struct ErrorStats {
  double max_ratio = 0.0;
  double max_abs = 0.0;
};

ErrorStats Compare(const std::vector<float>& got, const std::vector<float>& x,
                   const std::vector<float>& w, int m, int n, int k, double rel) {
  ErrorStats stats;
  for (int r = 0; r < m; ++r) {
    for (int i = 0; i < n; ++i) {
      double want = 0.0, abs_dot = 0.0;
      for (int l = 0; l < k; ++l) {
        const double p = double(x[size_t(r) * k + l]) * double(w[size_t(i) * k + l]);
        want += p;
        abs_dot += std::fabs(p);
      }
      const double err = std::fabs(double(got[size_t(r) * n + i]) - want);
      const double ratio = err / (rel * abs_dot + 1e-6);
      if (std::isnan(err)) return {INFINITY, INFINITY};
      stats.max_ratio = std::max(stats.max_ratio, ratio);
      stats.max_abs = std::max(stats.max_abs, err);
    }
  }
  return stats;
}

std::vector<float> NormalFloats(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  // A few large activations, as in real hidden states.
  for (size_t i = 0; i < v.size(); i += 97) v[i] *= 20.0f;
  return v;
}

struct Shape {
  int m, n, k;
};

std::string Name(const Shape& s) {
  return "m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k);
}

// cuBLAS is opened at run time, not linked: opening it needs the toolkit's
// library, not a GPU, so this runs on every machine that builds CUDA code.
TEST(CudaMatmul, CublasOpensWithoutAGpuAndOnce) {
  Result<const cuda::CublasLibrary*> lib = cuda::OpenCublas();
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  EXPECT_STREQ((*lib)->status_name(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  EXPECT_NE((*lib)->gemm_ex, nullptr);
  Result<const cuda::CublasLibrary*> again = cuda::OpenCublas();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *lib);
}

TEST(CudaMatmul, MatmulTransBMatchesReferenceOnRoundedInputs) {
  HW_SKIP_WITHOUT_GPU();
  auto blas = cuda::Blas::Create(nullptr);
  ASSERT_TRUE(blas.ok()) << blas.status().ToString();
  // Growing then shrinking m exercises the scratch growth.
  for (const Shape s : {Shape{1, 576, 576}, Shape{4, 1536, 576}, Shape{8, 576, 1536},
                        Shape{33, 130, 72}, Shape{3, 7, 5}, Shape{128, 640, 640},
                        Shape{64, 256, 4096}, Shape{2, 49152, 576}, Shape{1, 1, 1}}) {
    for (uint64_t seed : {1u, 2u}) {
      SCOPED_TRACE(Name(s) + " seed=" + std::to_string(seed));
      std::mt19937_64 rng(seed);
      std::vector<float> x = NormalFloats(size_t(s.m) * s.k, rng);
      const std::vector<float> w_f32 = NormalFloats(size_t(s.n) * s.k, rng);
      std::vector<bf16_bits> w(w_f32.size());
      std::vector<float> w_rounded(w_f32.size()), x_rounded(x.size());
      for (size_t i = 0; i < w.size(); ++i) {
        w[i] = FloatToBf16(w_f32[i]);
        w_rounded[i] = Bf16ToFloat(w[i]);
      }
      for (size_t i = 0; i < x.size(); ++i) x_rounded[i] = Bf16ToFloat(FloatToBf16(x[i]));

      cuda::DeviceBuffer d_x = ToDevice(x), d_w = ToDevice(w);
      cuda::DeviceBuffer d_y = ToDevice(std::vector<float>(size_t(s.m) * s.n, std::nanf("")));
      const Status st = (*blas)->MatmulTransB(d_x.as<float>(), d_w.as<bf16_bits>(), s.m, s.n, s.k,
                                              d_y.as<float>());
      ASSERT_TRUE(st.ok()) << st.ToString();
      Sync("MatmulTransB");
      const std::vector<float> got = ToHost<float>(d_y.data(), size_t(s.m) * s.n);
      const ErrorStats e = Compare(got, x_rounded, w_rounded, s.m, s.n, s.k, 1e-4);
      EXPECT_LE(RecordError(e.max_ratio, "max_error_over_bound"), 1.0)
          << "max error / bound; max abs error " << e.max_abs;

      // The same product from bf16 activations already in place.
      std::vector<bf16_bits> x_bf16(x.size());
      for (size_t i = 0; i < x.size(); ++i) x_bf16[i] = FloatToBf16(x[i]);
      cuda::DeviceBuffer d_xb = ToDevice(x_bf16);
      const Status st2 = (*blas)->GemmBf16(d_xb.as<bf16_bits>(), d_w.as<bf16_bits>(), s.m, s.n, s.k,
                                           d_y.as<float>());
      ASSERT_TRUE(st2.ok()) << st2.ToString();
      Sync("GemmBf16");
      const std::vector<float> got2 = ToHost<float>(d_y.data(), size_t(s.m) * s.n);
      const ErrorStats e2 = Compare(got2, x_rounded, w_rounded, s.m, s.n, s.k, 1e-4);
      EXPECT_LE(RecordError(e2.max_ratio, "max_error_over_bound"), 1.0)
          << "GemmBf16 max error / bound; max abs error " << e2.max_abs;
    }
  }
}

TEST(CudaMatmul, MatmulTransBWithEmptySumWritesZeros) {
  HW_SKIP_WITHOUT_GPU();
  auto blas = cuda::Blas::Create(nullptr);
  ASSERT_TRUE(blas.ok()) << blas.status().ToString();
  cuda::DeviceBuffer d_x = ToDevice(std::vector<float>(4, 1.0f));
  cuda::DeviceBuffer d_w = ToDevice(std::vector<bf16_bits>(4, FloatToBf16(1.0f)));
  cuda::DeviceBuffer d_y = ToDevice(std::vector<float>(6, std::nanf("")));
  ASSERT_TRUE(
      (*blas)->MatmulTransB(d_x.as<float>(), d_w.as<bf16_bits>(), 2, 3, 0, d_y.as<float>()).ok());
  Sync("MatmulTransB k=0");
  for (float v : ToHost<float>(d_y.data(), 6)) EXPECT_EQ(v, 0.0f);
}

// ---- DequantGemv ----

bool IsK(GgmlType type) { return type == GgmlType::kQ4_K || type == GgmlType::kQ6_K; }

int BlockValues(GgmlType type) { return IsK(type) ? 256 : 32; }

int BlockBytes(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
      return 34;
    case GgmlType::kQ4_0:
      return 18;
    case GgmlType::kQ4_1:
      return 20;
    case GgmlType::kQ5_0:
      return 22;
    case GgmlType::kQ4_K:
      return 144;
    case GgmlType::kQ6_K:
      return 210;
    default:
      return 64;  // F16: 32 values
  }
}

void PutHalf(uint8_t* p, float f) {
  const uint16_t h = testing::FloatToHalf(f);
  std::memcpy(p, &h, 2);
}

// n rows of k values: random quant bytes with finite, sane f16 scales
// (every bit of every quant, sub-block scale and min is exercised).
std::vector<uint8_t> RandomBlocks(GgmlType type, int n, int k, std::mt19937_64& rng) {
  std::vector<uint8_t> bytes(size_t(n) * (k / BlockValues(type)) * BlockBytes(type));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (uint8_t& v : bytes) v = uint8_t(byte(rng));
  for (size_t off = 0; off < bytes.size(); off += BlockBytes(type)) {
    uint8_t* b = &bytes[off];
    switch (type) {
      case GgmlType::kF16:
        for (int j = 0; j < 32; ++j) PutHalf(b + 2 * j, 2.0f * unit(rng) - 1.0f);
        break;
      case GgmlType::kQ4_K:                            // sub-block scales up to 63, quants up to 15
        PutHalf(b, 0.0001f + 0.002f * unit(rng));      // d
        PutHalf(b + 2, 0.0001f + 0.002f * unit(rng));  // dmin
        break;
      case GgmlType::kQ6_K:  // |scale * (q - 32)| <= 4096
        PutHalf(b + 208, 0.00005f + 0.0005f * unit(rng));
        break;
      case GgmlType::kQ4_1:
        PutHalf(b, 0.001f + 0.1f * unit(rng));  // d
        PutHalf(b + 2, -0.8f * unit(rng));      // m, the block minimum
        break;
      default:  // Q8_0, Q4_0, Q5_0: the block scale
        PutHalf(b, (0.001f + 0.1f * unit(rng)) * (unit(rng) < 0.5f ? -1.0f : 1.0f));
    }
  }
  return bytes;
}

TEST(CudaMatmul, DequantGemvMatchesDequantize) {
  HW_SKIP_WITHOUT_GPU();
  const GgmlType types[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                            GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kF16};
  for (GgmlType type : types) {
    ASSERT_TRUE(cuda::DequantGemvSupported(type)) << GgmlTypeName(type);
    std::vector<Shape> shapes;
    for (int m : {1, 3, 8}) {
      if (IsK(type)) {
        for (const auto& [n, k] :
             {std::pair{37, 256}, std::pair{20, 1536}, std::pair{3, 2048}, std::pair{640, 1024}}) {
          shapes.push_back({m, n, k});
        }
      } else {
        for (const auto& [n, k] : {std::pair{37, 576}, std::pair{64, 1536}, std::pair{5, 32},
                                   std::pair{1536, 576}, std::pair{576, 1536}}) {
          shapes.push_back({m, n, k});
        }
      }
    }
    for (const Shape s : shapes) {
      for (uint64_t seed : {7u, 8u}) {
        SCOPED_TRACE(GgmlTypeName(type) + " " + Name(s) + " seed=" + std::to_string(seed));
        std::mt19937_64 rng(seed);
        const std::vector<float> x = NormalFloats(size_t(s.m) * s.k, rng);
        const std::vector<uint8_t> wq = RandomBlocks(type, s.n, s.k, rng);
        std::vector<float> w(size_t(s.n) * s.k);
        const Status dq = Dequantize(type, wq.data(), w.data(), w.size());
        ASSERT_TRUE(dq.ok()) << dq.ToString();

        cuda::DeviceBuffer d_x = ToDevice(x), d_w = ToDevice(wq);
        cuda::DeviceBuffer d_y = ToDevice(std::vector<float>(size_t(s.m) * s.n, std::nanf("")));
        cuda::DequantGemv(d_x.as<float>(), d_w.as<uint8_t>(), type, s.m, s.n, s.k, d_y.as<float>(),
                          nullptr);
        Sync("DequantGemv");
        const std::vector<float> got = ToHost<float>(d_y.data(), size_t(s.m) * s.n);
        const ErrorStats e = Compare(got, x, w, s.m, s.n, s.k, 2e-5);
        EXPECT_LE(RecordError(e.max_ratio, "max_error_over_bound"), 1.0)
            << "max error / bound; max abs error " << e.max_abs;
      }
    }
  }
}

TEST(CudaMatmul, DequantGemvSupportsTheListedTypesOnly) {
  HW_SKIP_WITHOUT_GPU();
  EXPECT_FALSE(cuda::DequantGemvSupported(GgmlType::kF32));
  EXPECT_FALSE(cuda::DequantGemvSupported(GgmlType::kBF16));
  EXPECT_TRUE(cuda::DequantGemvSupported(GgmlType::kQ6_K));
}

}  // namespace
}  // namespace headway
