#include "common/model_spec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/gguf_writer.h"
#include "tests/support/test_env.h"

namespace headway {
namespace {

void ExpectMessageHas(const Status& s, const std::vector<std::string>& parts) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  for (const std::string& p : parts) {
    EXPECT_NE(s.message().find(p), std::string::npos) << "'" << p << "' not in: " << s.message();
  }
}

// SmolLM2-135M's numbers, without the file.
ModelSpec SmolLm2Spec() {
  ModelSpec s;
  s.name = "Smollm2 135M 8k Lc100K Mix1 Ep2";
  s.architecture = "llama";
  s.num_layers = 30;
  s.hidden_size = 576;
  s.num_heads = 9;
  s.num_kv_heads = 3;
  s.head_dim = 64;
  s.intermediate_size = 1536;
  s.vocab_size = 49152;
  return s;
}

ModelSpec Spec(int heads, int kv_heads, int ffn, int vocab) {
  ModelSpec s;
  s.name = "toy";
  s.architecture = "llama";
  s.num_layers = 2;
  s.num_heads = heads;
  s.num_kv_heads = kv_heads;
  s.head_dim = 16;
  s.hidden_size = heads * 16;
  s.intermediate_size = ffn;
  s.vocab_size = vocab;
  return s;
}

class ModelSpecFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("headway_model_spec_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Result<ModelSpec> LoadFrom(const testing::GgufWriter& w, const std::string& name) {
    std::string path = (dir_ / name).string();
    Status written = w.WriteFile(path);
    if (!written.ok()) return written;
    auto file = GgufFile::Open(path);
    if (!file.ok()) return file.status();
    return LoadModelSpec(**file);
  }

  std::filesystem::path dir_;
};

TEST_F(ModelSpecFileTest, SmolLm2FromFile) {
  HW_REQUIRE_MODEL(testing::SmolLm2Path());
  auto file = GgufFile::Open(testing::SmolLm2Path());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto spec = LoadModelSpec(**file);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->name, "Smollm2 135M 8k Lc100K Mix1 Ep2");
  EXPECT_EQ(spec->architecture, "llama");
  EXPECT_EQ(spec->num_layers, 30);
  EXPECT_EQ(spec->hidden_size, 576);
  EXPECT_EQ(spec->num_heads, 9);
  EXPECT_EQ(spec->num_kv_heads, 3);
  EXPECT_EQ(spec->head_dim, 64);
  EXPECT_EQ(spec->intermediate_size, 1536);
  EXPECT_EQ(spec->vocab_size, 49152);
  EXPECT_EQ(spec->context_length, 8192);
  EXPECT_EQ(spec->rope_freq_base, 100000.0f);
  EXPECT_FLOAT_EQ(spec->rms_norm_eps, 1e-5f);
  EXPECT_TRUE(spec->tied_embeddings);
  ASSERT_EQ(spec->slot_specs.size(), 30u * 3u);
  for (const SlotSpec& s : spec->slot_specs) EXPECT_FALSE(s.IsSliding());

  EXPECT_EQ(ValidTpSizes(*spec, 64), (std::vector<int>{1, 3}));
}

TEST(TpRuleTest, SmolLm2ValidSizes) {
  ModelSpec s = SmolLm2Spec();
  EXPECT_TRUE(ValidateTpSize(s, 1).ok());
  EXPECT_TRUE(ValidateTpSize(s, 3).ok());
  EXPECT_EQ(ValidTpSizes(s, 64), (std::vector<int>{1, 3}));

  TpShard whole = ShardForRank(s, 1, 0);
  EXPECT_EQ(whole.num_local_kv_heads(), 3);
  EXPECT_EQ(whole.num_local_heads(), 9);
  EXPECT_EQ(whole.intermediate_end - whole.intermediate_begin, 1536);
  EXPECT_EQ(whole.padded_vocab_size, 49152);

  for (int r = 0; r < 3; ++r) {
    TpShard sh = ShardForRank(s, 3, r);
    EXPECT_EQ(sh.tp_size, 3);
    EXPECT_EQ(sh.tp_rank, r);
    EXPECT_EQ(sh.kv_head_begin, r);  // one KV head per rank
    EXPECT_EQ(sh.kv_head_end, r + 1);
    EXPECT_EQ(sh.q_head_begin, 3 * r);  // its three query heads
    EXPECT_EQ(sh.q_head_end, 3 * r + 3);
    EXPECT_EQ(sh.intermediate_begin, 512 * r);
    EXPECT_EQ(sh.intermediate_end, 512 * (r + 1));
    EXPECT_EQ(sh.padded_vocab_size, 49152);
    EXPECT_EQ(sh.vocab_begin, 16384 * r);
    EXPECT_EQ(sh.vocab_end, 16384 * (r + 1));
  }
}

TEST(TpRuleTest, SmolLm2AtTp2FailsOnQueryHeads) {
  Status s = ValidateTpSize(SmolLm2Spec(), 2);
  ExpectMessageHas(s, {"Smollm2 135M", "TP size 2", "9 query heads", "num_heads",
                       "llama.attention.head_count", "divide by 2", "valid TP sizes: 1, 3"});
}

TEST(TpRuleTest, SmolLm2AtTp9FailsOnIntermediateSize) {
  Status s = ValidateTpSize(SmolLm2Spec(), 9);
  ExpectMessageHas(s, {"Smollm2 135M", "TP size 9", "intermediate size 1536",
                       "llama.feed_forward_length", "divide by 9", "valid TP sizes: 1, 3"});
}

TEST(TpRuleTest, SingleKvHeadIsReplicated) {
  ModelSpec s = Spec(/*heads=*/4, /*kv_heads=*/1, /*ffn=*/64, /*vocab=*/100);
  EXPECT_EQ(ValidTpSizes(s, 64), (std::vector<int>{1, 2, 4}));
  for (int tp : {2, 4}) {
    ASSERT_TRUE(ValidateTpSize(s, tp).ok()) << tp;
    for (int r = 0; r < tp; ++r) {
      TpShard sh = ShardForRank(s, tp, r);
      EXPECT_EQ(sh.kv_head_begin, 0);  // KV head r / (tp / 1) = 0 on every rank
      EXPECT_EQ(sh.kv_head_end, 1);
      EXPECT_EQ(sh.num_local_heads(), 4 / tp);
      EXPECT_EQ(sh.q_head_begin, r * (4 / tp));
    }
  }
  ExpectMessageHas(ValidateTpSize(s, 3), {"4 query heads", "divide by 3", "valid TP sizes: 1, 2, 4"});
}

// FirstRankHoldingKvHead inverts ShardForRank: it names the lowest rank
// whose shard holds the head, with and without replication.
TEST(TpRuleTest, FirstRankHoldingKvHeadMatchesTheShards) {
  for (const ModelSpec& s : {Spec(8, 2, 64, 100), Spec(4, 1, 64, 100), Spec(9, 3, 1536, 100)}) {
    for (int tp : ValidTpSizes(s, 16)) {
      for (int h = 0; h < s.num_kv_heads; ++h) {
        int first = -1;
        for (int r = tp - 1; r >= 0; --r) {
          const TpShard sh = ShardForRank(s, tp, r);
          if (sh.kv_head_begin <= h && h < sh.kv_head_end) first = r;
        }
        EXPECT_EQ(FirstRankHoldingKvHead(s, tp, h), first)
            << s.num_kv_heads << " KV heads, TP " << tp << ", head " << h;
      }
    }
  }
}

TEST(TpRuleTest, ReplicationFollowsKvHeadGroups) {
  // 8 query heads over 2 KV heads at TP 4: ranks 0,1 hold KV head 0 and
  // ranks 2,3 hold KV head 1; each rank's two query heads use its KV head.
  ModelSpec s = Spec(8, 2, 64, 100);
  ASSERT_TRUE(ValidateTpSize(s, 4).ok());
  const int group = s.num_heads / s.num_kv_heads;
  for (int r = 0; r < 4; ++r) {
    TpShard sh = ShardForRank(s, 4, r);
    EXPECT_EQ(sh.kv_head_begin, r / 2);
    EXPECT_EQ(sh.num_local_kv_heads(), 1);
    EXPECT_EQ(sh.q_head_begin, 2 * r);
    EXPECT_EQ(sh.q_head_begin / group, sh.kv_head_begin);
    EXPECT_EQ((sh.q_head_end - 1) / group, sh.kv_head_begin);
  }
}

TEST(TpRuleTest, EightHeadsTwoKvHeads) {
  ModelSpec s = Spec(8, 2, 64, 100);
  ASSERT_TRUE(ValidateTpSize(s, 2).ok());
  TpShard r1 = ShardForRank(s, 2, 1);
  EXPECT_EQ(r1.kv_head_begin, 1);
  EXPECT_EQ(r1.kv_head_end, 2);
  EXPECT_EQ(r1.q_head_begin, 4);
  EXPECT_EQ(r1.q_head_end, 8);
  EXPECT_EQ(r1.intermediate_begin, 32);
  EXPECT_EQ(r1.intermediate_end, 64);

  // TP 3 over 2 KV heads: query heads fail first; with 6 query heads the KV
  // heads are what cannot be split or replicated.
  EXPECT_FALSE(ValidateTpSize(s, 3).ok());
  ModelSpec six = Spec(6, 2, 60, 100);
  ExpectMessageHas(ValidateTpSize(six, 3),
                   {"toy", "TP size 3", "2 KV heads", "num_kv_heads",
                    "llama.attention.head_count_kv", "valid TP sizes: 1, 2, 6"});
  ModelSpec four_kv = Spec(12, 4, 48, 100);  // 4 KV heads at TP 6: neither divides
  ExpectMessageHas(ValidateTpSize(four_kv, 6), {"4 KV heads", "TP size 6"});
  EXPECT_EQ(ValidTpSizes(four_kv, 64), (std::vector<int>{1, 2, 4, 12}));
}

TEST(TpRuleTest, VocabIsPaddedToTpMultiple) {
  ModelSpec s = Spec(4, 4, 64, 101);
  TpShard last = ShardForRank(s, 4, 3);
  EXPECT_EQ(last.padded_vocab_size, 104);
  EXPECT_EQ(last.vocab_begin, 78);
  EXPECT_EQ(last.vocab_end, 104);  // rows 101..103 are padding
  TpShard first = ShardForRank(s, 4, 0);
  EXPECT_EQ(first.vocab_begin, 0);
  EXPECT_EQ(first.vocab_end, 26);
  EXPECT_EQ(ShardForRank(s, 1, 0).padded_vocab_size, 101);
}

TEST(TpRuleTest, BadTpSizeAndEmptySpec) {
  ExpectMessageHas(ValidateTpSize(SmolLm2Spec(), 0), {"at least 1"});
  ExpectMessageHas(ValidateTpSize(ModelSpec{}, 1), {"load its spec"});
  EXPECT_TRUE(ValidTpSizes(ModelSpec{}, 8).empty());
}

TEST_F(ModelSpecFileTest, TinyLlamaSpec) {
  testing::TinyLlamaOptions o;
  o.name = "tiny-test";
  o.num_layers = 3;
  o.hidden_size = 64;
  o.num_heads = 4;
  o.num_kv_heads = 1;
  o.head_dim = 32;  // explicit key_length, not hidden / heads
  o.intermediate_size = 96;
  o.vocab_size = 300;
  std::string path = (dir_ / "tiny.gguf").string();
  ASSERT_TRUE(testing::WriteTinyLlama(path, o).ok());
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto spec = LoadModelSpec(**file);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->name, "tiny-test");
  EXPECT_EQ(spec->num_layers, 3);
  EXPECT_EQ(spec->num_heads, 4);
  EXPECT_EQ(spec->num_kv_heads, 1);
  EXPECT_EQ(spec->head_dim, 32);
  EXPECT_EQ(spec->intermediate_size, 96);
  EXPECT_EQ(spec->vocab_size, 300);
  EXPECT_EQ(spec->context_length, 2048);
  EXPECT_TRUE(spec->tied_embeddings);
  EXPECT_EQ(spec->slot_specs.size(), 3u);
  EXPECT_EQ(ValidTpSizes(*spec, 8), (std::vector<int>{1, 2, 4}));
}

TEST_F(ModelSpecFileTest, MetadataErrorsNameFileAndKey) {
  {
    testing::GgufWriter w;
    w.AddString("general.architecture", "mamba");
    auto spec = LoadFrom(w, "mamba.gguf");
    ASSERT_FALSE(spec.ok());
    EXPECT_EQ(spec.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(spec.status().message().find("'mamba'"), std::string::npos);
  }
  {
    testing::GgufWriter w;
    w.AddString("general.architecture", "llama");
    w.AddUInt32("llama.block_count", 2);
    auto spec = LoadFrom(w, "partial.gguf");
    ASSERT_FALSE(spec.ok());
    EXPECT_EQ(spec.status().code(), StatusCode::kNotFound);
    EXPECT_NE(spec.status().message().find("llama.embedding_length"), std::string::npos);
    EXPECT_NE(spec.status().message().find("partial.gguf"), std::string::npos);
  }
  {
    testing::GgufWriter w;
    w.AddString("general.architecture", "llama");
    w.AddUInt32("llama.block_count", 2);
    w.AddUInt32("llama.embedding_length", 60);
    w.AddUInt32("llama.attention.head_count", 8);
    w.AddUInt32("llama.attention.head_count_kv", 3);
    w.AddUInt32("llama.feed_forward_length", 64);
    w.AddUInt32("llama.context_length", 128);
    w.AddUInt32("llama.vocab_size", 10);
    auto spec = LoadFrom(w, "uneven.gguf");
    ASSERT_FALSE(spec.ok());
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(spec.status().message().find("8 heads do not divide hidden size 60"),
              std::string::npos) << spec.status().message();
  }
  {
    testing::GgufWriter w;
    w.AddString("general.architecture", "llama");
    w.AddString("llama.block_count", "two");
    auto spec = LoadFrom(w, "typed.gguf");
    ASSERT_FALSE(spec.ok());
    EXPECT_NE(spec.status().message().find("llama.block_count"), std::string::npos);
    EXPECT_NE(spec.status().message().find("string"), std::string::npos);
  }
}

TEST_F(ModelSpecFileTest, Gemma3SlidingLayers) {
  // Gemma 3 270M's shape: 18 layers, 4 heads, 1 KV head, head size 256, window 512.
  testing::GgufWriter w;
  w.AddString("general.architecture", "gemma3");
  w.AddString("general.name", "Gemma 3 270m");
  w.AddUInt32("gemma3.block_count", 18);
  w.AddUInt32("gemma3.embedding_length", 640);
  w.AddUInt32("gemma3.attention.head_count", 4);
  w.AddUInt32("gemma3.attention.head_count_kv", 1);
  w.AddUInt32("gemma3.attention.key_length", 256);
  w.AddUInt32("gemma3.attention.value_length", 256);
  w.AddUInt32("gemma3.feed_forward_length", 2048);
  w.AddUInt32("gemma3.context_length", 32768);
  w.AddUInt32("gemma3.attention.sliding_window", 512);
  w.AddFloat32("gemma3.rope.freq_base", 1000000.0f);
  w.AddFloat32("gemma3.attention.layer_norm_rms_epsilon", 1e-6f);
  w.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "c"});
  auto spec = LoadFrom(w, "gemma3.gguf");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->head_dim, 256);
  EXPECT_EQ(spec->vocab_size, 3);
  ASSERT_EQ(spec->slot_specs.size(), 18u);
  int sliding = 0;
  for (int l = 0; l < 18; ++l) {
    const SlotSpec& slot = spec->slot_specs[l];
    EXPECT_EQ(slot.IsSliding(), l % 6 != 5) << l;
    if (slot.IsSliding()) {
      EXPECT_EQ(slot.window, 512);
      ++sliding;
    }
  }
  EXPECT_EQ(sliding, 15);
  EXPECT_EQ(ValidTpSizes(*spec, 8), (std::vector<int>{1, 2, 4}));
}

}  // namespace
}  // namespace headway
