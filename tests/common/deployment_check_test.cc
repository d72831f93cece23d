// Checks of a deployment config against the model and against what this
// build serves (common/deployment_check.h).
#include "common/deployment_check.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace headway {
namespace {

Config OneInstance(int tp_size) {
  Config config;
  config.pools.resize(1);
  config.pools[0].instances.resize(1);
  config.pools[0].instances[0].tp_size = tp_size;
  return config;
}

ModelSpec SmolLm2Shape() {
  ModelSpec spec;
  spec.name = "smollm2-shape";
  spec.architecture = "llama";
  spec.num_heads = 9;
  spec.num_kv_heads = 3;
  spec.head_dim = 64;
  spec.intermediate_size = 1536;
  spec.context_length = 8192;
  return spec;
}

TEST(DeploymentCheckTest, TpSizeIsCheckedPerInstanceWithItsKey) {
  EXPECT_TRUE(CheckConfigAgainstModel(OneInstance(3), SmolLm2Shape()).ok());
  Config config = OneInstance(1);
  config.pools[0].instances.push_back(config.pools[0].instances[0]);
  config.pools[0].instances[1].tp_size = 2;
  Status s = CheckConfigAgainstModel(config, SmolLm2Shape());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("`pools[0].instances[1].tp_size` = 2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("valid TP sizes: 1, 3"), std::string::npos) << s.message();
}

TEST(DeploymentCheckTest, MaxModelLenBeyondTheModelsContextIsRefused) {
  Config config = OneInstance(1);
  config.max_model_len = 9000;
  Status s = CheckConfigAgainstModel(config, SmolLm2Shape());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("scheduler.max_model_len"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("8192"), std::string::npos) << s.message();
}

// q8_0 and q4_0 quantize head vectors in groups of 32 values.
TEST(DeploymentCheckTest, KvCacheDtypeMustGroupTheModelsHeadDim) {
  ModelSpec spec = SmolLm2Shape();
  Config config = OneInstance(1);
  for (KvCacheDtype dtype : {KvCacheDtype::kFloat32, KvCacheDtype::kFloat16, KvCacheDtype::kQ8_0,
                             KvCacheDtype::kQ4_0}) {
    config.kv_cache_dtype = dtype;
    spec.head_dim = 64;
    EXPECT_TRUE(CheckConfigAgainstModel(config, spec).ok()) << KvCacheDtypeName(dtype);
    spec.head_dim = 80;
    Status s = CheckConfigAgainstModel(config, spec);
    const bool grouped = dtype == KvCacheDtype::kQ8_0 || dtype == KvCacheDtype::kQ4_0;
    EXPECT_EQ(s.ok(), !grouped) << KvCacheDtypeName(dtype);
    if (grouped) {
      EXPECT_NE(s.message().find("`cache.kv_cache_dtype` = " + std::string(KvCacheDtypeName(dtype))),
                std::string::npos)
          << s.message();
      EXPECT_NE(s.message().find("head_dim 80"), std::string::npos) << s.message();
    }
  }
}

// Gemma 3 270M's attention: 18 layers of one KV head, head_dim 256, every
// sixth layer full, the others sliding over 512 positions.
ModelSpec Gemma3Shape() {
  ModelSpec spec;
  spec.name = "gemma3-shape";
  spec.architecture = "gemma3";
  spec.num_layers = 18;
  spec.num_heads = 4;
  spec.num_kv_heads = 1;
  spec.head_dim = 256;
  spec.intermediate_size = 2048;
  spec.context_length = 32768;
  for (int l = 0; l < spec.num_layers; ++l) {
    spec.slot_specs.push_back(SlotSpec{l % 6 == 5 ? 0 : 512, 0});
  }
  return spec;
}

Config MixedDtypes(KvCacheDtype full, KvCacheDtype sliding) {
  Config config = OneInstance(1);
  config.kv_cache_dtype = full;
  config.kv_cache_dtype_sliding = sliding;
  return config;
}

void ExpectMessageHas(const Status& s, const std::vector<std::string>& fragments) {
  for (const std::string& f : fragments) {
    EXPECT_NE(s.message().find(f), std::string::npos) << "no '" << f << "' in: " << s.message();
  }
}

TEST(DeploymentCheckTest, SlidingDtypeOfAGemmaLikeModelIsAccepted) {
  for (KvCacheDtype sliding : {KvCacheDtype::kFloat16, KvCacheDtype::kQ8_0, KvCacheDtype::kQ4_0,
                               KvCacheDtype::kQ4_0Hadamard}) {
    Status s = CheckConfigAgainstModel(MixedDtypes(KvCacheDtype::kFloat32, sliding), Gemma3Shape());
    EXPECT_TRUE(s.ok()) << KvCacheDtypeName(sliding) << ": " << s.ToString();
  }
  // The other way round too: coarse full slots, finer sliding ones.
  EXPECT_TRUE(CheckConfigAgainstModel(MixedDtypes(KvCacheDtype::kQ8_0, KvCacheDtype::kFloat32),
                                      Gemma3Shape())
                  .ok());
}

TEST(DeploymentCheckTest, SlidingDtypeMustGroupTheModelsHeadDim) {
  ModelSpec spec = Gemma3Shape();
  spec.head_dim = 80;
  Status s = CheckConfigAgainstModel(MixedDtypes(KvCacheDtype::kFloat32, KvCacheDtype::kQ8_0), spec);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  ExpectMessageHas(s, {"`cache.kv_cache_dtype_sliding` = q8_0", "head_dim 80", "multiple of 32"});
  // The full dtype is still checked, under its own key.
  s = CheckConfigAgainstModel(MixedDtypes(KvCacheDtype::kQ4_0, KvCacheDtype::kFloat32), spec);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  ExpectMessageHas(s, {"`cache.kv_cache_dtype` = q4_0", "head_dim 80"});
}

// A model with no sliding slot never uses the sliding dtype: nothing about
// it can be wrong.
TEST(DeploymentCheckTest, SlidingDtypeOfAModelWithoutSlidingSlotsIsIgnored) {
  ModelSpec spec = SmolLm2Shape();
  spec.num_layers = 2;
  spec.slot_specs.assign(size_t(spec.num_layers) * spec.num_kv_heads, SlotSpec{});
  spec.head_dim = 80;
  Config config = MixedDtypes(KvCacheDtype::kFloat32, KvCacheDtype::kQ8_0);
  config.kv_transfer_enabled = true;
  EXPECT_TRUE(CheckConfigAgainstModel(config, spec).ok());
}

// Prefill/decode pools (or a kv_transfer section) move each block in its
// own size (granules of the arena, common/kv_arena.h): two dtypes are
// served disaggregated too.
TEST(DeploymentCheckTest, TwoDtypesWithKvTransferAreAccepted) {
  Config pd = MixedDtypes(KvCacheDtype::kFloat32, KvCacheDtype::kQ8_0);
  pd.pools.push_back(pd.pools[0]);
  pd.pools[0].name = "prefill";
  pd.pools[0].role = PoolRole::kPrefill;
  pd.pools[1].name = "decode";
  pd.pools[1].role = PoolRole::kDecode;
  Status s = CheckConfigAgainstModel(pd, Gemma3Shape());
  EXPECT_TRUE(s.ok()) << s.ToString();
  Config section = MixedDtypes(KvCacheDtype::kFloat32, KvCacheDtype::kQ8_0);
  section.kv_transfer_enabled = true;
  s = CheckConfigAgainstModel(section, Gemma3Shape());
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// A head pattern (smollm2-streaming.yaml) streams one KV head of a layer
// and not the others; the attention kernel reads a layer in one dtype.
TEST(DeploymentCheckTest, TwoDtypesInOneLayerAreRefused) {
  ModelSpec spec = SmolLm2Shape();
  spec.num_layers = 4;
  spec.slot_specs.assign(size_t(spec.num_layers) * spec.num_kv_heads, SlotSpec{});
  spec.slot_specs[2 * 3 + 1] = SlotSpec{256, 64};  // layer 2, KV head 1
  Status s = CheckConfigAgainstModel(MixedDtypes(KvCacheDtype::kFloat32, KvCacheDtype::kQ8_0), spec);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  ExpectMessageHas(s, {"`cache.kv_cache_dtype` = float32", "`cache.kv_cache_dtype_sliding` = q8_0",
                       "layer 2", "KV head 1", "head_pattern"});
  // Whole layers streaming are fine.
  for (int h = 0; h < spec.num_kv_heads; ++h) spec.slot_specs[2 * 3 + h] = SlotSpec{256, 64};
  EXPECT_TRUE(
      CheckConfigAgainstModel(MixedDtypes(KvCacheDtype::kFloat32, KvCacheDtype::kQ8_0), spec).ok());
  // As is one dtype for every head.
  spec.slot_specs[2 * 3 + 0] = SlotSpec{};
  EXPECT_TRUE(
      CheckConfigAgainstModel(MixedDtypes(KvCacheDtype::kQ8_0, KvCacheDtype::kQ8_0), spec).ok());
}

TEST(DeploymentCheckTest, WhatIsNotBuiltYetIsRefusedNotServedAsSomethingElse) {
  EXPECT_TRUE(CheckSupported(OneInstance(1)).ok());
  Status s;
  Config gpu = OneInstance(1);
  gpu.pools[0].instances[0].device = "cuda:0";
  s = CheckSupported(gpu, /*cuda_built=*/false);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("cuda:0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("CUDA toolkit"), std::string::npos) << s.message();
  EXPECT_TRUE(CheckSupported(gpu, /*cuda_built=*/true).ok());
  EXPECT_EQ(CheckSupported(gpu).ok(), BuiltWithCuda());
}

}  // namespace
}  // namespace headway
