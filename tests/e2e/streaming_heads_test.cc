// Streaming KV heads on SmolLM2 (model.head_pattern): one KV head per layer
// attends to a sink and a sliding window only. With recycling on, blocks
// that leave every window go back to the pool; greedy output must be the
// same as with recycling off (the kernels attend only within the window
// either way, so recycling may change memory, never tokens), also when the
// prefix cache serves the prompt a second time and when the same prompt runs
// twice at once; and every block returns at the end.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "tests/support/deployment.h"
#include "tests/support/prometheus_parser.h"
#include "tests/support/test_env.h"

namespace headway::testing {
namespace {

using nlohmann::json;

// About 450 tokens: many windows of 64 positions.
std::string LongPrompt() {
  std::string text = "Here are some notes about the history of the lighthouse. ";
  for (int i = 0; i < 12; ++i) {
    text += "In year " + std::to_string(1850 + i * 7) +
            " the keeper wrote that the lamp burned through the storm, the ships passed the "
            "rocks safely and the fog lifted by morning. ";
  }
  return SmolLm2ChatPrompt(text + "Summarise these notes in one sentence.");
}

// Writes the head pattern of both tests (every layer: KV head 0 streaming,
// sink 20, window 64) into a fresh directory, removed at the end.
class StreamingHeadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HW_REQUIRE_MODEL(SmolLm2Path());
    dir_ = MakeTempDir("headway-streaming");
    pattern_ = dir_ + "/heads.yaml";
    std::ofstream(pattern_) << "streaming: {sink: 20, window: 64}\nevery_layer: sff\n";
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // A deployment of SmolLM2 with the pattern; nullptr (a failure) if it does
  // not start.
  std::unique_ptr<Deployment> Start(bool recycling, int pd_decode_tp) const {
    DeploymentOptions options;
    options.model_path = SmolLm2Path();
    options.head_pattern = pattern_;
    options.enable_recycling = recycling;
    options.pd_decode_tp_size = pd_decode_tp;
    std::string error;
    std::unique_ptr<Deployment> d = Deployment::Start(options, &error);
    EXPECT_NE(d, nullptr) << error;
    return d;
  }

  std::string dir_;
  std::string pattern_;
};

// The greedy text of `prompt`; the reply must be a completion.
std::string Complete(const Deployment& d, const std::string& prompt, int max_tokens) {
  const std::string text =
      CompletionText(d.PostJson("/v1/completions", GreedyCompletionBody(prompt, max_tokens)));
  EXPECT_FALSE(IsErrorText(text)) << text;
  return text;
}

struct ServedRun {
  std::vector<std::string> texts;
  double recycled = 0;
  long free_at_start = 0, free_at_end = 0;
};

ServedRun Serve(const Deployment& d) {
  ServedRun run;
  run.free_at_start = d.FreeBlocks();
  auto complete = [&d](const std::string& prompt) { return Complete(d, prompt, 32); };
  // Alone; again (now a prefix-cache hit, cut to what the windows kept);
  // then twice at once; then a short prompt inside one window.
  run.texts.push_back(complete(LongPrompt()));
  run.texts.push_back(complete(LongPrompt()));
  auto a = std::async(std::launch::async, [&] { return complete(LongPrompt()); });
  auto b = std::async(std::launch::async, [&] { return complete(LongPrompt()); });
  run.texts.push_back(a.get());
  run.texts.push_back(b.get());
  run.texts.push_back(complete(SmolLm2ChatPrompt("What is the capital of France?")));
  Result<PromExposition> m = ParsePrometheusText(d.Get("/metrics").body);
  EXPECT_TRUE(m.ok());
  if (m.ok()) {
    for (const PromSample* s : m->Samples("headway:kv_blocks_recycled_total")) run.recycled += s->value;
  }
  run.free_at_end = d.FreeBlocks();
  return run;
}

TEST_F(StreamingHeadsTest, RecyclingKeepsGreedyOutputAndReturnsBlocks) {
  ServedRun on, off;
  {
    std::unique_ptr<Deployment> d = Start(/*recycling=*/true, /*pd_decode_tp=*/0);
    ASSERT_NE(d, nullptr);
    on = Serve(*d);
  }
  {
    std::unique_ptr<Deployment> d = Start(/*recycling=*/false, /*pd_decode_tp=*/0);
    ASSERT_NE(d, nullptr);
    off = Serve(*d);
  }
  ASSERT_EQ(on.texts.size(), off.texts.size());
  for (size_t i = 0; i < on.texts.size(); ++i) {
    EXPECT_FALSE(on.texts[i].empty()) << "request " << i;
    EXPECT_EQ(on.texts[i], off.texts[i]) << "request " << i;
  }
  // The repeated prompt gives the same text whether it was computed or hit
  // the cache.
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(on.texts[i], on.texts[0]) << "request " << i;
  EXPECT_GT(on.recycled, 0);
  EXPECT_EQ(off.recycled, 0);
  EXPECT_EQ(on.free_at_end, on.free_at_start);
  EXPECT_EQ(off.free_at_end, off.free_at_start);
}

// Disaggregated with streaming heads: the transfer moves only each
// streaming head's sink and window blocks (the rest are -1 on the decode
// side), and greedy output equals a colocated deployment's.
TEST_F(StreamingHeadsTest, DisaggregatedMovesOnlySinkAndWindowBlocks) {
  const std::vector<std::string> prompts = {
      LongPrompt(), SmolLm2ChatPrompt("Name three colours of the rainbow.")};
  // Whole blocks each prompt moves (all but the block of its last position).
  std::vector<int> whole_blocks;
  auto serve = [&](int pd_decode_tp, double* blocks_moved, double* fallbacks) {
    std::unique_ptr<Deployment> d = Start(/*recycling=*/true, pd_decode_tp);
    std::vector<std::string> texts;
    if (d == nullptr) return texts;
    for (const std::string& p : prompts) {
      texts.push_back(Complete(*d, p, 24));
      if (blocks_moved == nullptr) {
        HttpReply t = d->PostJson("/tokenize", {{"model", "smollm2"}, {"prompt", p}});
        EXPECT_EQ(t.status, 200) << t.body;
        if (t.status == 200) whole_blocks.push_back((t.json["count"].get<int>() - 1) / 16);
      }
    }
    Result<PromExposition> m = ParsePrometheusText(d->Get("/metrics").body);
    if (m.ok() && blocks_moved != nullptr) {
      for (const PromSample* s : m->Samples("headway:kv_transfer_blocks_total")) *blocks_moved = s->value;
      for (const PromSample* s : m->Samples("headway:kv_transfer_fallbacks_total")) *fallbacks = s->value;
      if (*fallbacks != 0) ADD_FAILURE() << d->Log();
    }
    return texts;
  };
  const std::vector<std::string> colocated = serve(0, nullptr, nullptr);
  double moved = -1, fallbacks = -1;
  const std::vector<std::string> pd = serve(1, &moved, &fallbacks);
  EXPECT_EQ(pd, colocated);
  EXPECT_EQ(fallbacks, 0);
  // Full heads (2 per layer) move every whole block; each layer's streaming
  // head moves its 2 sink blocks and the blocks the window of the decode
  // side's first position reaches (at most 5 blocks of 16 positions for a
  // window of 64).
  ASSERT_EQ(whole_blocks.size(), prompts.size());
  double most = 0;
  for (int n : whole_blocks) most += 30 * 2 * n + 30 * std::min(n, 2 + 5);
  EXPECT_LE(moved, most);
  EXPECT_LT(moved, 30 * 3 * whole_blocks[0]);  // less than all heads of the long prompt
  EXPECT_GT(moved, 0);
}

}  // namespace
}  // namespace headway::testing
