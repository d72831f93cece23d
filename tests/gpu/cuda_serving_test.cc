// A whole deployment (headway-launch, coordinator, one worker) serving
// SmolLM2 from a GPU worker, against the same deployment on a CPU worker.
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/gpu/gpu_test.h"
#include "tests/support/deployment.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

std::vector<std::string> ServeGreedy(const std::string& device, std::string* log) {
  DeploymentOptions options;
  options.model_path = SmolLm2Path();
  options.device = device;
  options.gpu_memory_utilization = 0.2;
  std::string error;
  auto deployment = Deployment::Start(options, &error);
  EXPECT_NE(deployment, nullptr) << device << ": " << error;
  if (deployment == nullptr) return {};
  std::vector<nlohmann::json> prompts;
  for (const std::string& p : SmolLm2TestPrompts()) prompts.push_back(p);
  auto texts = GreedyTexts(
      [&](const std::string& body) { return deployment->Post("/v1/completions", body); }, prompts,
      32, 1);
  *log = deployment->Log();
  return texts;
}

// Every GPU reply is a completion, and the greedy texts match the CPU
// worker's except where bf16 prefill products flip a near-tie (the exact
// comparison of the forward pass is CudaModelTest.GreedyOnGpuEqualsCpu*).
TEST(CudaServingTest, GpuWorkerServesLikeCpuWorker) {
  HW_SKIP_WITHOUT_GPU();
  HW_REQUIRE_MODEL(SmolLm2Path());
  std::string cpu_log, gpu_log;
  const auto cpu = ServeGreedy("cpu", &cpu_log);
  const auto gpu = ServeGreedy("cuda:0", &gpu_log);
  ASSERT_EQ(cpu.size(), gpu.size()) << gpu_log;
  int same = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    EXPECT_FALSE(IsErrorText(gpu[i])) << gpu[i] << "\n" << gpu_log;
    same += gpu[i] == cpu[i];
    if (gpu[i] != cpu[i]) {
      std::printf("[ measured ] prompt %zu differs:\n  cpu: %s\n  gpu: %s\n", i, cpu[i].c_str(),
                  gpu[i].c_str());
    }
  }
  std::printf("[ measured ] GPU worker greedy texts equal to the CPU worker's: %d of %zu\n", same,
              gpu.size());
  EXPECT_GE(2 * same, int(gpu.size()));
}

}  // namespace
}  // namespace headway::testing
