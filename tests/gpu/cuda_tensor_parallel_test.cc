// The CUDA forward pass on small random llama models written as GGUF files:
// against the CPU forward pass on the same weights (one GPU), and NCCL TP 2
// against TP 1 (two GPUs). Needs no model download, so it runs in the
// kernels part of the GPU check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "comm/communicator.h"
#include "common/gguf.h"
#include "common/model_spec.h"
#include "tests/gpu/gpu_test.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/process.h"
#include "tests/support/test_env.h"
#include "tests/worker/fixed_workload.h"
#include "worker/cuda/cuda_decoder_model.h"
#include "worker/decoder_model.h"

namespace headway {
namespace {

constexpr int kBlockSize = 16;
constexpr int kMaxBlocks = 3;  // per slot: 48 positions

using testing::GreedyTokens;
using testing::PlaceholderDecodeTokens;
using testing::RunWorkload;
using testing::StepLogits;
using testing::WorkloadBlocks;

enum class Backend { kCpu, kGpuExact, kGpuServing };

// A tiny llama or gemma3 with head_dim 64 (the smallest the CUDA attention
// serves); gemma3's 6 layers have windows of 8 on layers 0-4.
std::string WriteTinyModel(const std::string& dir, int num_heads, int num_kv_heads,
                           const std::string& architecture = "llama") {
  testing::TinyLlamaOptions o;
  o.name = "tiny-gpu-" + architecture;
  o.architecture = architecture;
  o.num_heads = num_heads;
  o.num_kv_heads = num_kv_heads;
  o.hidden_size = 64 * num_heads;
  o.intermediate_size = 256;
  o.vocab_size = 320;
  o.num_layers = 2;
  if (architecture == "gemma3") {
    o.num_layers = 6;
    o.sliding_window = 8;
  }
  const std::string path = dir + "/" + architecture + ".gguf";
  EXPECT_TRUE(testing::WriteTinyLlama(path, o).ok());
  return path;
}

// The fixed workload (tests/worker/fixed_workload.h) fed `decode_tokens`,
// on one rank; rank 0's logits per step into `out`.
Status RunRank(const std::string& path, Backend backend, int tp_size, int tp_rank, int device,
               Communicator* comm, const std::vector<std::vector<int32_t>>& decode_tokens,
               StepLogits* out) {
  HW_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  HW_ASSIGN_OR_RETURN(ModelSpec spec, LoadModelSpec(*file));
  const TpShard shard = ShardForRank(spec, tp_size, tp_rank);
  HW_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights,
                      ModelWeights::Load(*file, spec, shard));
  const KvCacheLayout layout{kBlockSize, spec.head_dim};
  std::unique_ptr<ForwardModel> model;
  std::unique_ptr<KvPool> pool;
  if (backend == Backend::kCpu) {
    HW_ASSIGN_OR_RETURN(model, DecoderModel::Create(spec, std::move(weights), comm));
    const int num_blocks = WorkloadBlocks(*model, kMaxBlocks);
    HW_ASSIGN_OR_RETURN(pool, KvPool::Create(layout, int64_t(num_blocks) * layout.BlockBytes()));
  } else {
    cuda::CudaModelOptions options;
    options.device = device;
    options.max_tokens_per_step = 64;
    options.max_seqs_per_step = 8;
    options.max_model_len = kMaxBlocks * kBlockSize;
    options.block_size = kBlockSize;
    options.exact_matmuls = backend == Backend::kGpuExact;
    HW_ASSIGN_OR_RETURN(model,
                        cuda::CudaDecoderModel::Create(spec, std::move(weights), comm, options));
    const int num_blocks = WorkloadBlocks(*model, kMaxBlocks);
    HW_ASSIGN_OR_RETURN(cuda::DeviceBuffer memory,
                        cuda::DeviceBuffer::Allocate(size_t(num_blocks) * layout.BlockBytes()));
    HW_RETURN_IF_ERROR(cuda::Memset(memory.data(), 0, memory.bytes(), nullptr));
    auto owner = std::make_shared<cuda::DeviceBuffer>(std::move(memory));
    pool = KvPool::WrapDeviceMemory(layout, num_blocks, owner->as<uint8_t>(), device, owner);
  }
  return RunWorkload(model.get(), pool.get(), kMaxBlocks, decode_tokens, out);
}

// Every rank of `tp_size` as a thread, rank r on GPU r (NCCL at TP > 1).
StepLogits RunTp(const std::string& path, Backend backend, int tp_size,
                 const std::vector<std::vector<int32_t>>& decode_tokens) {
  CommunicatorOptions options;
  options.backend = "nccl";
  options.device = 0;
  options.key_prefix = "gpu-tp-" + std::to_string(tp_size);
  return testing::RunRanksAsThreads(
      tp_size, options, [&](int rank, Communicator* comm, StepLogits* out) {
        return RunRank(path, backend, tp_size, rank, rank, comm, decode_tokens, out);
      });
}

// Max |a - b| and max |b| over all steps.
std::pair<double, double> Compare(const StepLogits& a, const StepLogits& b) {
  double diff = 0.0, scale = 0.0;
  EXPECT_EQ(a.size(), b.size());
  for (size_t s = 0; s < std::min(a.size(), b.size()); ++s) {
    EXPECT_EQ(a[s].size(), b[s].size()) << "step " << s;
    for (size_t i = 0; i < std::min(a[s].size(), b[s].size()); ++i) {
      diff = std::max(diff, double(std::fabs(a[s][i] - b[s][i])));
      scale = std::max(scale, double(std::fabs(b[s][i])));
    }
  }
  return {diff, scale};
}

class CudaTinyModelTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("headway-gpu-tiny"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

// The CPU worker's forward pass decides the tokens; the GPU's must give the
// same logits: to f32 rounding with the exact weights, within bf16's 8-bit
// precision with the serving path's bf16 prefill GEMMs.
class CudaTinyArchitectureTest : public CudaTinyModelTest,
                                 public ::testing::WithParamInterface<std::string> {};

TEST_P(CudaTinyArchitectureTest, GpuForwardEqualsCpuOnRandomWeights) {
  HW_SKIP_WITHOUT_GPU();
  const std::string path = WriteTinyModel(dir_, 4, GetParam() == "gemma3" ? 1 : 2, GetParam());
  std::vector<std::vector<int32_t>> tokens = PlaceholderDecodeTokens();
  tokens = GreedyTokens(RunTp(path, Backend::kCpu, 1, tokens), 320);
  tokens.pop_back();
  const StepLogits cpu = RunTp(path, Backend::kCpu, 1, tokens);
  const StepLogits exact = RunTp(path, Backend::kGpuExact, 1, tokens);
  const StepLogits serving = RunTp(path, Backend::kGpuServing, 1, tokens);
  const auto [exact_diff, scale] = Compare(exact, cpu);
  const auto [serving_diff, unused] = Compare(serving, cpu);
  std::printf(
      "[ measured ] tiny %s, GPU vs CPU: max |logit diff| %.3g (exact weights), %.3g "
      "(bf16 prefill); max |logit| %.3g\n",
      GetParam().c_str(), exact_diff, serving_diff, scale);
  testing::RecordError(exact_diff, "exact_max_abs_error");
  testing::RecordError(serving_diff, "bf16_max_abs_error");
  EXPECT_LE(exact_diff, 1e-4 * std::max(1.0, scale));
  EXPECT_LE(serving_diff, 0.02 * std::max(1.0, scale));
  EXPECT_EQ(GreedyTokens(exact, 320), GreedyTokens(cpu, 320));
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaTinyArchitectureTest,
                         ::testing::Values(std::string("llama"), std::string("gemma3")));

// NCCL TP 2 on two GPUs (one KV head per rank) against TP 1 on one. NCCL
// refuses two ranks on one GPU, so a one-GPU machine skips this; its
// communicator setup and errors are CudaNcclTest's.
TEST_F(CudaTinyModelTest, NcclTp2EqualsTp1) {
  HW_SKIP_WITHOUT_GPU();
  if (cuda::DeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs (this machine has 1)";
  const std::string path = WriteTinyModel(dir_, 4, 2);
  std::vector<std::vector<int32_t>> tokens = PlaceholderDecodeTokens();
  tokens = GreedyTokens(RunTp(path, Backend::kGpuExact, 1, tokens), 320);
  tokens.pop_back();
  const StepLogits tp1 = RunTp(path, Backend::kGpuExact, 1, tokens);
  const StepLogits tp2 = RunTp(path, Backend::kGpuExact, 2, tokens);
  const auto [diff, scale] = Compare(tp2, tp1);
  std::printf("[ measured ] tiny llama on GPUs, NCCL TP 2 vs TP 1: max |logit diff| %.3g\n", diff);
  testing::RecordError(diff);
  EXPECT_LE(diff, 1e-4 * std::max(1.0, scale));
  EXPECT_EQ(GreedyTokens(tp2, 320), GreedyTokens(tp1, 320));
}

}  // namespace
}  // namespace headway
