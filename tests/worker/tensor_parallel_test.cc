// The sharded forward pass at TP 2, 3 and 4 against TP 1 on tiny random
// llama models written as GGUF files: KV heads split (TP 2 over 2 KV heads),
// replicated (TP 2 and 4 over 1 KV head) and the odd TP 3 (3 KV heads, vocab
// padded). Every rank is a thread with its own weights shard, KV pool and
// communicator, exactly as the worker process builds them.
//
// The batch mixes two prefills of different lengths, then decodes both for
// several steps, teacher-forced with TP 1's greedy tokens so every TP size
// sees the same inputs. Rank 0's logits must match TP 1's: the all-reduce
// adds the ranks' partial sums in a different order than one rank's matmul
// adds its terms, so the results differ by float rounding only. For these
// models (weights uniform in +-0.1, logits of order 1) that is ~1e-6; 1e-4
// leaves a wide margin while any wrong shard, head mapping or missing
// all-reduce moves logits by order 1e-1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "common/gguf.h"
#include "common/model_spec.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/process.h"
#include "tests/support/test_env.h"
#include "tests/worker/fixed_workload.h"
#include "worker/decoder_model.h"
#include "worker/kv_pool.h"
#include "worker/model_weights.h"

namespace headway {
namespace {

using testing::GreedyTokens;
using testing::kWorkloadDecodeSteps;
using testing::kWorkloadPrompts;
using testing::PlaceholderDecodeTokens;
using testing::RunWorkload;
using testing::StepLogits;
using testing::WorkloadBlocks;

constexpr int kBlockSize = 4;      // small, so sequences span several blocks
constexpr int kMaxBlocks = 16;     // per slot: 64 positions
// Runs the fixed workload on one rank. `decode_tokens[step][seq]` are the
// tokens fed at decode step `step` (ignored at step 0, the prefill).
Status RunRank(const std::string& path, int tp_size, int tp_rank, Communicator* comm,
               const std::vector<std::vector<int32_t>>& decode_tokens, StepLogits* out) {
  HW_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  HW_ASSIGN_OR_RETURN(ModelSpec spec, LoadModelSpec(*file));
  HW_RETURN_IF_ERROR(ValidateTpSize(spec, tp_size));
  const TpShard shard = ShardForRank(spec, tp_size, tp_rank);
  HW_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights,
                      ModelWeights::Load(*file, spec, shard));
  HW_ASSIGN_OR_RETURN(std::unique_ptr<DecoderModel> model,
                      DecoderModel::Create(spec, std::move(weights), comm));
  const KvCacheLayout layout{kBlockSize, spec.head_dim};
  HW_ASSIGN_OR_RETURN(
      std::unique_ptr<KvPool> pool,
      KvPool::Create(layout, int64_t(WorkloadBlocks(*model, kMaxBlocks)) * layout.BlockBytes()));
  return RunWorkload(model.get(), pool.get(), kMaxBlocks, decode_tokens, out);
}

// Runs every rank of `tp_size` as a thread; returns rank 0's logits.
StepLogits RunTp(const std::string& path, int tp_size, const std::string& backend,
                 const std::vector<std::vector<int32_t>>& decode_tokens) {
  CommunicatorOptions options;
  options.backend = backend;
  options.timeout = std::chrono::milliseconds(20000);
  options.key_prefix = "tp-test-" + backend + "-" + std::to_string(tp_size);
  return testing::RunRanksAsThreads(
      tp_size, options, [&](int rank, Communicator* comm, StepLogits* out) {
        return RunRank(path, tp_size, rank, comm, decode_tokens, out);
      });
}

struct TpCase {
  std::string name;
  int num_heads;
  int num_kv_heads;
  int intermediate_size;
  int vocab_size;
  int tp_size;
  std::string backend;
  std::string architecture = "llama";  // gemma3: 6 layers, window 8 on five of them
};

class TensorParallelTest : public ::testing::TestWithParam<TpCase> {};

TEST_P(TensorParallelTest, MatchesTp1) {
  const TpCase& c = GetParam();
  testing::TinyLlamaOptions o;
  o.name = "tiny-" + c.name;
  o.num_heads = c.num_heads;
  o.num_kv_heads = c.num_kv_heads;
  o.hidden_size = 32 * c.num_heads;  // head_dim 32: Q4_1 rows stay whole blocks
  o.intermediate_size = c.intermediate_size;
  o.vocab_size = c.vocab_size;
  o.num_layers = 2;
  o.architecture = c.architecture;
  if (c.architecture == "gemma3") {
    o.num_layers = 6;  // layers 0-4 sliding, layer 5 full
    o.sliding_window = 8;
  }
  const std::string dir = testing::MakeTempDir("headway-tp");
  const std::string path = dir + "/model.gguf";
  ASSERT_TRUE(testing::WriteTinyLlama(path, o).ok());

  // TP 1 decides the tokens: prefill, then greedy decode fed back.
  std::vector<std::vector<int32_t>> tokens = PlaceholderDecodeTokens();
  StepLogits tp1 = RunTp(path, 1, c.backend, tokens);
  ASSERT_EQ(tp1.size(), size_t(kWorkloadDecodeSteps + 1));
  tokens = GreedyTokens(tp1, c.vocab_size);
  tokens.pop_back();  // the last step's choice is never fed
  tp1 = RunTp(path, 1, c.backend, tokens);

  StepLogits tp = RunTp(path, c.tp_size, c.backend, tokens);
  ASSERT_EQ(tp.size(), tp1.size());
  double max_diff = 0.0;
  for (size_t step = 0; step < tp1.size(); ++step) {
    ASSERT_EQ(tp[step].size(), tp1[step].size()) << "step " << step;
    for (size_t i = 0; i < tp1[step].size(); ++i) {
      max_diff = std::max(max_diff, double(std::fabs(tp[step][i] - tp1[step][i])));
    }
  }
  EXPECT_LT(max_diff, 1e-4) << "TP " << c.tp_size << " vs TP 1, all steps";
  EXPECT_EQ(GreedyTokens(tp, c.vocab_size), GreedyTokens(tp1, c.vocab_size));
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, TensorParallelTest,
    ::testing::Values(
        // 1 KV head replicated on 2 and on 4 ranks.
        TpCase{"kv1_tp2", 4, 1, 128, 320, 2, "gloo"},
        TpCase{"kv1_tp4", 4, 1, 128, 320, 4, "gloo"},
        // 2 KV heads split one per rank.
        TpCase{"kv2_tp2", 8, 2, 128, 320, 2, "gloo"},
        // SmolLM2's shape in small: 9 heads, 3 KV heads, TP 3; vocab 322 is
        // padded to 324 (two zero rows on rank 2).
        TpCase{"kv3_tp3", 9, 3, 192, 322, 3, "gloo"},
        TpCase{"kv3_tp3_shm", 9, 3, 192, 322, 3, "shm"},
        TpCase{"kv1_tp4_shm", 4, 1, 128, 320, 4, "shm"},
        // Gemma 3's extra norms, GeGLU, NeoX RoPE and sliding windows, 1 KV
        // head replicated on 2 ranks.
        TpCase{"gemma3_kv1_tp2", 4, 1, 128, 320, 2, "shm", "gemma3"}),
    [](const ::testing::TestParamInfo<TpCase>& info) { return info.param.name; });

// Gemma 3 270M's single KV head replicated on 2 ranks (and its Q4_K / Q6_K
// row-parallel matrices split at super-block boundaries) against TP 1. The
// all-reduce sums partial products in another order than TP 1's single
// product, so logits (magnitude up to ~30) differ in the last bits only.
TEST(TensorParallelRealModelTest, Gemma3AtTp2EqualsTp1) {
  HW_REQUIRE_MODEL(testing::Gemma3Path());
  const std::string path = testing::Gemma3Path();
  std::vector<std::vector<int32_t>> tokens = PlaceholderDecodeTokens();
  StepLogits tp1 = RunTp(path, 1, "shm", tokens);
  ASSERT_EQ(tp1.size(), size_t(kWorkloadDecodeSteps + 1));
  const int vocab = int(tp1[0].size() / kWorkloadPrompts.size());
  tokens = GreedyTokens(tp1, vocab);
  tokens.pop_back();
  tp1 = RunTp(path, 1, "shm", tokens);
  const StepLogits tp2 = RunTp(path, 2, "shm", tokens);
  ASSERT_EQ(tp2.size(), tp1.size());
  double max_diff = 0.0;
  for (size_t step = 0; step < tp1.size(); ++step) {
    ASSERT_EQ(tp2[step].size(), tp1[step].size()) << "step " << step;
    for (size_t i = 0; i < tp1[step].size(); ++i) {
      max_diff = std::max(max_diff, double(std::fabs(tp2[step][i] - tp1[step][i])));
    }
  }
  std::printf("[ measured ] Gemma 3 TP 2 vs TP 1: max |logit diff| %.2e\n", max_diff);
  EXPECT_LT(max_diff, 1e-2);
  EXPECT_EQ(GreedyTokens(tp2, vocab), GreedyTokens(tp1, vocab));
}

// Writes a tiny model with `o` into a fresh directory and opens it.
struct TinyModel {
  std::string dir;
  std::unique_ptr<GgufFile> file;
  ModelSpec spec;
  ~TinyModel() { std::filesystem::remove_all(dir); }
};

void OpenTinyModel(const testing::TinyLlamaOptions& o, TinyModel* m) {
  m->dir = testing::MakeTempDir("headway-tp");
  const std::string path = m->dir + "/model.gguf";
  ASSERT_TRUE(testing::WriteTinyLlama(path, o).ok());
  Result<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  m->file = std::move(*file);
  Result<ModelSpec> spec = LoadModelSpec(*m->file);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  m->spec = *spec;
}

TEST(TensorParallelConfigTest, Tp3OverTwoKvHeadsIsRefused) {
  testing::TinyLlamaOptions o;
  o.name = "tiny-kv2";
  o.num_heads = 6;  // divides by 3: the KV heads are what fail
  o.num_kv_heads = 2;
  o.hidden_size = 192;
  o.intermediate_size = 192;
  TinyModel m;
  ASSERT_NO_FATAL_FAILURE(OpenTinyModel(o, &m));
  Status s = ValidateTpSize(m.spec, 3);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tiny-kv2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("2 KV heads"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("valid TP sizes: 1, 2, 6"), std::string::npos) << s.message();
}

TEST(TensorParallelConfigTest, ModelWithoutCommunicatorIsRefusedAboveTp1) {
  TinyModel tiny;
  ASSERT_NO_FATAL_FAILURE(OpenTinyModel({}, &tiny));
  Result<std::unique_ptr<ModelWeights>> w =
      ModelWeights::Load(*tiny.file, tiny.spec, ShardForRank(tiny.spec, 2, 0));
  ASSERT_TRUE(w.ok());
  Result<std::unique_ptr<DecoderModel>> m = DecoderModel::Create(tiny.spec, std::move(*w), nullptr);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("needs a communicator"), std::string::npos);
}

}  // namespace
}  // namespace headway
