// Dequantisation against values from the `gguf` Python package
// (tests/data/gguf/make_reference.py; the command is in reference.txt).
#include "worker/dequant.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/test_env.h"

namespace headway {
namespace {

struct ModelCase {
  std::string tensor, type;
  uint64_t start = 0, count = 0;
  std::string file;
};
struct ModelSum {
  std::string tensor;
  double sum = 0, sum_abs = 0;
};
struct SyntheticCase {
  std::string type;
  uint64_t n_values = 0;
  std::string raw_file, expected_file;
};
struct QuantizedCase {
  std::string type, input_file, raw_file;
};
struct Reference {
  std::vector<QuantizedCase> quantized;
  std::vector<ModelCase> model;
  std::vector<ModelSum> sums;
  std::vector<SyntheticCase> synthetic;
};

std::string DataPath(const std::string& file) {
  return testing::TestDataPath("gguf/dequant/" + file);
}

Reference LoadReference() {
  Reference ref;
  std::ifstream in(DataPath("reference.txt"));
  EXPECT_TRUE(in.good()) << "missing " << DataPath("reference.txt");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string kind;
    ss >> kind;
    if (kind == "model") {
      ModelCase c;
      ss >> c.tensor >> c.type >> c.start >> c.count >> c.file;
      ref.model.push_back(c);
    } else if (kind == "modelsum") {
      ModelSum s;
      ss >> s.tensor >> s.sum >> s.sum_abs;
      ref.sums.push_back(s);
    } else if (kind == "synthetic") {
      SyntheticCase c;
      ss >> c.type >> c.n_values >> c.raw_file >> c.expected_file;
      ref.synthetic.push_back(c);
    } else if (kind == "quantized") {
      QuantizedCase c;
      ss >> c.type >> c.input_file >> c.raw_file;
      ref.quantized.push_back(c);
    }
  }
  return ref;
}

std::vector<uint8_t> ReadBytes(const std::string& file) {
  std::ifstream in(DataPath(file), std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing " << DataPath(file);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

std::vector<float> ReadFloats(const std::string& file) {
  std::vector<uint8_t> bytes = ReadBytes(file);
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

GgmlType TypeFromName(const std::string& name) {
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                     GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ4_K,
                     GgmlType::kQ6_K}) {
    if (GgmlTypeName(t) == name) return t;
  }
  ADD_FAILURE() << "unknown type in reference.txt: " << name;
  return GgmlType::kF32;
}

// Same value up to float rounding order (the Python reference computes in
// numpy float32, possibly without fused multiply-add).
void ExpectSameFloats(const std::vector<float>& want, const float* got, uint64_t n,
                      const std::string& what) {
  ASSERT_EQ(want.size(), n) << what;
  int failures = 0;
  for (uint64_t i = 0; i < n && failures < 5; ++i) {
    const float w = want[i];
    const float g = got[i];
    if (std::isnan(w) || std::isnan(g)) {
      if (std::isnan(w) != std::isnan(g)) {
        ADD_FAILURE() << what << " [" << i << "]: want " << w << ", got " << g;
        ++failures;
      }
      continue;
    }
    if (std::isinf(w) || w == g) {
      if (w != g) {
        ADD_FAILURE() << what << " [" << i << "]: want " << w << ", got " << g;
        ++failures;
      }
      continue;
    }
    if (std::fabs(w - g) > 1e-6f * std::fabs(w) + 1e-7f) {
      ADD_FAILURE() << what << " [" << i << "]: want " << w << ", got " << g;
      ++failures;
    }
  }
}

TEST(DequantTest, SyntheticBlocksMatchPythonGguf) {
  Reference ref = LoadReference();
  ASSERT_GE(ref.synthetic.size(), 12u);
  std::set<std::string> types_seen;
  for (const SyntheticCase& c : ref.synthetic) {
    SCOPED_TRACE(c.raw_file);
    GgmlType type = TypeFromName(c.type);
    std::vector<uint8_t> raw = ReadBytes(c.raw_file);
    std::vector<float> want = ReadFloats(c.expected_file);
    auto bytes = GgmlBytes(type, c.n_values);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    ASSERT_EQ(*bytes, raw.size());
    std::vector<float> got(c.n_values, -12345.0f);
    ASSERT_TRUE(Dequantize(type, raw.data(), got.data(), c.n_values).ok());
    ExpectSameFloats(want, got.data(), c.n_values, c.raw_file);
    types_seen.insert(c.type);
  }
  EXPECT_EQ(types_seen.size(), 8u);  // all supported types but F32
}

// The test writer's quantisers must produce the blocks ggml would, so that
// files it writes look like real ones.
TEST(DequantTest, WriterQuantisersMatchPythonGguf) {
  Reference ref = LoadReference();
  int checked = 0;
  for (const QuantizedCase& c : ref.quantized) {
    if (c.type != "Q8_0" && c.type != "Q4_1") continue;
    SCOPED_TRACE(c.raw_file);
    std::vector<float> input = ReadFloats(c.input_file);
    std::vector<uint8_t> want = ReadBytes(c.raw_file);
    std::vector<uint8_t> got =
        c.type == "Q8_0" ? testing::QuantizeQ8_0(input) : testing::QuantizeQ4_1(input);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_TRUE(got == want);
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

TEST(DequantTest, FloatToHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0) continue;  // NaN payloads
    ASSERT_EQ(testing::FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h) << h;
  }
  EXPECT_EQ(testing::FloatToHalf(65520.0f), 0x7C00);      // rounds up to inf
  EXPECT_EQ(testing::FloatToHalf(1.0f + 0x1.0p-11f), 0x3C00);  // tie to even
  EXPECT_EQ(testing::FloatToHalf(0x1.0p-25f), 0x0000);         // tie to even (zero)
  EXPECT_EQ(testing::FloatToHalf(0x1.8p-25f), 0x0001);
}

TEST(DequantTest, F32IsACopy) {
  std::vector<float> src = {1.5f, -2.25f, 0.0f, 3e38f};
  std::vector<float> dst(4);
  ASSERT_TRUE(Dequantize(GgmlType::kF32, reinterpret_cast<const uint8_t*>(src.data()),
                         dst.data(), 4).ok());
  EXPECT_EQ(src, dst);
}

TEST(DequantTest, HandBuiltQ8_0AndQ4_1Blocks) {
  // Q8_0: d = 0.5 (f16 0x3800), q = -16..15.
  std::vector<uint8_t> q8(34);
  q8[0] = 0x00;
  q8[1] = 0x38;
  for (int j = 0; j < 32; ++j) q8[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  std::vector<float> out(32);
  ASSERT_TRUE(Dequantize(GgmlType::kQ8_0, q8.data(), out.data(), 32).ok());
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], 0.5f * (j - 16));

  // Q4_1: d = 2 (0x4000), m = -1 (0xBC00); byte j = (hi=15-j, lo=j).
  std::vector<uint8_t> q4(20);
  q4[1] = 0x40;
  q4[3] = 0xBC;
  for (int j = 0; j < 16; ++j) q4[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  ASSERT_TRUE(Dequantize(GgmlType::kQ4_1, q4.data(), out.data(), 32).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 2.0f * j - 1.0f);
    EXPECT_EQ(out[16 + j], 2.0f * (15 - j) - 1.0f);
  }
}

TEST(DequantTest, HalfAndBFloat16Conversions) {
  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xC000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7C00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));
  EXPECT_EQ(BFloat16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0xC040), -3.0f);
}

TEST(DequantTest, SizesAndErrors) {
  EXPECT_EQ(*GgmlBlockValues(GgmlType::kQ4_K), 256u);
  EXPECT_EQ(*GgmlBlockValues(GgmlType::kBF16), 1u);
  EXPECT_EQ(*GgmlBytes(GgmlType::kQ8_0, 64), 68u);
  EXPECT_EQ(*GgmlBytes(GgmlType::kQ6_K, 512), 420u);
  EXPECT_EQ(*GgmlBytes(GgmlType::kF16, 3), 6u);

  auto odd = GgmlBytes(GgmlType::kQ4_0, 33);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(odd.status().message().find("multiple"), std::string::npos);

  auto q5k = GgmlBlockValues(GgmlType::kQ5_K);
  ASSERT_FALSE(q5k.ok());
  EXPECT_EQ(q5k.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(q5k.status().message().find("Q5_K"), std::string::npos);

  std::vector<uint8_t> src(64);
  std::vector<float> dst(64);
  Status s = Dequantize(GgmlType::kQ8_0, src.data(), dst.data(), 31);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = Dequantize(static_cast<GgmlType>(99), src.data(), dst.data(), 1);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("type99"), std::string::npos);
}

TEST(DequantTest, RealModelTensorsMatchPythonGguf) {
  HW_REQUIRE_MODEL(testing::SmolLm2Path());
  auto file = GgufFile::Open(testing::SmolLm2Path());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Reference ref = LoadReference();
  ASSERT_GE(ref.model.size(), 12u);
  for (const ModelCase& c : ref.model) {
    SCOPED_TRACE(c.file);
    const GgufTensorInfo* info = (*file)->FindTensor(c.tensor);
    ASSERT_NE(info, nullptr) << c.tensor;
    ASSERT_EQ(GgmlTypeName(info->type), c.type);
    const uint64_t block_values = *GgmlBlockValues(info->type);
    ASSERT_EQ(c.start % block_values, 0u);
    const uint64_t skip_bytes = *GgmlBytes(info->type, c.start);
    std::vector<float> got(c.count);
    ASSERT_TRUE(Dequantize(info->type, (*file)->TensorData(*info) + skip_bytes, got.data(),
                           c.count).ok());
    ExpectSameFloats(ReadFloats(c.file), got.data(), c.count, c.tensor);
  }
}

TEST(DequantTest, WholeRealTensorsMatchPythonSums) {
  HW_REQUIRE_MODEL(testing::SmolLm2Path());
  auto file = GgufFile::Open(testing::SmolLm2Path());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Reference ref = LoadReference();
  ASSERT_GE(ref.sums.size(), 4u);
  for (const ModelSum& s : ref.sums) {
    const GgufTensorInfo* info = (*file)->FindTensor(s.tensor);
    ASSERT_NE(info, nullptr) << s.tensor;
    std::vector<float> values(info->num_elements());
    auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(
        Dequantize(info->type, (*file)->TensorData(*info), values.data(), values.size()).ok());
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count();
    double sum = 0, sum_abs = 0;
    for (float v : values) {
      sum += v;
      sum_abs += std::fabs(v);
    }
    EXPECT_NEAR(sum_abs, s.sum_abs, 1e-9 * s.sum_abs + 1e-6) << s.tensor;
    EXPECT_NEAR(sum, s.sum, 1e-9 * s.sum_abs + 1e-6) << s.tensor;
    if (s.tensor == "token_embd.weight") {
      // 28M values: the load path must not be a bottleneck (generous bound).
      EXPECT_LT(ms, 2000.0) << "dequantising token_embd took " << ms << " ms";
    }
  }
}

}  // namespace
}  // namespace headway
