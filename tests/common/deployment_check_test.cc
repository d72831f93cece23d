// Checks of a deployment config against the model and against what this
// build serves (common/deployment_check.h).
#include "common/deployment_check.h"

#include <gtest/gtest.h>

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
