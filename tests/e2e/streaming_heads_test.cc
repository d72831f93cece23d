// Streaming KV heads on SmolLM2 (model.head_pattern): one KV head per layer
// attends to a sink and a sliding window only. With recycling on, blocks
// that leave every window go back to the pool; greedy output must be the
// same as with recycling off (the kernels attend only within the window
// either way, so recycling may change memory, never tokens), also when the
// prefix cache serves the prompt a second time and when the same prompt runs
// twice at once; and every block returns at the end.
#include <gtest/gtest.h>

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

struct ServedRun {
  std::vector<std::string> texts;
  double recycled = 0;
  long free_at_start = 0, free_at_end = 0;
};

ServedRun Serve(const std::string& pattern_path, bool recycling) {
  DeploymentOptions options;
  options.model_path = SmolLm2Path();
  options.head_pattern = pattern_path;
  options.enable_recycling = recycling;
  std::string error;
  std::unique_ptr<Deployment> d = Deployment::Start(options, &error);
  EXPECT_NE(d, nullptr) << error;
  ServedRun run;
  if (d == nullptr) return run;
  run.free_at_start = d->FreeBlocks();
  auto complete = [&d](const std::string& prompt) {
    HttpReply r = d->PostJson("/v1/completions", {{"model", "smollm2"},
                                                  {"prompt", prompt},
                                                  {"max_tokens", 32},
                                                  {"temperature", 0}});
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? r.json["choices"][0]["text"].get<std::string>() : "";
  };
  // Alone; again (now a prefix-cache hit, cut to what the windows kept);
  // then twice at once; then a short prompt inside one window.
  run.texts.push_back(complete(LongPrompt()));
  run.texts.push_back(complete(LongPrompt()));
  auto a = std::async(std::launch::async, [&] { return complete(LongPrompt()); });
  auto b = std::async(std::launch::async, [&] { return complete(LongPrompt()); });
  run.texts.push_back(a.get());
  run.texts.push_back(b.get());
  run.texts.push_back(complete(SmolLm2ChatPrompt("What is the capital of France?")));
  Result<PromExposition> m = ParsePrometheusText(d->Get("/metrics").body);
  EXPECT_TRUE(m.ok());
  if (m.ok()) {
    for (const PromSample* s : m->Samples("headway:kv_blocks_recycled_total")) run.recycled += s->value;
  }
  run.free_at_end = d->FreeBlocks();
  return run;
}

TEST(StreamingHeadsTest, RecyclingKeepsGreedyOutputAndReturnsBlocks) {
  HW_REQUIRE_MODEL(SmolLm2Path());
  const std::string dir = MakeTempDir("headway-streaming");
  const std::string pattern = dir + "/heads.yaml";
  std::ofstream(pattern) << "streaming: {sink: 20, window: 64}\nevery_layer: sff\n";

  const ServedRun on = Serve(pattern, true);
  const ServedRun off = Serve(pattern, false);
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
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace headway::testing
