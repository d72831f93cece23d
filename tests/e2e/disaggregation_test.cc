// Disaggregated prefill and decode with SmolLM2: prompts computed on a
// prefill instance (TP 1), their KV blocks moved over UCX TCP to a decode
// instance (TP 1, or TP 3 with one KV head per rank) whose prefix cache keeps
// them. Greedy outputs must equal a colocated deployment's, token for token:
// the decode instance reads bits the same kernels wrote, so nothing may
// differ.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/support/deployment.h"
#include "tests/support/prometheus_parser.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using nlohmann::json;

constexpr int kMaxTokens = 24;

// Each prompt alone, then all of them eight times over (72 requests),
// concurrently; every reply must be a completion.
std::vector<std::string> RunAll(const Deployment& d) {
  std::vector<std::string> out = GreedyTexts(
      [&d](const std::string& body) { return d.Post("/v1/completions", body); },
      SmolLm2TransferPrompts(), kMaxTokens, /*rounds=*/8);
  for (const std::string& text : out) EXPECT_FALSE(IsErrorText(text)) << text;
  return out;
}

double Metric(const Deployment& d, const std::string& name) {
  return SumOfSamples(d.Get("/metrics").body, name);
}

std::unique_ptr<Deployment> Start(int pd_decode_tp) {
  DeploymentOptions options;
  options.model_path = SmolLm2Path();
  options.pd_decode_tp_size = pd_decode_tp;
  std::string error;
  std::unique_ptr<Deployment> d = Deployment::Start(options, &error);
  EXPECT_NE(d, nullptr) << error;
  return d;
}

TEST(DisaggregationTest, OutputsEqualColocatedAtDecodeTp1AndTp3) {
  HW_REQUIRE_MODEL(SmolLm2Path());
  std::vector<std::string> colocated;
  {
    std::unique_ptr<Deployment> local = Start(0);
    ASSERT_NE(local, nullptr);
    colocated = RunAll(*local);
  }
  for (int decode_tp : {1, 3}) {
    std::unique_ptr<Deployment> pd = Start(decode_tp);
    ASSERT_NE(pd, nullptr);
    const long free_at_start = pd->FreeBlocks();
    const std::vector<std::string> out = RunAll(*pd);
    ASSERT_EQ(out.size(), colocated.size());
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(out[i], colocated[i]) << "decode TP " << decode_tp << ", request " << i;
    }
    EXPECT_GT(Metric(*pd, "headway:kv_transfer_blocks_total"), 0) << "decode TP " << decode_tp;
    EXPECT_EQ(Metric(*pd, "headway:kv_transfer_fallbacks_total"), 0) << "decode TP " << decode_tp;
    // Every block is back (prefix-cached blocks nobody holds count as free).
    EXPECT_EQ(pd->FreeBlocks(), free_at_start) << "decode TP " << decode_tp;
  }
}

// Every KV cache dtype: the decode instance reads the bytes the prefill
// instance quantized and moved, scales included, so its greedy outputs
// equal a colocated TP 1 deployment's in the same dtype; a moved block is
// the dtype's size (f32's is 2 x 16 x 64 x 4 = 8192 bytes). float16 and
// q8_0 decode at TP 3 (TP against TP 1 too). q4_0 decodes at TP 1: TP 3's
// all-reduce adds partial sums in another order, and a last-bit change of
// a K or V value that lands on a 4-bit rounding boundary moves the value by
// a whole step (1/8 of its group's largest magnitude), enough to flip a
// near-tie later in 2 of these 8 prompts; that is TP's rounding, not the
// transfer.
TEST(DisaggregationTest, EveryKvCacheDtypeEqualsColocatedAndMovesItsOwnBytes) {
  HW_REQUIRE_MODEL(SmolLm2Path());
  struct DtypeCase {
    std::string dtype;
    double block_bytes;
    int decode_tp;
  };
  for (const DtypeCase& c : {DtypeCase{"float16", 4096.0, 3}, DtypeCase{"q8_0", 2176.0, 3},
                             DtypeCase{"q4_0", 1152.0, 1}}) {
    SCOPED_TRACE(c.dtype);
    DeploymentOptions options;
    options.model_path = SmolLm2Path();
    options.kv_cache_dtype = c.dtype;
    std::string error;
    std::vector<std::string> colocated;
    {
      std::unique_ptr<Deployment> local = Deployment::Start(options, &error);
      ASSERT_NE(local, nullptr) << error;
      colocated = RunAll(*local);
    }
    options.pd_decode_tp_size = c.decode_tp;
    std::unique_ptr<Deployment> pd = Deployment::Start(options, &error);
    ASSERT_NE(pd, nullptr) << error;
    const std::vector<std::string> out = RunAll(*pd);
    ASSERT_EQ(out.size(), colocated.size());
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], colocated[i]) << "request " << i;
    const double blocks = Metric(*pd, "headway:kv_transfer_blocks_total");
    EXPECT_GT(blocks, 0);
    EXPECT_EQ(Metric(*pd, "headway:kv_transfer_bytes_total"), blocks * c.block_bytes);
    EXPECT_EQ(Metric(*pd, "headway:kv_transfer_fallbacks_total"), 0);
  }
}

// Gemma 3 with its sliding layers in their own dtype (float16 full layers,
// q8_0 sliding ones): each rank's pool is an arena of chunks lent to two
// block sizes (common/kv_arena.h), and a transfer moves each slot's blocks
// in its own size, as granules of the arena (gcd(16,384, 8,704) = 512
// bytes). Outputs equal a colocated deployment's with the same dtypes. Every
// prompt is shorter than the 512-position window, so all 18 layers move all
// their blocks: per 18 blocks, 3 float16 (16,384 bytes) and 15 q8_0 (8,704).
TEST(DisaggregationTest, SlidingSlotsInTheirOwnDtypeMoveInTheirOwnBlockSize) {
  HW_REQUIRE_MODEL(Gemma3Path());
  DeploymentOptions options;
  options.model_path = Gemma3Path();
  options.kv_cache_dtype = "float16";
  options.kv_cache_dtype_sliding = "q8_0";
  auto run = [](const Deployment& d) {
    std::vector<std::string> out = GreedyTexts(
        [&d](const std::string& body) { return d.Post("/v1/completions", body); },
        SmolLm2TransferPrompts(), kMaxTokens, /*rounds=*/2);
    for (const std::string& text : out) EXPECT_FALSE(IsErrorText(text)) << text;
    return out;
  };
  std::string error;
  std::vector<std::string> colocated;
  {
    std::unique_ptr<Deployment> local = Deployment::Start(options, &error);
    ASSERT_NE(local, nullptr) << error;
    colocated = run(*local);
  }
  options.pd_decode_tp_size = 1;
  std::unique_ptr<Deployment> pd = Deployment::Start(options, &error);
  ASSERT_NE(pd, nullptr) << error;
  const std::vector<std::string> out = run(*pd);
  ASSERT_EQ(out.size(), colocated.size());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], colocated[i]) << "request " << i;
  const double blocks = Metric(*pd, "headway:kv_transfer_blocks_total");
  EXPECT_GT(blocks, 0);
  EXPECT_EQ(std::fmod(blocks, 18.0), 0.0);
  EXPECT_EQ(Metric(*pd, "headway:kv_transfer_bytes_total"),
            blocks / 18 * (3 * 16384.0 + 15 * 8704.0));
  EXPECT_EQ(Metric(*pd, "headway:kv_transfer_fallbacks_total"), 0);
  // Every block is back (cached ones count as free). A rank's total counts
  // each chunk in the block size it is lent to, so compare within /health.
  const json health = pd->Get("/health").json;
  for (const json& inst : health.at("instances")) {
    for (const json& rank : inst.at("ranks")) {
      EXPECT_EQ(rank.at("free_blocks"), rank.at("total_blocks")) << inst.dump();
    }
  }
}

// Three turns of one conversation: each turn's prompt extends the last, so
// the decode instance's prefix cache already holds every whole block of the
// previous prompt (moved to it, or computed by it after the move) and only
// the new whole blocks move: 90 blocks per 16 positions (30 layers x 3 KV
// heads). The first turn's cached_tokens is 0: moved tokens are reported
// as transferred_tokens.
TEST(DisaggregationTest, LaterTurnsMoveOnlyTheirNewBlocks) {
  HW_REQUIRE_MODEL(SmolLm2Path());
  std::unique_ptr<Deployment> pd = Start(1);
  ASSERT_NE(pd, nullptr);
  json prompt = json::array();
  double moved = 0;
  const int kBlocksPerPosition16 = 30 * 3;
  int decode_has = 0;  // whole blocks of the last prompt, cached on the decode side
  for (int turn = 0; turn < 3; ++turn) {
    for (int i = 0; i < 40; ++i) prompt.push_back(200 + (turn * 40 + i) * 13 % 3000);
    HttpReply r = pd->PostJson("/v1/completions", {{"model", "smollm2"},
                                                   {"prompt", prompt},
                                                   {"max_tokens", 4},
                                                   {"temperature", 0}});
    ASSERT_EQ(r.status, 200) << r.body;
    const int full = (int(prompt.size()) - 1) / 16 * 16;
    const double now = Metric(*pd, "headway:kv_transfer_blocks_total");
    EXPECT_EQ(now - moved, (full / 16 - decode_has) * kBlocksPerPosition16)
        << "turn " << turn << " (" << prompt.size() << " prompt tokens)";
    moved = now;
    // Usage tells the positions the decode instance held from those moved
    // for this request.
    const json details = r.json["usage"]["prompt_tokens_details"];
    EXPECT_EQ(details.value("cached_tokens", -1), decode_has * 16) << "turn " << turn;
    EXPECT_EQ(details.value("transferred_tokens", -1), full - decode_has * 16) << "turn " << turn;
    decode_has = int(prompt.size()) / 16;
  }
}

}  // namespace
}  // namespace headway::testing
