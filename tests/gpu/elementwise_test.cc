// kernels/cuda/elementwise.h against the CPU backend (kernels/cpu): random
// shapes over several seeds, odd sizes included, reporting the largest error.
//
// Tolerances: embedding, add, gather and the bf16 conversion are exact.
// RMSNorm sums in f32 where the CPU sums in double: relative error about
// dim * 2^-24 in the scale at worst, far less for random data; 1e-5 relative
// to max|out| catches any real bug (a wrong row or weight is off by O(1)).
// RoPE computes the same double angles, so cos and sin agree to an ulp of
// f32 and the rotation (|x| <= 1) to a few 1e-7. The activations use the
// device's expf / tanhf (2 ulp) against the host libm: 1e-5 relative, plus
// GELU's cancellation term (MaxErrorRatio).
#include "kernels/cuda/elementwise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/bf16.h"
#include "kernels/elementwise.h"
#include "tests/gpu/gpu_test.h"

namespace headway {
namespace {

using testing::MaxAbsDiff;
using testing::RandomFloats;
using testing::RecordError;
using testing::Sync;
using testing::ToDevice;
using testing::ToHost;

double MaxAbs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, std::fabs(double(x)));
  return m;
}

TEST(CudaElementwise, EmbeddingShardMatchesCpu) {
  HW_SKIP_WITHOUT_GPU();
  struct Case {
    int row_begin, row_end, n, dim;
    float scale;
  };
  for (const Case c : {Case{0, 100, 7, 576, 1.0f}, Case{50, 130, 33, 640, 25.3f},
                       Case{1000, 1003, 5, 1536, 0.5f}, Case{0, 1, 1, 1, 1.0f}}) {
    for (uint64_t seed : {1u, 2u}) {
      SCOPED_TRACE("rows [" + std::to_string(c.row_begin) + ", " + std::to_string(c.row_end) +
                   ") n=" + std::to_string(c.n) + " dim=" + std::to_string(c.dim) +
                   " seed=" + std::to_string(seed));
      const int rows = c.row_end - c.row_begin;
      const std::vector<float> values = RandomFloats(size_t(rows) * c.dim, seed, -2.0f, 2.0f);
      std::vector<bf16_bits> table(values.size());
      std::vector<float> table_f32(values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        table[i] = FloatToBf16(values[i]);
        table_f32[i] = Bf16ToFloat(table[i]);
      }
      // Ids inside and outside [row_begin, row_end), both edges included.
      std::mt19937_64 rng(seed);
      std::uniform_int_distribution<int> id_dist(0, c.row_end + 20);
      std::vector<int32_t> ids(c.n);
      for (int32_t& id : ids) id = id_dist(rng);
      ids[0] = c.row_begin;
      if (c.n > 1) ids[1] = c.row_end - 1;
      if (c.n > 2) ids[2] = c.row_end;

      std::vector<float> want(size_t(c.n) * c.dim);
      cpu::EmbeddingShard(table_f32.data(), c.row_begin, c.row_end, ids.data(), c.n, c.dim,
                          want.data());
      for (float& v : want) v *= c.scale;

      cuda::DeviceBuffer d_table = ToDevice(table), d_ids = ToDevice(ids);
      cuda::DeviceBuffer d_out = ToDevice(std::vector<float>(want.size(), std::nanf("")));
      cuda::EmbeddingShard(d_table.as<bf16_bits>(), c.row_begin, c.row_end, d_ids.as<int32_t>(),
                           c.n, c.dim, c.scale, d_out.as<float>(), nullptr);
      Sync("EmbeddingShard");
      const double err = MaxAbsDiff(ToHost<float>(d_out.data(), want.size()), want);
      EXPECT_LE(RecordError(err), 0.0) << "max abs error";
      // The f32 table (the exact path) gives the same values.
      cuda::DeviceBuffer d_table_f32 = ToDevice(table_f32);
      cuda::EmbeddingShard(d_table_f32.as<float>(), c.row_begin, c.row_end, d_ids.as<int32_t>(),
                           c.n, c.dim, c.scale, d_out.as<float>(), nullptr);
      Sync("EmbeddingShard f32");
      EXPECT_LE(RecordError(MaxAbsDiff(ToHost<float>(d_out.data(), want.size()), want)), 0.0)
          << "f32 table: max abs error";
    }
  }
}

TEST(CudaElementwise, RmsNormMatchesCpu) {
  HW_SKIP_WITHOUT_GPU();
  struct Case {
    int n_rows, dim;
  };
  for (const Case c : {Case{1, 576}, Case{3, 640}, Case{7, 1536}, Case{5, 100}, Case{2, 4096},
                       Case{300, 64}, Case{1, 1}}) {
    for (uint64_t seed : {11u, 12u, 13u}) {
      SCOPED_TRACE("n_rows=" + std::to_string(c.n_rows) + " dim=" + std::to_string(c.dim) +
                   " seed=" + std::to_string(seed));
      const float eps = 1e-6f;
      const std::vector<float> x = RandomFloats(size_t(c.n_rows) * c.dim, seed, -3.0f, 3.0f);
      const std::vector<float> w = RandomFloats(c.dim, seed + 100, 0.5f, 1.5f);
      std::vector<float> want(x.size());
      cpu::RmsNorm(x.data(), w.data(), c.n_rows, c.dim, eps, want.data());
      const double tol = 1e-5 * std::max(1.0, MaxAbs(want));

      cuda::DeviceBuffer d_x = ToDevice(x), d_w = ToDevice(w);
      cuda::DeviceBuffer d_out = ToDevice(std::vector<float>(x.size(), std::nanf("")));
      cuda::RmsNorm(d_x.as<float>(), d_w.as<float>(), c.n_rows, c.dim, eps, d_out.as<float>(),
                    nullptr);
      Sync("RmsNorm");
      EXPECT_LE(RecordError(MaxAbsDiff(ToHost<float>(d_out.data(), x.size()), want)), tol)
          << "max abs error, out of place";

      // In place (x and out alias).
      cuda::RmsNorm(d_x.as<float>(), d_w.as<float>(), c.n_rows, c.dim, eps, d_x.as<float>(),
                    nullptr);
      Sync("RmsNorm in place");
      EXPECT_LE(RecordError(MaxAbsDiff(ToHost<float>(d_x.data(), x.size()), want)), tol)
          << "max abs error, in place";
    }
  }
}

TEST(CudaElementwise, AddRmsNormMatchesCpu) {
  HW_SKIP_WITHOUT_GPU();
  struct Case {
    int n_rows, dim;
  };
  for (const Case c : {Case{1, 576}, Case{4, 640}, Case{9, 1536}, Case{3, 333}}) {
    for (uint64_t seed : {21u, 22u}) {
      SCOPED_TRACE("n_rows=" + std::to_string(c.n_rows) + " dim=" + std::to_string(c.dim) +
                   " seed=" + std::to_string(seed));
      const float eps = 1e-5f;
      const size_t size = size_t(c.n_rows) * c.dim;
      const std::vector<float> residual = RandomFloats(size, seed, -2.0f, 2.0f);
      const std::vector<float> x = RandomFloats(size, seed + 1, -2.0f, 2.0f);
      const std::vector<float> w = RandomFloats(c.dim, seed + 2, -1.5f, 1.5f);
      std::vector<float> want_sum = residual, want_norm(size);
      cpu::AddInPlace(want_sum.data(), x.data(), int64_t(size));
      cpu::RmsNorm(want_sum.data(), w.data(), c.n_rows, c.dim, eps, want_norm.data());

      cuda::DeviceBuffer d_out = ToDevice(residual), d_x = ToDevice(x), d_w = ToDevice(w);
      cuda::DeviceBuffer d_normed = ToDevice(std::vector<float>(size, std::nanf("")));
      cuda::AddRmsNorm(d_out.as<float>(), d_x.as<float>(), d_w.as<float>(), c.n_rows, c.dim, eps,
                       d_normed.as<float>(), nullptr);
      Sync("AddRmsNorm");
      EXPECT_LE(RecordError(MaxAbsDiff(ToHost<float>(d_out.data(), size), want_sum)), 0.0)
          << "max abs error of the sum";
      EXPECT_LE(RecordError(MaxAbsDiff(ToHost<float>(d_normed.data(), size), want_norm)),
                1e-5 * std::max(1.0, MaxAbs(want_norm)))
          << "max abs error of the norm";
    }
  }
}

TEST(CudaElementwise, RopeMatchesCpu) {
  HW_SKIP_WITHOUT_GPU();
  struct Case {
    int n_tokens, n_heads, head_dim;
    float freq_base;
  };
  for (const Case c :
       {Case{5, 9, 64, 10000.0f}, Case{17, 4, 128, 500000.0f}, Case{3, 2, 256, 1000000.0f},
        Case{40, 3, 64, 10000.0f}, Case{2, 1, 2, 10000.0f}}) {
    for (cpu::RopeStyle style : {cpu::RopeStyle::kInterleaved, cpu::RopeStyle::kNeox}) {
      for (uint64_t seed : {31u, 32u}) {
        SCOPED_TRACE(
            "n_tokens=" + std::to_string(c.n_tokens) + " n_heads=" + std::to_string(c.n_heads) +
            " head_dim=" + std::to_string(c.head_dim) + " base=" + std::to_string(c.freq_base) +
            " style=" + (style == cpu::RopeStyle::kNeox ? "neox" : "interleaved") +
            " seed=" + std::to_string(seed));
        const size_t size = size_t(c.n_tokens) * c.n_heads * c.head_dim;
        const std::vector<float> x = RandomFloats(size, seed);
        // Positions up to 32K, 0 and the largest included.
        std::mt19937_64 rng(seed);
        std::uniform_int_distribution<int32_t> pos_dist(0, 32767);
        std::vector<int32_t> positions(c.n_tokens);
        for (int32_t& p : positions) p = pos_dist(rng);
        positions[0] = 0;
        if (c.n_tokens > 1) positions[1] = 32767;

        std::vector<float> want = x;
        cpu::Rope(want.data(), positions.data(), c.n_tokens, c.n_heads, c.head_dim, c.freq_base,
                  style);

        cuda::DeviceBuffer d_x = ToDevice(x), d_pos = ToDevice(positions);
        cuda::Rope(d_x.as<float>(), d_pos.as<int32_t>(), c.n_tokens, c.n_heads, c.head_dim,
                   c.freq_base, style, nullptr);
        Sync("Rope");
        EXPECT_LE(RecordError(MaxAbsDiff(ToHost<float>(d_x.data(), size), want)), 1e-5)
            << "max abs error";
      }
    }
  }
}

// The largest |got - want| / (1e-5 |want| + 2e-7 |gate * up|) over the
// vector (<= 1 passes). The second term covers GELU's 1 + tanh(..), which
// cancels for negative gates: an ulp of tanh there is 2^-24 |gate * up| / 2.
double MaxErrorRatio(const std::vector<float>& got, const std::vector<float>& want,
                     const std::vector<float>& gate, const std::vector<float>& up) {
  double worst = 0.0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double bound = 1e-5 * std::fabs(want[i]) + 2e-7 * std::fabs(double(gate[i]) * up[i]);
    const double d = std::fabs(double(got[i]) - double(want[i])) / (bound + 1e-30);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, d);
  }
  return worst;
}

TEST(CudaElementwise, GatedActivationsMatchCpu) {
  HW_SKIP_WITHOUT_GPU();
  for (int64_t n : {int64_t(1), int64_t(1536), int64_t(1000003)}) {
    for (uint64_t seed : {41u, 42u}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " seed=" + std::to_string(seed));
      const std::vector<float> gate = RandomFloats(size_t(n), seed, -12.0f, 12.0f);
      const std::vector<float> up = RandomFloats(size_t(n), seed + 1, -3.0f, 3.0f);
      cuda::DeviceBuffer d_gate = ToDevice(gate), d_up = ToDevice(up);
      cuda::DeviceBuffer d_out = ToDevice(std::vector<float>(size_t(n), std::nanf("")));

      std::vector<float> want(static_cast<size_t>(n));
      cpu::SwiGlu(gate.data(), up.data(), n, want.data());
      cuda::SwiGlu(d_gate.as<float>(), d_up.as<float>(), n, d_out.as<float>(), nullptr);
      Sync("SwiGlu");
      EXPECT_LE(RecordError(MaxErrorRatio(ToHost<float>(d_out.data(), size_t(n)), want, gate, up),
                            "max_error_over_bound"),
                1.0)
          << "SwiGlu max error / bound; max abs error "
          << MaxAbsDiff(ToHost<float>(d_out.data(), size_t(n)), want);

      cpu::GeluTanhGated(gate.data(), up.data(), n, want.data());
      cuda::GeluTanhGated(d_gate.as<float>(), d_up.as<float>(), n, d_out.as<float>(), nullptr);
      Sync("GeluTanhGated");
      EXPECT_LE(RecordError(MaxErrorRatio(ToHost<float>(d_out.data(), size_t(n)), want, gate, up),
                            "max_error_over_bound"),
                1.0)
          << "GeluTanhGated max error / bound; max abs error "
          << MaxAbsDiff(ToHost<float>(d_out.data(), size_t(n)), want);

      // out aliasing gate.
      cpu::SwiGlu(gate.data(), up.data(), n, want.data());
      cuda::SwiGlu(d_gate.as<float>(), d_up.as<float>(), n, d_gate.as<float>(), nullptr);
      Sync("SwiGlu in place");
      EXPECT_LE(RecordError(MaxErrorRatio(ToHost<float>(d_gate.data(), size_t(n)), want, gate, up),
                            "max_error_over_bound"),
                1.0)
          << "SwiGlu in place max error / bound";
    }
  }
}

TEST(CudaElementwise, AddInPlaceMatchesCpu) {
  HW_SKIP_WITHOUT_GPU();
  for (int64_t n : {int64_t(1), int64_t(577), int64_t(3000017)}) {
    const std::vector<float> out = RandomFloats(size_t(n), 51);
    const std::vector<float> x = RandomFloats(size_t(n), 52);
    std::vector<float> want = out;
    cpu::AddInPlace(want.data(), x.data(), n);
    cuda::DeviceBuffer d_out = ToDevice(out), d_x = ToDevice(x);
    cuda::AddInPlace(d_out.as<float>(), d_x.as<float>(), n, nullptr);
    Sync("AddInPlace");
    EXPECT_LE(RecordError(MaxAbsDiff(ToHost<float>(d_out.data(), size_t(n)), want)), 0.0)
        << "max abs error, n=" << n;
  }
}

TEST(CudaElementwise, GatherRowsPicksRows) {
  HW_SKIP_WITHOUT_GPU();
  const int in_rows = 50;
  for (int dim : {1, 576, 1537}) {
    const std::vector<float> in = RandomFloats(size_t(in_rows) * dim, 61);
    const std::vector<int32_t> rows = {49, 0, 7, 7, 23, 1};
    const int n = int(rows.size());
    std::vector<float> want(size_t(n) * dim);
    for (int i = 0; i < n; ++i) {
      std::memcpy(&want[size_t(i) * dim], &in[size_t(rows[i]) * dim], sizeof(float) * dim);
    }
    cuda::DeviceBuffer d_in = ToDevice(in), d_rows = ToDevice(rows);
    cuda::DeviceBuffer d_out = ToDevice(std::vector<float>(want.size(), std::nanf("")));
    cuda::GatherRows(d_in.as<float>(), d_rows.as<int32_t>(), n, dim, d_out.as<float>(), nullptr);
    Sync("GatherRows");
    EXPECT_LE(RecordError(MaxAbsDiff(ToHost<float>(d_out.data(), want.size()), want)), 0.0)
        << "max abs error, dim=" << dim;
  }
}

TEST(CudaElementwise, F32ToBf16MatchesHostBitForBit) {
  HW_SKIP_WITHOUT_GPU();
  std::vector<float> in = RandomFloats(100003, 71, -1e4f, 1e4f);
  // Random bit patterns cover every exponent, subnormals, infinities and NaNs.
  std::mt19937_64 rng(72);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t bits = uint32_t(rng());
    float f;
    std::memcpy(&f, &bits, 4);
    in.push_back(f);
  }
  // Exact ties (round to even both ways), overflow to inf, signed zeros.
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x7f7fffffu, 0xff7fffffu,
                        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                        0x7f800001u, 0xffbfffffu, 0x00000001u, 0x807fffffu}) {
    float f;
    std::memcpy(&f, &bits, 4);
    in.push_back(f);
  }
  const int64_t n = int64_t(in.size());
  cuda::DeviceBuffer d_in = ToDevice(in);
  cuda::DeviceBuffer d_out = ToDevice(std::vector<bf16_bits>(in.size(), 0xdeadu));
  cuda::F32ToBf16(d_in.as<float>(), n, d_out.as<bf16_bits>(), nullptr);
  Sync("F32ToBf16");
  const std::vector<bf16_bits> got = ToHost<bf16_bits>(d_out.data(), in.size());
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (got[i] != FloatToBf16(in[i])) {
      if (mismatches < 5) {
        uint32_t bits;
        std::memcpy(&bits, &in[i], 4);
        ADD_FAILURE() << "f32 bits 0x" << std::hex << bits << " -> 0x" << got[i] << ", host 0x"
                      << FloatToBf16(in[i]);
      }
      ++mismatches;
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << n;
}

}  // namespace
}  // namespace headway
