#include "common/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/gguf_writer.h"
#include "tests/support/test_env.h"

namespace headway {
namespace {

using testing::GgufWriter;

// A file in a per-process temporary directory, removed with the fixture.
class GgufFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("headway_gguf_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteBytes(const std::string& name, const std::vector<uint8_t>& bytes) {
    std::string path = (dir_ / name).string();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return path;
  }

  // Opens `bytes` as a GGUF file and returns the error it gives.
  Status OpenError(const std::string& name, const std::vector<uint8_t>& bytes) {
    auto file = GgufFile::Open(WriteBytes(name, bytes));
    if (file.ok()) return Status::Internal("opened without error");
    return file.status();
  }

  std::filesystem::path dir_;
};

// Metadata of every kind the writer has, and two tensors.
GgufWriter SmallWriter() {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddUInt32("test.u32", 7);
  w.AddInt32("test.i32", -5);
  w.AddUInt64("test.u64", 1ull << 40);
  w.AddFloat32("test.f32", 0.25f);
  w.AddBool("test.bool", true);
  w.AddStringArray("test.strings", {"a", "", "ccc"});
  w.AddInt32Array("test.ints", {1, -2, 3});
  w.AddFloat32Array("test.floats", {0.5f, -1.5f});
  EXPECT_TRUE(w.AddTensor("tensor_a", {4, 2}, GgmlType::kF32,
                          {0, 1, 2, 3, 4, 5, 6, 7.5f}).ok());
  std::vector<float> values(64);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.1f * static_cast<float>(i) - 3.0f;
  EXPECT_TRUE(w.AddTensor("tensor_b", {32, 2}, GgmlType::kQ8_0, values).ok());
  return w;
}

void ExpectMessageHas(const Status& s, StatusCode code, const std::vector<std::string>& parts) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  for (const std::string& p : parts) {
    EXPECT_NE(s.message().find(p), std::string::npos) << "'" << p << "' not in: " << s.message();
  }
}

TEST_F(GgufFileTest, OpensRealModel) {
  HW_REQUIRE_MODEL(testing::SmolLm2Path());
  auto opened = GgufFile::Open(testing::SmolLm2Path());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const GgufFile& f = **opened;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.metadata().size(), 33u);
  EXPECT_EQ(f.tensors().size(), 272u);

  EXPECT_EQ(*(*f.Get("general.architecture"))->AsString(), "llama");
  EXPECT_EQ(*(*f.Get("llama.block_count"))->AsUInt(), 30u);
  EXPECT_EQ(*(*f.Get("llama.attention.head_count"))->AsInt(), 9);
  EXPECT_EQ(*(*f.Get("llama.attention.head_count_kv"))->AsInt(), 3);
  EXPECT_EQ(*(*f.Get("llama.embedding_length"))->AsInt(), 576);
  EXPECT_EQ(*(*f.Get("llama.feed_forward_length"))->AsInt(), 1536);
  EXPECT_EQ(*(*f.Get("llama.rope.freq_base"))->AsFloat(), 100000.0);
  EXPECT_FLOAT_EQ(static_cast<float>(*(*f.Get("llama.attention.layer_norm_rms_epsilon"))->AsFloat()),
                  1e-5f);
  EXPECT_EQ(*(*f.Get("tokenizer.ggml.add_bos_token"))->AsBool(), false);
  EXPECT_EQ(*(*f.Get("tokenizer.ggml.model"))->AsString(), "gpt2");
  EXPECT_EQ(*(*f.Get("tokenizer.ggml.pre"))->AsString(), "smollm");
  auto tokens = (*f.Get("tokenizer.ggml.tokens"))->AsStringArray();
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 49152u);
  EXPECT_EQ((*tokens)[0], "<|endoftext|>");
  EXPECT_EQ((*tokens)[2], "<|im_end|>");
  auto merges = (*f.Get("tokenizer.ggml.merges"))->AsStringArray();
  ASSERT_TRUE(merges.ok());
  EXPECT_EQ(merges->size(), 48900u);
  EXPECT_EQ((*merges)[0], "\xC4\xA0 t");  // "Ġ t"
  auto types = (*f.Get("tokenizer.ggml.token_type"))->AsIntArray();
  ASSERT_TRUE(types.ok());
  EXPECT_EQ((*types)[0], 3);
  EXPECT_NE((*(*f.Get("tokenizer.chat_template"))->AsString()).find("<|im_start|>"),
            std::string::npos);

  const GgufTensorInfo* embd = f.FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, GgmlType::kQ8_0);
  EXPECT_EQ(embd->dims, (std::vector<uint64_t>{576, 49152}));
  EXPECT_EQ(embd->offset, 0u);
  EXPECT_EQ(embd->num_bytes, 30081024u);
  EXPECT_EQ(embd->num_elements(), 576u * 49152u);
  const GgufTensorInfo* k = f.FindTensor("blk.0.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->type, GgmlType::kQ4_1);
  EXPECT_EQ(k->dims, (std::vector<uint64_t>{576, 192}));
  EXPECT_EQ(k->num_bytes, 69120u);
  const GgufTensorInfo* down = f.FindTensor("blk.29.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->dims, (std::vector<uint64_t>{1536, 576}));
  const GgufTensorInfo* norm = f.FindTensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->type, GgmlType::kF32);
  EXPECT_EQ(norm->offset, 98360128u - 1785664u);
  EXPECT_EQ(f.FindTensor("output.weight"), nullptr);  // tied embeddings

  // Data pointers land where the Python reader sees the data (absolute 1785664).
  std::ifstream raw(testing::SmolLm2Path(), std::ios::binary);
  raw.seekg(1785664);
  char first[8];
  raw.read(first, 8);
  EXPECT_EQ(std::memcmp(f.TensorData(*embd), first, 8), 0);
  EXPECT_EQ(f.TensorData(*norm) + norm->num_bytes, f.TensorData(*embd) + 98362432u - 1785664u);

  auto missing = f.Get("llama.no_such_key");
  ASSERT_FALSE(missing.ok());
  ExpectMessageHas(missing.status(), StatusCode::kNotFound, {"llama.no_such_key", "SmolLM2"});
}

TEST_F(GgufFileTest, WriterRoundTrip) {
  GgufWriter w = SmallWriter();
  auto opened = GgufFile::Open(WriteBytes("round_trip.gguf", w.Serialize()));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const GgufFile& f = **opened;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().size(), 9u);
  EXPECT_EQ(*f.Find("test.u32")->AsUInt(), 7u);
  EXPECT_EQ(*f.Find("test.i32")->AsInt(), -5);
  EXPECT_EQ(*f.Find("test.u64")->AsUInt(), 1ull << 40);
  EXPECT_EQ(*f.Find("test.f32")->AsFloat(), 0.25);
  EXPECT_EQ(*f.Find("test.bool")->AsBool(), true);
  EXPECT_EQ(*f.Find("test.strings")->AsStringArray(), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(*f.Find("test.ints")->AsIntArray(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*f.Find("test.floats")->AsFloatArray(), (std::vector<double>{0.5, -1.5}));

  ASSERT_EQ(f.tensors().size(), 2u);
  const GgufTensorInfo* a = f.FindTensor("tensor_a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->type, GgmlType::kF32);
  EXPECT_EQ(a->dims, (std::vector<uint64_t>{4, 2}));
  EXPECT_EQ(a->num_bytes, 32u);
  std::vector<float> a_values(8);
  std::memcpy(a_values.data(), f.TensorData(*a), 32);
  EXPECT_EQ(a_values, (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7.5f}));

  const GgufTensorInfo* b = f.FindTensor("tensor_b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, GgmlType::kQ8_0);
  EXPECT_EQ(b->num_bytes, 68u);
  EXPECT_EQ(b->offset % 32, 0u);
  std::vector<float> values(64);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.1f * static_cast<float>(i) - 3.0f;
  std::vector<uint8_t> want = testing::QuantizeQ8_0(values);
  EXPECT_EQ(std::memcmp(f.TensorData(*b), want.data(), want.size()), 0);
}

TEST_F(GgufFileTest, CustomAlignmentAndQ4_1) {
  GgufWriter w;
  w.SetAlignment(64);
  std::vector<float> values(96, 0.5f);
  values[3] = -1.0f;
  ASSERT_TRUE(w.AddTensor("t0", {32, 3}, GgmlType::kQ4_1, values).ok());
  ASSERT_TRUE(w.AddTensor("t1", {5}, GgmlType::kF32, {1, 2, 3, 4, 5}).ok());
  ASSERT_TRUE(w.AddTensor("t2", {3}, GgmlType::kF16, {1, 2, 3}).ok());
  auto opened = GgufFile::Open(WriteBytes("aligned.gguf", w.Serialize()));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ((*opened)->alignment(), 64u);
  for (const GgufTensorInfo& t : (*opened)->tensors()) {
    EXPECT_EQ(t.offset % 64, 0u) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*opened)->TensorData(t)) % 64, 0u) << t.name;
  }
  EXPECT_EQ((*opened)->FindTensor("t0")->type, GgmlType::kQ4_1);
  EXPECT_EQ((*opened)->FindTensor("t0")->num_bytes, 60u);
  EXPECT_EQ((*opened)->FindTensor("t2")->num_bytes, 6u);
}

TEST_F(GgufFileTest, ValueViewsNameTheKindOnError) {
  GgufValue s{std::string("x")};
  auto as_int = s.AsInt();
  ASSERT_FALSE(as_int.ok());
  ExpectMessageHas(as_int.status(), StatusCode::kInvalidArgument, {"integer", "string"});
  GgufValue neg{int64_t{-3}};
  EXPECT_FALSE(neg.AsUInt().ok());
  EXPECT_EQ(*neg.AsFloat(), -3.0);
  GgufValue big{uint64_t{1} << 63};
  EXPECT_FALSE(big.AsInt().ok());
  GgufValue mixed{GgufValue::Array{GgufValue{std::string("a")}, GgufValue{uint64_t{1}}}};
  auto strings = mixed.AsStringArray();
  ASSERT_FALSE(strings.ok());
  ExpectMessageHas(strings.status(), StatusCode::kInvalidArgument, {"element 1"});
  EXPECT_FALSE(GgufValue{true}.AsString().ok());
}

TEST_F(GgufFileTest, NonexistentFile) {
  std::string path = (dir_ / "no_such_model.gguf").string();
  auto file = GgufFile::Open(path);
  ASSERT_FALSE(file.ok());
  ExpectMessageHas(file.status(), StatusCode::kNotFound, {"no_such_model.gguf"});
}

TEST_F(GgufFileTest, WrongMagic) {
  std::vector<uint8_t> bytes = SmallWriter().Serialize();
  std::memcpy(bytes.data(), "GGML", 4);
  ExpectMessageHas(OpenError("magic.gguf", bytes), StatusCode::kDataLoss,
                   {"magic.gguf", "wrong magic", "GGML"});
}

TEST_F(GgufFileTest, UnsupportedVersion) {
  std::vector<uint8_t> bytes = SmallWriter().Serialize();
  bytes[4] = 1;
  ExpectMessageHas(OpenError("v1.gguf", bytes), StatusCode::kUnimplemented, {"version 1"});
}

TEST_F(GgufFileTest, TruncatedAtEveryPart) {
  const std::vector<uint8_t> bytes = SmallWriter().Serialize();
  auto find = [&](const std::string& needle) {
    auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
    EXPECT_NE(it, bytes.end()) << needle;
    return static_cast<size_t>(it - bytes.begin());
  };
  auto cut = [&](size_t n) { return std::vector<uint8_t>(bytes.begin(), bytes.begin() + n); };
  const size_t first_key = find("general.architecture");
  const size_t info_a = find("tensor_a");
  const size_t info_b = find("tensor_b");
  const size_t ints_array = find("test.ints");

  struct Case {
    size_t size;
    std::vector<std::string> parts;
  };
  std::vector<Case> cases = {
      {0, {"truncated", "header (magic)"}},
      {6, {"truncated", "header (version)"}},
      {20, {"truncated", "header (metadata count)"}},
      {first_key + 5, {"truncated", "metadata entry 0", "key"}},
      {ints_array + 9 + 4 + 4 + 8 + 2, {"truncated", "metadata entry 7 'test.ints'"}},
      {info_a + 3, {"truncated", "tensor info 0", "name"}},
      {info_b + 8 + 4 + 3, {"truncated", "tensor info 1 'tensor_b'", "dimensions"}},
      {info_b + 8 + 4 + 16 + 4 + 2, {"truncated", "tensor info 1 'tensor_b'", "offset"}},
      {bytes.size() - 70, {"truncated", "tensor data of 'tensor_b'"}},
      {bytes.size() - 40, {"truncated", "tensor data of 'tensor_b'"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("cut at " + std::to_string(c.size));
    std::vector<std::string> parts = c.parts;
    parts.push_back("cut.gguf");
    ExpectMessageHas(OpenError("cut.gguf", cut(c.size)), StatusCode::kDataLoss, parts);
  }
  // Every shorter prefix (sampled every 3 bytes) fails cleanly with DataLoss.
  for (size_t n = 0; n + 32 <= bytes.size(); n += 3) {
    Status s = OpenError("prefix.gguf", cut(n));
    ASSERT_EQ(s.code(), StatusCode::kDataLoss) << "cut at " << n << ": " << s.ToString();
    ASSERT_NE(s.message().find("truncated"), std::string::npos) << s.message();
  }
}

TEST_F(GgufFileTest, UnknownTensorType) {
  GgufWriter w;
  w.AddRawTensor("weird", {32}, 77, std::vector<uint8_t>(32));
  ExpectMessageHas(OpenError("weird.gguf", w.Serialize()), StatusCode::kUnimplemented,
                   {"weird.gguf", "'weird'", "unknown tensor type 77"});
}

TEST_F(GgufFileTest, CorruptStructure) {
  {
    GgufWriter w;
    w.AddUInt32("dup", 1);
    w.AddUInt32("dup", 2);
    ExpectMessageHas(OpenError("dup.gguf", w.Serialize()), StatusCode::kDataLoss,
                     {"duplicate metadata key 'dup'"});
  }
  {
    GgufWriter w;
    ASSERT_TRUE(w.AddTensor("t", {2}, GgmlType::kF32, {1, 2}).ok());
    ASSERT_TRUE(w.AddTensor("t", {2}, GgmlType::kF32, {1, 2}).ok());
    ExpectMessageHas(OpenError("duptensor.gguf", w.Serialize()), StatusCode::kDataLoss,
                     {"duplicate tensor 't'"});
  }
  {
    GgufWriter w;
    w.AddRawTensor("rows", {33}, static_cast<uint32_t>(GgmlType::kQ8_0), std::vector<uint8_t>(68));
    ExpectMessageHas(OpenError("rows.gguf", w.Serialize()), StatusCode::kDataLoss,
                     {"'rows'", "row length 33"});
  }
  {
    GgufWriter w;
    w.AddUInt32("general.alignment", 24);
    ExpectMessageHas(OpenError("align.gguf", w.Serialize()), StatusCode::kDataLoss,
                     {"general.alignment"});
  }
  {
    // A tensor offset that is not aligned.
    GgufWriter w;
    ASSERT_TRUE(w.AddTensor("t", {2}, GgmlType::kF32, {1, 2}).ok());
    std::vector<uint8_t> bytes = w.Serialize();
    const size_t offset_pos = 24 + 8 + 1 + 4 + 8 + 4;  // header, name, n_dims, dim, type
    bytes[offset_pos] = 4;
    ExpectMessageHas(OpenError("misaligned.gguf", bytes), StatusCode::kDataLoss,
                     {"'t' offset 4", "aligned"});
  }
  {
    // A metadata value of an unknown type.
    GgufWriter w;
    w.AddUInt32("k", 1);
    std::vector<uint8_t> bytes = w.Serialize();
    bytes[24 + 8 + 1] = 42;
    ExpectMessageHas(OpenError("valtype.gguf", bytes), StatusCode::kDataLoss,
                     {"metadata entry 0 'k'", "unknown value type 42"});
  }
  {
    // An array that claims more elements than the file can hold.
    GgufWriter w;
    w.AddInt32Array("arr", {1, 2});
    std::vector<uint8_t> bytes = w.Serialize();
    bytes[24 + 8 + 3 + 4 + 4 + 7] = 0x40;  // top byte of the u64 length
    ExpectMessageHas(OpenError("arr.gguf", bytes), StatusCode::kDataLoss,
                     {"truncated or corrupt", "'arr' (array length) says 4611686018427387906 "
                      "elements", "(each takes at least 4)"});
  }
}

// Counts flipped to huge values are reported as counts the file cannot hold,
// not as a file truncated by exabytes.
TEST_F(GgufFileTest, CountsTheFileCannotHoldAreNamed) {
  const std::vector<uint8_t> good = SmallWriter().Serialize();
  auto with_u64 = [&](size_t pos, uint64_t value) {
    std::vector<uint8_t> bytes = good;
    std::memcpy(bytes.data() + pos, &value, sizeof(value));
    return bytes;
  };
  const uint64_t flipped = ~uint64_t(0x21);  // 18446744073709551582
  // Header: magic, version, then the tensor count (8) and metadata count (16).
  ExpectMessageHas(OpenError("tensors.gguf", with_u64(8, flipped)), StatusCode::kDataLoss,
                   {"tensors.gguf", "the header says 18446744073709551582 tensors",
                    "but the file has only " + std::to_string(good.size() - 24) +
                        " bytes left at offset 24"});
  ExpectMessageHas(OpenError("kvs.gguf", with_u64(16, flipped)), StatusCode::kDataLoss,
                   {"the header says 18446744073709551582 metadata entries", "bytes left"});
  // The first key's string length.
  ExpectMessageHas(OpenError("key.gguf", with_u64(24, flipped)), StatusCode::kDataLoss,
                   {"metadata entry 0 (key) (string length) says 18446744073709551582 bytes",
                    "but the file has only"});
  // A string inside an array: test.strings's first element.
  const std::string strings_key = "test.strings";
  const size_t key_at = static_cast<size_t>(
      std::search(good.begin(), good.end(), strings_key.begin(), strings_key.end()) -
      good.begin());
  ASSERT_LT(key_at, good.size());
  const size_t first_string = key_at + strings_key.size() + 4 + 4 + 8;  // type, elem type, count
  ExpectMessageHas(OpenError("elem.gguf", with_u64(first_string, flipped)),
                   StatusCode::kDataLoss,
                   {"'test.strings'[0] (string length) says 18446744073709551582 bytes"});
  // Never a message about reading exabytes.
  for (size_t pos : {size_t(8), size_t(16), size_t(24), first_string}) {
    Status s = OpenError("any.gguf", with_u64(pos, flipped));
    EXPECT_EQ(s.message().find("needs 18446744073709551582"), std::string::npos) << s.message();
  }
}

TEST_F(GgufFileTest, EmptyGgufWithoutTensors) {
  GgufWriter w;
  auto opened = GgufFile::Open(WriteBytes("empty.gguf", w.Serialize()));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_TRUE((*opened)->tensors().empty());
  EXPECT_TRUE((*opened)->metadata().empty());
}

TEST_F(GgufFileTest, TinyLlamaIsAValidFile) {
  testing::TinyLlamaOptions o;
  o.num_layers = 3;
  o.tied_embeddings = false;
  std::string path = (dir_ / "tiny.gguf").string();
  ASSERT_TRUE(testing::WriteTinyLlama(path, o).ok());
  auto opened = GgufFile::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const GgufFile& f = **opened;
  EXPECT_EQ(f.tensors().size(), 3u + 9u * 3u);
  EXPECT_EQ(f.FindTensor("token_embd.weight")->type, GgmlType::kQ8_0);
  EXPECT_EQ(f.FindTensor("token_embd.weight")->dims, (std::vector<uint64_t>{64, 320}));
  EXPECT_EQ(f.FindTensor("output.weight")->dims, (std::vector<uint64_t>{64, 320}));
  EXPECT_EQ(f.FindTensor("blk.2.attn_k.weight")->type, GgmlType::kQ4_1);
  EXPECT_EQ(f.FindTensor("blk.2.attn_k.weight")->dims, (std::vector<uint64_t>{64, 32}));
  EXPECT_EQ(f.FindTensor("blk.0.ffn_down.weight")->dims, (std::vector<uint64_t>{128, 64}));
  EXPECT_EQ(f.FindTensor("blk.1.ffn_norm.weight")->type, GgmlType::kF32);
  auto tokens = f.Find("tokenizer.ggml.tokens")->AsStringArray();
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 320u);
  EXPECT_EQ((*tokens)[1], "<|im_start|>");
  EXPECT_EQ((*tokens)[3 + 'a'], "a");
  EXPECT_EQ((*tokens)[3 + ' '], "\xC4\xA0");  // GPT-2 spells the space byte "Ġ"
  EXPECT_EQ((*tokens)[319], "tok319");

  // Same seed, same bytes; another seed, other weights.
  std::string again = (dir_ / "tiny2.gguf").string();
  ASSERT_TRUE(testing::WriteTinyLlama(again, o).ok());
  auto f2 = GgufFile::Open(again);
  ASSERT_TRUE(f2.ok());
  const GgufTensorInfo* q = f.FindTensor("blk.0.attn_q.weight");
  EXPECT_EQ(std::memcmp(f.TensorData(*q), (*f2)->TensorData(*q), q->num_bytes), 0);
  o.seed = 2;
  std::string other = (dir_ / "tiny3.gguf").string();
  ASSERT_TRUE(testing::WriteTinyLlama(other, o).ok());
  auto f3 = GgufFile::Open(other);
  ASSERT_TRUE(f3.ok());
  EXPECT_NE(std::memcmp(f.TensorData(*q), (*f3)->TensorData(*q), q->num_bytes), 0);

  o.hidden_size = 48;  // not a multiple of the Q8_0 block
  Status bad = testing::WriteTinyLlama((dir_ / "bad.gguf").string(), o);
  ExpectMessageHas(bad, StatusCode::kInvalidArgument, {"multiple of 32"});
}

}  // namespace
}  // namespace headway
