// ModelWeights::Load on small GGUF files written by tests/support/gguf_writer:
// values, tied LM head, shard ranges, and errors naming the tensor.
#include "worker/model_weights.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include <gtest/gtest.h>

#include "tests/support/gguf_writer.h"
#include "worker/dequant.h"

namespace headway {
namespace {

ModelSpec Spec() {
  ModelSpec spec;
  spec.name = "tiny";
  spec.architecture = "llama";
  spec.num_layers = 2;
  spec.hidden_size = 64;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 16;
  spec.intermediate_size = 96;
  spec.vocab_size = 50;
  spec.context_length = 128;
  spec.tied_embeddings = true;
  spec.slot_specs.assign(4, SlotSpec{});
  return spec;
}

TpShard Shard(int kv_begin, int kv_end, int q_begin, int q_end, int inter_begin,
              int inter_end, int tp_size) {
  TpShard s;
  s.tp_size = tp_size;
  s.kv_head_begin = kv_begin;
  s.kv_head_end = kv_end;
  s.q_head_begin = q_begin;
  s.q_head_end = q_end;
  s.intermediate_begin = inter_begin;
  s.intermediate_end = inter_end;
  s.padded_vocab_size = s.vocab_end = 50;
  return s;
}

class ModelWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() /
             ("headway_weights_" + std::to_string(::getpid()) + ".gguf"))
                .string();
  }
  void TearDown() override { std::filesystem::remove(path_); }

  // Writes the tensors of Spec(), except `skip`; `override_dims` replaces
  // the shape of one tensor. Remembers every tensor's f32 values as stored.
  void Write(const std::string& skip = "",
             const std::pair<std::string, std::vector<uint64_t>>& override_dims = {}) {
    const ModelSpec spec = Spec();
    const uint64_t h = spec.hidden_size, q = spec.num_heads * spec.head_dim,
                   kv = spec.num_kv_heads * spec.head_dim, f = spec.intermediate_size;
    std::vector<std::tuple<std::string, std::vector<uint64_t>, GgmlType>> tensors = {
        {"token_embd.weight", {h, uint64_t(spec.vocab_size)}, GgmlType::kQ8_0},
        {"output_norm.weight", {h}, GgmlType::kF32}};
    for (int l = 0; l < spec.num_layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      tensors.push_back({p + "attn_norm.weight", {h}, GgmlType::kF32});
      tensors.push_back({p + "attn_q.weight", {h, q}, GgmlType::kQ4_1});
      tensors.push_back({p + "attn_k.weight", {h, kv}, GgmlType::kQ4_1});
      tensors.push_back({p + "attn_v.weight", {h, kv}, GgmlType::kQ4_1});
      tensors.push_back({p + "attn_output.weight", {q, h}, GgmlType::kQ4_1});
      tensors.push_back({p + "ffn_norm.weight", {h}, GgmlType::kF32});
      tensors.push_back({p + "ffn_gate.weight", {h, f}, GgmlType::kQ4_1});
      tensors.push_back({p + "ffn_up.weight", {h, f}, GgmlType::kQ4_1});
      tensors.push_back({p + "ffn_down.weight", {f, h}, GgmlType::kQ4_1});
    }
    testing::GgufWriter w;
    w.AddString("general.architecture", "llama");
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto& [name, dims, type] : tensors) {
      if (name == skip) continue;
      if (name == override_dims.first) dims = override_dims.second;
      uint64_t n = 1;
      for (uint64_t d : dims) n *= d;
      std::vector<float> values(n);
      for (float& v : values) v = dist(rng);
      ASSERT_TRUE(w.AddTensor(name, dims, type, values).ok()) << name;
    }
    ASSERT_TRUE(w.WriteFile(path_).ok());
    auto file = GgufFile::Open(path_);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    file_ = std::move(*file);
  }

  // The stored tensor, dequantised: [n_out, n_in].
  std::vector<float> Stored(const std::string& name) {
    const GgufTensorInfo* info = file_->FindTensor(name);
    std::vector<float> out(info->num_elements());
    EXPECT_TRUE(Dequantize(info->type, file_->TensorData(*info), out.data(), out.size()).ok());
    return out;
  }

  std::string path_;
  std::unique_ptr<GgufFile> file_;
};

TEST_F(ModelWeightsTest, LoadsEveryTensorDequantised) {
  Write();
  auto w = ModelWeights::Load(*file_, Spec(), Shard(0, 2, 0, 4, 0, 96, 1));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->num_layers(), 2);
  EXPECT_EQ((*w)->token_embd().ToF32(), Stored("token_embd.weight"));
  EXPECT_EQ(&(*w)->lm_head(), &(*w)->token_embd());  // tied
  EXPECT_EQ((*w)->layer(1).wk.ToF32(), Stored("blk.1.attn_k.weight"));
  EXPECT_EQ((*w)->layer(0).w_down.ToF32(), Stored("blk.0.ffn_down.weight"));
  EXPECT_EQ((*w)->layer(1).ffn_norm, Stored("blk.1.ffn_norm.weight"));
}

TEST_F(ModelWeightsTest, LoadsShardRanges) {
  Write();
  // Rank 1 of 2: KV head 1, query heads 2-3, MLP rows [48, 96).
  auto w = ModelWeights::Load(*file_, Spec(), Shard(1, 2, 2, 4, 48, 96, 2));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const LayerWeights& l = (*w)->layer(0);
  // Each matrix as f32, whichever form it is held in.
  const std::vector<float> l_wq = l.wq.ToF32(), l_wv = l.wv.ToF32(), l_wo = l.wo.ToF32(),
                           l_w_down = l.w_down.ToF32();
  const std::vector<float> wq = Stored("blk.0.attn_q.weight");  // [64, 64]
  ASSERT_EQ(l_wq.size(), 32u * 64);
  EXPECT_TRUE(std::equal(l_wq.begin(), l_wq.end(), wq.begin() + 32 * 64));
  const std::vector<float> wv = Stored("blk.0.attn_v.weight");  // [32, 64]
  EXPECT_TRUE(std::equal(l_wv.begin(), l_wv.end(), wv.begin() + 16 * 64));
  const std::vector<float> wo = Stored("blk.0.attn_output.weight");  // [64 out, 64 in]
  ASSERT_EQ(l_wo.size(), 64u * 32);
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < 32; ++c) ASSERT_EQ(l_wo[r * 32 + c], wo[r * 64 + 32 + c]);
  }
  const std::vector<float> down = Stored("blk.0.ffn_down.weight");  // [64 out, 96 in]
  ASSERT_EQ(l_w_down.size(), 64u * 48);
  EXPECT_EQ(l_w_down[5 * 48 + 7], down[5 * 96 + 48 + 7]);

  // A block-aligned column slice is held as its stored blocks, which hold the
  // values above; a slice that cuts a 32-value block is held as f32 only.
  ASSERT_TRUE(l.wo.has_quant());
  EXPECT_TRUE(l.wo.f32.empty());
  std::vector<float> wo_from_quant(l_wo.size());
  ASSERT_TRUE(Dequantize(l.wo.quant_type, l.wo.quant.data(), wo_from_quant.data(),
                         wo_from_quant.size()).ok());
  EXPECT_EQ(wo_from_quant, l_wo);
  EXPECT_FALSE(l.w_down.has_quant());
  EXPECT_EQ(l.w_down.f32, l_w_down);
}

TEST_F(ModelWeightsTest, MissingTensorIsNamed) {
  Write("blk.1.ffn_up.weight");
  auto w = ModelWeights::Load(*file_, Spec(), Shard(0, 2, 0, 4, 0, 96, 1));
  EXPECT_EQ(w.status().code(), StatusCode::kNotFound);
  EXPECT_NE(w.status().message().find("blk.1.ffn_up.weight"), std::string::npos)
      << w.status().ToString();
}

TEST_F(ModelWeightsTest, WrongShapeIsNamedWithBothShapes) {
  Write("", {"blk.0.attn_k.weight", {64, 64}});
  auto w = ModelWeights::Load(*file_, Spec(), Shard(0, 2, 0, 4, 0, 96, 1));
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = w.status().message();
  EXPECT_NE(m.find("blk.0.attn_k.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("{64, 64}"), std::string::npos) << m;
  EXPECT_NE(m.find("{64, 32}"), std::string::npos) << m;
}

}  // namespace
}  // namespace headway
