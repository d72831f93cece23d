// The startup checks shared by the three binaries (common/startup.h).
#include "common/startup.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/deployment_check.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/process.h"

namespace headway {
namespace {

TEST(DefaultModelDirTest, PrefersHeadwayModelDirThenHome) {
  EXPECT_EQ(DefaultModelDir("/models", "/home/u"), "/models");
  EXPECT_EQ(DefaultModelDir(nullptr, "/home/u"), "/home/u/.cache/headway/models");
  EXPECT_EQ(DefaultModelDir("", "/home/u"), "/home/u/.cache/headway/models");
  EXPECT_EQ(DefaultModelDir(nullptr, nullptr), "/root/.cache/headway/models");
  EXPECT_EQ(DefaultModelDir("", ""), "/root/.cache/headway/models");
}

class OpenAndCheckModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("headway-startup-test");
    model_path_ = dir_ + "/tiny.gguf";
    // 4 query heads, 2 KV heads: TP 1, 2 and 4 shard, TP 3 does not.
    ASSERT_TRUE(testing::WriteTinyLlama(model_path_, {}).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Config OneInstance(int tp_size, const std::string& device = "cpu") const {
    Config config;
    config.model_path = model_path_;
    config.pools.resize(1);
    config.pools[0].instances.resize(1);
    config.pools[0].instances[0].tp_size = tp_size;
    config.pools[0].instances[0].device = device;
    return config;
  }

  std::string dir_;
  std::string model_path_;
};

TEST_F(OpenAndCheckModelTest, AGoodModelComesBackOpenWithItsSpec) {
  StartupCheck failed = StartupCheck::kSupported;
  Result<StartupModel> model = OpenAndCheckModel(OneInstance(2), {}, &failed);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ASSERT_NE(model->file, nullptr);
  EXPECT_EQ(model->spec.name, "tiny-llama");
  EXPECT_EQ(model->spec.num_kv_heads, 2);
  EXPECT_EQ(failed, StartupCheck::kSupported);  // untouched on success
}

TEST_F(OpenAndCheckModelTest, AMissingFileIsTheModelFileCheck) {
  Config config = OneInstance(1);
  config.model_path = dir_ + "/absent.gguf";
  StartupCheck failed;
  Result<StartupModel> model = OpenAndCheckModel(config, {}, &failed);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(failed, StartupCheck::kModelFile);
  EXPECT_EQ(model.status().code(), StatusCode::kNotFound);
  EXPECT_NE(model.status().message().find("absent.gguf"), std::string::npos)
      << model.status().ToString();
}

TEST_F(OpenAndCheckModelTest, AFileWithoutModelMetadataIsTheModelSpecCheck) {
  testing::GgufWriter writer;
  writer.AddString("general.architecture", "llama");
  const std::string path = dir_ + "/bare.gguf";
  ASSERT_TRUE(writer.WriteFile(path).ok());
  Config config = OneInstance(1);
  config.model_path = path;
  StartupCheck failed;
  Result<StartupModel> model = OpenAndCheckModel(config, {}, &failed);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(failed, StartupCheck::kModelSpec) << model.status().ToString();
}

// Metadata that outruns the tensors is found here, by the coordinator and
// the launcher, not by each worker as it loads weights.
TEST_F(OpenAndCheckModelTest, ABlockCountBeyondTheTensorsNamesTheMissingTensor) {
  ASSERT_TRUE(testing::SetUInt32Key(model_path_, "llama.block_count", 100000).ok());
  StartupCheck failed;
  Result<StartupModel> model = OpenAndCheckModel(OneInstance(1), {}, &failed);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(failed, StartupCheck::kModelSpec);
  EXPECT_EQ(model.status().code(), StatusCode::kNotFound);
  const std::string& message = model.status().message();
  for (const char* part : {"tiny-llama", "tiny.gguf", "tensor blk.2.attn_norm.weight is missing",
                           "100000 layers (llama.block_count)", "has tensors for 2"}) {
    EXPECT_NE(message.find(part), std::string::npos) << "`" << part << "` not in: " << message;
  }
}

TEST_F(OpenAndCheckModelTest, ATensorShapeTheMetadataDoesNotImplyIsNamed) {
  ASSERT_TRUE(testing::SetUInt32Key(model_path_, "llama.feed_forward_length", 256).ok());
  StartupCheck failed;
  Result<StartupModel> model = OpenAndCheckModel(OneInstance(1), {}, &failed);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(failed, StartupCheck::kModelSpec);
  EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument);
  const std::string& message = model.status().message();
  for (const char* part : {"tensor blk.0.ffn_gate.weight has shape {64, 128}",
                           "the metadata implies {64, 256}"}) {
    EXPECT_NE(message.find(part), std::string::npos) << "`" << part << "` not in: " << message;
  }
}

TEST_F(OpenAndCheckModelTest, AMissingHeadPatternIsTheHeadPatternCheck) {
  Config config = OneInstance(1);
  config.head_pattern_path = dir_ + "/no-such-pattern.yaml";
  StartupCheck failed;
  Result<StartupModel> model = OpenAndCheckModel(config, {}, &failed);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(failed, StartupCheck::kHeadPattern) << model.status().ToString();
  EXPECT_NE(model.status().message().find("model.head_pattern"), std::string::npos)
      << model.status().ToString();
}

TEST_F(OpenAndCheckModelTest, ATpSizeTheModelCannotShardFailsOnlyTheDeploymentCheck) {
  StartupCheck failed;
  Result<StartupModel> model = OpenAndCheckModel(OneInstance(3), {}, &failed);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(failed, StartupCheck::kAgainstModel);
  // The check's own status, unchanged.
  Result<StartupModel> good = OpenAndCheckModel(OneInstance(1), {}, nullptr);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(model.status().ToString(),
            CheckConfigAgainstModel(OneInstance(3), good->spec).ToString());
  EXPECT_NE(model.status().message().find("pools[0].instances[0].tp_size"), std::string::npos)
      << model.status().ToString();

  // A worker checks only itself.
  StartupCheckOptions worker;
  worker.check_deployment = false;
  EXPECT_TRUE(OpenAndCheckModel(OneInstance(3), worker, nullptr).ok());
}

TEST_F(OpenAndCheckModelTest, ADeviceThisBuildLacksIsRefusedBeforeTheFileOpens) {
  if (BuiltWithCuda()) GTEST_SKIP() << "this build serves cuda devices";
  Config config = OneInstance(1, "cuda:0");
  config.model_path = dir_ + "/absent.gguf";  // never opened: kSupported comes first
  StartupCheck failed;
  Result<StartupModel> model = OpenAndCheckModel(config, {}, &failed);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(failed, StartupCheck::kSupported);
  EXPECT_EQ(model.status().code(), StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace headway
