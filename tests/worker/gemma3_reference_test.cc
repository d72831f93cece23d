// The forward pass on the real Gemma 3 270M (base, Q4_K_M) against llama.cpp
// and a numpy f32 forward pass of the same weights.
//
// Reference data: tests/data/reference/gemma3_greedy.json, made by
// tests/data/reference/make_gemma3_reference.py (llama-cpp-python 0.3.36,
// n_threads=2; its numpy pass is written from llama.cpp's
// llm_build_gemma3_iswa). One of its prompts is 832 tokens long, so the
// 512-position window of the sliding layers shapes its logits.
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/worker/real_model_fixture.h"

namespace headway {
namespace {

using testing::ExpectTop10;
using testing::Ids;
using testing::MatmulPath;
using testing::MaxDiff;
using testing::ReadJson;

constexpr int64_t kPoolBytes = int64_t(256) << 20;

// Largest |ours - numpy f32| over the reference's top 50 logits of a prompt's
// last position (logits of magnitude 10 to 30). Measured at most 2e-5 on
// both f32-activation paths; the bound leaves 50x room for summation order
// and thread count, and still catches a wrong norm, RoPE base or window.
constexpr float kF32Tolerance = 1e-3f;
// llama.cpp quantises activations to 8 bits for its matrix products and keeps
// an f16 KV cache; the serving path (f32 activations) differs from it by at
// most 0.64 (the code prompt; 0.23 to 0.39 for the others).
constexpr float kLlamaCppTolerance = 1.0f;
// llama.cpp's greedy token is required only where its top-2 margin is at
// least this (near-ties may flip under the differences above).
constexpr float kTieMargin = 1.0f;
constexpr int kHorizon = 16;
// float32 full layers and q8_0 sliding ones against the numpy f32 pass:
// largest |diff| over a prompt's top 50 logits. Measured 0.07 to 0.20 (q8_0
// on every layer: 0.05 to 0.25; float32: 2e-5); 2.5x room for thread count
// and summation order.
constexpr float kSlidingQ8Tolerance = 0.5f;

class Gemma3Test : public testing::RealModelFixture {
 protected:
  void SetUp() override {
    HW_REQUIRE_MODEL(testing::Gemma3Path());
    ASSERT_NO_FATAL_FAILURE(StartExecutorOnModel(testing::Gemma3Path(), kPoolBytes));
  }
};

TEST_F(Gemma3Test, SpecFromMetadata) {
  const ModelSpec& spec = model_->spec();
  EXPECT_EQ(spec.architecture, "gemma3");
  EXPECT_EQ(spec.num_layers, 18);
  EXPECT_EQ(spec.head_dim, 256);
  EXPECT_EQ(spec.num_kv_heads, 1);
  for (int l = 0; l < spec.num_layers; ++l) {
    const bool full = l % 6 == 5;
    EXPECT_EQ(spec.slot_specs[l].window, full ? 0 : 512) << "layer " << l;
    EXPECT_EQ(spec.RopeFreqBase(l), full ? 1e6f : 1e4f) << "layer " << l;
  }
}

TEST_F(Gemma3Test, MatchesNumpyF32Reference) {
  const nlohmann::json ref = ReadJson("reference/gemma3_greedy.json");
  ASSERT_TRUE(ref.contains("cases"));
  for (MatmulPath path : {MatmulPath::kF32, MatmulPath::kQuantisedF32Act}) {
    SetMatmulPath(path);
    const std::vector<std::vector<float>> logits = LastPromptLogits(ref);
    ASSERT_EQ(logits.size(), ref["cases"].size());
    for (size_t i = 0; i < logits.size(); ++i) {
      const nlohmann::json& c = ref["cases"][i];
      SCOPED_TRACE(c["name"].get<std::string>());
      const float diff = MaxDiff(logits[i], c["f32_last_top_ids"], c["f32_last_top_logits"], 50);
      EXPECT_LE(diff, kF32Tolerance);
      ExpectTop10(logits[i], c["f32_last_top_ids"], c["f32_last_top_logits"], 2 * kF32Tolerance);
      std::printf(
          "[ measured ] %s (%zu tokens): path %d, max |logit diff| "
          "over the top 50 vs "
          "numpy f32: %.6f\n",
          c["name"].get<std::string>().c_str(), c["prompt_ids"].size(), int(path), diff);
    }
  }
  SetMatmulPath(MatmulPath::kQuantisedF32Act);
}

TEST_F(Gemma3Test, CloseToLlamaCpp) {
  const nlohmann::json ref = ReadJson("reference/gemma3_greedy.json");
  ASSERT_TRUE(ref.contains("cases"));
  const std::vector<std::vector<float>> logits = LastPromptLogits(ref);
  ASSERT_EQ(logits.size(), ref["cases"].size());
  for (size_t i = 0; i < logits.size(); ++i) {
    const nlohmann::json& c = ref["cases"][i];
    SCOPED_TRACE(c["name"].get<std::string>());
    const float diff = MaxDiff(logits[i], c["last_top_ids"], c["last_top_logits"], 50);
    EXPECT_LE(diff, kLlamaCppTolerance);
    std::printf(
        "[ measured ] %s: serving path, max |logit diff| over the top 50 vs "
        "llama.cpp: %.4f\n",
        c["name"].get<std::string>().c_str(), diff);
  }
}

// Teacher-forced through the decode path: Headway's greedy choice at each
// step is llama.cpp's wherever llama.cpp is not near a tie.
TEST_F(Gemma3Test, GreedyTokensMatchLlamaCpp) {
  const nlohmann::json ref = ReadJson("reference/gemma3_greedy.json");
  const std::vector<GreedyAgreement> cases = TeacherForcedGreedy(ref, kHorizon, kTieMargin);
  // Not vacuous: at least half of the steps are compared (54 of 80 now).
  EXPECT_GE(TotalCompared(cases), int(ref["cases"].size()) * kHorizon / 2);
}

// Prefill in chunks that cross the 512-position window, batched with another
// sequence, gives the same greedy tokens as one whole prefill.
TEST_F(Gemma3Test, GreedyTokensIndependentOfChunking) {
  const nlohmann::json ref = ReadJson("reference/gemma3_greedy.json");
  const nlohmann::json& cases = ref["cases"];
  const std::vector<int32_t> long_prompt = Ids(cases[cases.size() - 1]["prompt_ids"]);
  const std::vector<int32_t> other = Ids(cases[1]["prompt_ids"]);
  ASSERT_GT(long_prompt.size(), 600u);
  constexpr int kTokens = 6;
  const std::vector<int32_t> alone = Generate({long_prompt}, kTokens, 1 << 20)[0];
  EXPECT_EQ(Generate({long_prompt, other}, kTokens, 200)[0], alone) << "chunks of 200, batched";
}

// cache.kv_cache_dtype_sliding: float32 full layers (every sixth) and q8_0
// sliding ones share one arena of 557,056-byte chunks (17 float32 or 64 q8_0
// blocks; common/kv_arena.h), each layer's kernels reading its own dtype.
// There is no other implementation of per-layer dtypes to compare with, so
// the run is pinned from three sides: (1) it is bit for bit the same
// wherever the chunks lie (lent bottom-up or top-down, the two classes'
// chunks interleaved), which a wrong block address would break; (2) it
// differs from both one-dtype runs, float32 and q8_0, so each layer really
// reads its own dtype; (3) it stays close to the numpy f32 reference, and
// its greedy tokens are llama.cpp's wherever llama.cpp is not near a tie,
// as GreedyTokensMatchLlamaCpp requires of float32.
TEST_F(Gemma3Test, SlidingLayersInQ8_0) {
  const nlohmann::json ref = ReadJson("reference/gemma3_greedy.json");
  const nlohmann::json& cases = ref["cases"];
  ForwardModel* const model = model_;
  const ModelSpec& spec = model->spec();
  const std::vector<std::vector<float>> f32 = LastPromptLogits(ref);
  auto run = [&](KvCacheDtypes dtypes, bool from_top) {
    const KvArenaLayout arena = MakeKvArenaLayout(kBlockSize, spec.head_dim, dtypes, spec.slot_specs);
    EXPECT_EQ(arena.mixed(), dtypes.full != dtypes.sliding);
    StartExecutorOnArena(model, arena, kPoolBytes, from_top);
    return LastPromptLogits(ref);
  };
  const KvCacheDtypes mixed_dtypes{KvCacheDtype::kFloat32, KvCacheDtype::kQ8_0};
  const std::vector<std::vector<float>> mixed = run(mixed_dtypes, false);
  const std::vector<std::vector<float>> q8 = run({KvCacheDtype::kQ8_0, KvCacheDtype::kQ8_0}, false);
  const std::vector<std::vector<float>> mixed_top = run(mixed_dtypes, true);
  ASSERT_EQ(mixed.size(), cases.size());
  ASSERT_EQ(q8.size(), cases.size());
  ASSERT_EQ(mixed_top.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const nlohmann::json& c = cases[i];
    SCOPED_TRACE(c["name"].get<std::string>());
    EXPECT_TRUE(mixed[i] == mixed_top[i]) << "the logits depend on where the chunks lie";
    EXPECT_FALSE(mixed[i] == f32[i]) << "the sliding layers did not store q8_0";
    EXPECT_FALSE(mixed[i] == q8[i]) << "the full layers did not store float32";
    const float mixed_diff =
        MaxDiff(mixed[i], c["f32_last_top_ids"], c["f32_last_top_logits"], 50);
    const float q8_diff = MaxDiff(q8[i], c["f32_last_top_ids"], c["f32_last_top_logits"], 50);
    EXPECT_LE(mixed_diff, kSlidingQ8Tolerance);
    std::printf("[ measured ] %s (%zu tokens): max |logit diff| over the top 50 vs numpy f32: "
                "float32 + q8_0 sliding %.4f, q8_0 everywhere %.4f\n",
                c["name"].get<std::string>().c_str(), c["prompt_ids"].size(), mixed_diff, q8_diff);
  }
  StartExecutorOnArena(
      model, MakeKvArenaLayout(kBlockSize, spec.head_dim, mixed_dtypes, spec.slot_specs),
      kPoolBytes, false);
  const std::vector<GreedyAgreement> greedy = TeacherForcedGreedy(ref, kHorizon, kTieMargin);
  EXPECT_GE(TotalCompared(greedy), int(cases.size()) * kHorizon / 2);
}

}  // namespace
}  // namespace headway
