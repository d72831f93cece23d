// The CUDA worker's forward pass against the CPU worker's on the real
// SmolLM2-135M checkpoint, through the step executor (chunked prefill and
// batched decode), and the device KV pool's sizing and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/gguf.h"
#include "common/model_spec.h"
#include "kernels/cuda/runtime.h"
#include "tests/gpu/gpu_test.h"
#include "tests/support/test_env.h"
#include "tests/worker/real_model_fixture.h"
#include "worker/cuda/cuda_decoder_model.h"
#include "worker/cuda/device_kv_pool.h"

namespace headway {
namespace {

using testing::RealModelFixture;

// Runs on machines without a GPU too: the errors a user gets there.
TEST(CudaWorkerSetupTest, NoGpuGivesClearErrors) {
  if (cuda::DeviceCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  auto budget = cuda::KvBudgetBytes(0, 0.9);
  ASSERT_FALSE(budget.ok());
  EXPECT_EQ(budget.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(budget.status().message().find("CUDA device 0"), std::string::npos)
      << budget.status().ToString();
  auto pool = cuda::CreateDeviceKvPool(KvCacheLayout{16, 64}, 0, 0.9);
  EXPECT_FALSE(pool.ok());
  EXPECT_FALSE(cuda::NoDeviceReason().empty());
}

TEST(CudaWorkerSetupTest, UtilizationOutsideUnitIntervalIsRefused) {
  for (double bad : {0.0, -0.5, 1.5}) {
    auto budget = cuda::KvBudgetBytes(0, bad);
    ASSERT_FALSE(budget.ok());
    EXPECT_EQ(budget.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(budget.status().message().find("(0, 1]"), std::string::npos);
  }
}

TEST(CudaKvPoolTest, SizedFromUtilizationAndRefusesTooLittle) {
  HW_SKIP_WITHOUT_GPU();
  auto info = cuda::SetDevice(0);
  ASSERT_TRUE(info.ok());
  const KvCacheLayout layout{16, 64};
  auto budget = cuda::KvBudgetBytes(0, 0.2);
  ASSERT_TRUE(budget.ok()) << budget.status().ToString();
  if (*budget < (int64_t(1) << 30)) GTEST_SKIP() << "GPU already busy: " << *budget << " bytes";
  auto pool = cuda::CreateDeviceKvPool(layout, 0, 0.2);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_TRUE((*pool)->on_device());
  EXPECT_EQ((*pool)->device(), 0);
  const int64_t expected = (*budget - (int64_t(256) << 20)) / int64_t(layout.BlockBytes());
  // The budget was read before the pool existed; allow the runtime's own slack.
  EXPECT_NEAR(double((*pool)->num_blocks()), double(expected), double(expected) * 0.02);
  // Now almost nothing is left under a utilization just above what is used.
  const double used_fraction =
      double(info->total_bytes - cuda::SetDevice(0)->free_bytes) / double(info->total_bytes);
  auto refused = cuda::CreateDeviceKvPool(layout, 0, std::min(1.0, used_fraction + 1e-4));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("cache.gpu_memory_utilization"), std::string::npos)
      << refused.status().ToString();
}

// How one prompt's GPU logits differ from the CPU's.
struct LogitGap {
  float max_diff = 0.0f;    // max over the vocabulary of |gpu - cpu|
  float cpu_margin = 0.0f;  // the CPU's top-1 logit minus its top-2
  int cpu_top = 0;
  int gpu_top = 0;
};

LogitGap CompareLogits(const std::vector<float>& cpu, const std::vector<float>& gpu) {
  LogitGap gap;
  for (size_t t = 0; t < cpu.size(); ++t) {
    gap.max_diff = std::max(gap.max_diff, std::fabs(cpu[t] - gpu[t]));
  }
  std::vector<float> sorted = cpu;
  std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
  gap.cpu_margin = sorted[0] - sorted[1];
  gap.cpu_top = int(std::max_element(cpu.begin(), cpu.end()) - cpu.begin());
  gap.gpu_top = int(std::max_element(gpu.begin(), gpu.end()) - gpu.begin());
  return gap;
}

class CudaModelTest : public RealModelFixture {
 protected:
  static constexpr int64_t kCpuPoolBytes = int64_t(256) << 20;

  // The GPU model of SmolLM2 at TP 1 and a device pool on GPU 0.
  void StartGpuExecutor(bool exact_matmuls,
                        KvCacheDtype kv_dtype = KvCacheDtype::kFloat32) {
    ModelSpec spec;
    auto weights = testing::LoadRealWeights(testing::SmolLm2Path(), &spec);
    ASSERT_NE(weights, nullptr);
    cuda::CudaModelOptions options;
    options.device = 0;
    options.max_tokens_per_step = 8192;
    options.exact_matmuls = exact_matmuls;
    // Greedy rows are still picked on the GPU (the tokens compared below come
    // from there); the logits come back too, for the logit comparisons.
    options.copy_all_logits = true;
    auto model = cuda::CudaDecoderModel::Create(spec, std::move(weights), nullptr, options);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    gpu_model_ = std::move(*model);
    auto pool =
        cuda::CreateDeviceKvPool(KvCacheLayout{kBlockSize, spec.head_dim, kv_dtype}, 0, 0.3);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    StartExecutor(gpu_model_.get(), std::move(*pool));
  }

  static std::vector<std::vector<int32_t>> Prompts(const nlohmann::json& ref) {
    std::vector<std::vector<int32_t>> prompts;
    for (const nlohmann::json& c : ref["cases"]) prompts.push_back(testing::Ids(c["prompt_ids"]));
    return prompts;
  }

  std::unique_ptr<cuda::CudaDecoderModel> gpu_model_;
};

// With every product on the stored quantised weights (f32 activations, as
// the CPU worker, and the embedding read from an f32 table), the GPU differs
// from the CPU only in summation order: the same greedy tokens, prompts
// prefilled in chunks of 7 and decoded in one batch. (Were the embedding
// read from the bf16 table, rounding SmolLM2's Q8_0 embedding to bf16 alone
// would move these logits by up to 0.021, measured on the CPU.)
TEST_F(CudaModelTest, GreedyOnGpuEqualsCpuWithExactWeights) {
  HW_SKIP_WITHOUT_GPU();
  HW_REQUIRE_MODEL(testing::SmolLm2Path());
  const nlohmann::json ref = testing::ReadJson("reference/smollm2_greedy.json");
  const auto prompts = Prompts(ref);
  ASSERT_NO_FATAL_FAILURE(StartExecutorOnModel(testing::SmolLm2Path(), kCpuPoolBytes));
  const auto cpu_logits = LastPromptLogits(ref);
  const auto cpu_tokens = Generate(prompts, 24, 7);
  ASSERT_NO_FATAL_FAILURE(StartGpuExecutor(/*exact_matmuls=*/true));
  const auto gpu_logits = LastPromptLogits(ref);
  const auto gpu_tokens = Generate(prompts, 24, 7);
  ASSERT_EQ(cpu_logits.size(), gpu_logits.size());
  float max_diff = 0.0f;
  for (size_t i = 0; i < cpu_logits.size(); ++i) {
    for (size_t t = 0; t < cpu_logits[i].size(); ++t) {
      max_diff = std::max(max_diff, std::fabs(cpu_logits[i][t] - gpu_logits[i][t]));
    }
  }
  std::printf("[ measured ] exact weights: max |logit GPU - CPU| over %zu prompts = %g\n",
              cpu_logits.size(), max_diff);
  EXPECT_LE(max_diff, 1e-2f);
  EXPECT_EQ(gpu_tokens, cpu_tokens);
}

// Serving mode: prefill products through cuBLAS on bf16 weights and
// activations (decode rows still on the stored blocks). bf16 keeps 8
// significant bits, so logits move by up to a few tenths and near-ties may
// flip; the greedy tokens must agree wherever the CPU's top-2 margin is
// clear.
TEST_F(CudaModelTest, Bf16PrefillStaysCloseToCpu) {
  HW_SKIP_WITHOUT_GPU();
  HW_REQUIRE_MODEL(testing::SmolLm2Path());
  const nlohmann::json ref = testing::ReadJson("reference/smollm2_greedy.json");
  ASSERT_NO_FATAL_FAILURE(StartExecutorOnModel(testing::SmolLm2Path(), kCpuPoolBytes));
  const auto cpu_logits = LastPromptLogits(ref);
  ASSERT_NO_FATAL_FAILURE(StartGpuExecutor(/*exact_matmuls=*/false));
  const auto gpu_logits = LastPromptLogits(ref);
  ASSERT_EQ(cpu_logits.size(), gpu_logits.size());
  for (size_t i = 0; i < cpu_logits.size(); ++i) {
    const LogitGap gap = CompareLogits(cpu_logits[i], gpu_logits[i]);
    std::printf(
        "[ measured ] bf16 prefill, prompt %zu: max |logit GPU - CPU| = %g, CPU top-2 "
        "margin %g, top token CPU %d GPU %d\n",
        i, gap.max_diff, gap.cpu_margin, gap.cpu_top, gap.gpu_top);
    EXPECT_LE(gap.max_diff, 1.0f);
    if (gap.cpu_margin > 2.0f * gap.max_diff) {
      EXPECT_EQ(gap.cpu_top, gap.gpu_top);
    }
  }
}

// Every KV cache dtype on the GPU against the CPU in the same dtype, with
// exact weights. The GPU writes the bytes the CPU would write from the same
// f32 K and V (CudaRopeAppendKv), but its f32 K and V differ from the CPU's
// in summation order, so a value on a rounding boundary can land one step
// apart: float16's step is 2^-11 of the value, close to f32's noise here;
// q8_0's and q4_0's steps are 1/127 and 1/8 of the group's largest value.
// So float16 must keep the greedy tokens, and the q dtypes the tokens
// whose CPU top-2 margin is clearly above the logit difference.
TEST_F(CudaModelTest, EveryKvCacheDtypeOnGpuStaysWithCpu) {
  HW_SKIP_WITHOUT_GPU();
  HW_REQUIRE_MODEL(testing::SmolLm2Path());
  const nlohmann::json ref = testing::ReadJson("reference/smollm2_greedy.json");
  const auto prompts = Prompts(ref);
  auto cpu_model = testing::LoadRealModel(testing::SmolLm2Path());
  ASSERT_NE(cpu_model, nullptr);
  for (KvCacheDtype dtype : {KvCacheDtype::kFloat16, KvCacheDtype::kQ8_0, KvCacheDtype::kQ4_0,
                             KvCacheDtype::kQ4_0Hadamard}) {
    const char* name = KvCacheDtypeName(dtype);
    auto cpu_pool =
        KvPool::Create({kBlockSize, cpu_model->spec().head_dim, dtype}, kCpuPoolBytes);
    ASSERT_TRUE(cpu_pool.ok()) << cpu_pool.status().ToString();
    StartExecutor(cpu_model.get(), std::move(*cpu_pool));
    const auto cpu_logits = LastPromptLogits(ref);
    const auto cpu_tokens = Generate(prompts, 24, 7);
    ASSERT_NO_FATAL_FAILURE(StartGpuExecutor(/*exact_matmuls=*/true, dtype));
    const auto gpu_logits = LastPromptLogits(ref);
    const auto gpu_tokens = Generate(prompts, 24, 7);
    ASSERT_EQ(cpu_logits.size(), gpu_logits.size());
    for (size_t i = 0; i < cpu_logits.size(); ++i) {
      const LogitGap gap = CompareLogits(cpu_logits[i], gpu_logits[i]);
      std::printf("[ measured ] %s KV, prompt %zu: max |logit GPU - CPU| = %g, CPU top-2 margin %g\n",
                  name, i, gap.max_diff, gap.cpu_margin);
      EXPECT_LE(gap.max_diff, dtype == KvCacheDtype::kFloat16 ? 1e-2f : 1.0f) << name;
      if (gap.cpu_margin > 2.0f * gap.max_diff) {
        EXPECT_EQ(gap.cpu_top, gap.gpu_top) << name;
      }
    }
    if (dtype == KvCacheDtype::kFloat16) {
      EXPECT_EQ(gpu_tokens, cpu_tokens) << name;
    }
  }
}

}  // namespace
}  // namespace headway
