#include "common/head_pattern.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/config.h"
#include "common/gguf.h"
#include "tests/support/test_env.h"

namespace headway {
namespace {

// 3 layers of 2 KV heads, all full.
ModelSpec SmallSpec() {
  ModelSpec spec;
  spec.name = "tiny";
  spec.architecture = "llama";
  spec.num_layers = 3;
  spec.num_kv_heads = 2;
  spec.slot_specs.assign(6, SlotSpec{});
  return spec;
}

void ExpectSlot(const std::vector<SlotSpec>& slots, size_t i, int window, int sink) {
  ASSERT_LT(i, slots.size());
  EXPECT_EQ(slots[i].window, window) << "slot " << i;
  EXPECT_EQ(slots[i].sink, sink) << "slot " << i;
}

// Asserts that `yaml` fails with InvalidArgument mentioning every part.
void ExpectError(const std::string& yaml, std::initializer_list<std::string> parts,
                 const ModelSpec& spec = SmallSpec()) {
  Result<std::vector<SlotSpec>> slots = ParseHeadPattern(yaml, spec);
  ASSERT_FALSE(slots.ok()) << yaml;
  EXPECT_EQ(slots.status().code(), StatusCode::kInvalidArgument) << slots.status().ToString();
  for (const std::string& part : parts) {
    EXPECT_NE(slots.status().message().find(part), std::string::npos)
        << "message `" << slots.status().message() << "` lacks `" << part << "`";
  }
}

TEST(HeadPatternTest, LayersGiveSlotsInModelOrder) {
  Result<std::vector<SlotSpec>> slots = ParseHeadPattern(R"(
streaming: {sink: 64, window: 256}
layers: [sf, fs, ff]
)",
                                                         SmallSpec());
  ASSERT_TRUE(slots.ok()) << slots.status().ToString();
  ASSERT_EQ(slots->size(), 6u);
  ExpectSlot(*slots, 0, 256, 64);  // layer 0 head 0
  ExpectSlot(*slots, 1, 0, 0);
  ExpectSlot(*slots, 2, 0, 0);
  ExpectSlot(*slots, 3, 256, 64);  // layer 1 head 1
  ExpectSlot(*slots, 4, 0, 0);
  ExpectSlot(*slots, 5, 0, 0);
}

TEST(HeadPatternTest, EveryLayerShorthand) {
  Result<std::vector<SlotSpec>> slots = ParseHeadPattern(
      "streaming:\n  sink: 4\n  window: 32\nevery_layer: fs\n", SmallSpec());
  ASSERT_TRUE(slots.ok()) << slots.status().ToString();
  for (int l = 0; l < 3; ++l) {
    ExpectSlot(*slots, size_t(l) * 2, 0, 0);
    ExpectSlot(*slots, size_t(l) * 2 + 1, 32, 4);
  }
}

TEST(HeadPatternTest, SinkDefaultsToZeroAndNeedNotFillABlock) {
  Result<std::vector<SlotSpec>> no_sink =
      ParseHeadPattern("streaming: {window: 8}\nevery_layer: ss\n", SmallSpec());
  ASSERT_TRUE(no_sink.ok()) << no_sink.status().ToString();
  ExpectSlot(*no_sink, 0, 8, 0);
  Result<std::vector<SlotSpec>> odd =
      ParseHeadPattern("streaming: {sink: 5, window: 1}\nevery_layer: ss\n", SmallSpec());
  ASSERT_TRUE(odd.ok()) << odd.status().ToString();
  ExpectSlot(*odd, 5, 1, 5);
}

TEST(HeadPatternTest, AllFullNeedsNoStreamingSection) {
  Result<std::vector<SlotSpec>> slots = ParseHeadPattern("every_layer: ff\n", SmallSpec());
  ASSERT_TRUE(slots.ok()) << slots.status().ToString();
  for (const SlotSpec& slot : *slots) EXPECT_FALSE(slot.IsSliding());
}

TEST(HeadPatternTest, SpacesBetweenLettersAreIgnored) {
  Result<std::vector<SlotSpec>> slots =
      ParseHeadPattern("streaming: {window: 8}\nlayers: [s f, 'f s', ff]\n", SmallSpec());
  ASSERT_TRUE(slots.ok()) << slots.status().ToString();
  ExpectSlot(*slots, 0, 8, 0);
  ExpectSlot(*slots, 3, 8, 0);
}

TEST(HeadPatternTest, FullLetterKeepsTheModelsOwnSlidingLayers) {
  ModelSpec spec = SmallSpec();
  spec.slot_specs[2] = SlotSpec{512, 0};  // layer 1 sliding in the model
  spec.slot_specs[3] = SlotSpec{512, 0};
  Result<std::vector<SlotSpec>> slots =
      ParseHeadPattern("streaming: {sink: 4, window: 64}\nlayers: [sf, ff, fs]\n", spec);
  ASSERT_TRUE(slots.ok()) << slots.status().ToString();
  ExpectSlot(*slots, 0, 64, 4);
  ExpectSlot(*slots, 2, 512, 0);
  ExpectSlot(*slots, 3, 512, 0);
  ExpectSlot(*slots, 5, 64, 4);
  ExpectError("streaming: {sink: 4, window: 64}\nlayers: [ff, fs, ff]\n",
              {"layers[1]", "\"fs\"", "KV head 1 of layer 1", "sliding window of 512",
               "only makes full heads streaming"},
              spec);
}

TEST(HeadPatternTest, EmptyModelSlotSpecsMeanAllFull) {
  ModelSpec spec = SmallSpec();
  spec.slot_specs.clear();
  Result<std::vector<SlotSpec>> slots =
      ParseHeadPattern("streaming: {window: 8}\nevery_layer: sf\n", spec);
  ASSERT_TRUE(slots.ok()) << slots.status().ToString();
  ASSERT_EQ(slots->size(), 6u);
  ExpectSlot(*slots, 4, 8, 0);
  ExpectSlot(*slots, 5, 0, 0);
}

TEST(HeadPatternTest, WrongNumberOfLayersNamesTheModelsCount) {
  ExpectError("streaming: {window: 8}\nlayers: [sf, ff]\n",
              {"`layers`", "a list of 2 entries", "one entry per layer", "model 'tiny'",
               "3 layers"});
  ExpectError("streaming: {window: 8}\nlayers: sf\n", {"`layers`", "\"sf\"", "a list"});
}

TEST(HeadPatternTest, WrongNumberOfHeadsNamesTheModelsCount) {
  ExpectError("streaming: {window: 8}\nlayers: [sf, sff, ff]\n",
              {"`layers[1]`", "\"sff\"", "3 KV heads", "one letter per KV head", "model 'tiny'",
               "2 KV heads per layer"});
  ExpectError("streaming: {window: 8}\nevery_layer: s\n",
              {"`every_layer`", "\"s\"", "2 KV heads per layer"});
}

TEST(HeadPatternTest, UnknownLetter) {
  ExpectError("streaming: {window: 8}\nlayers: [sf, fx, ff]\n",
              {"`layers[1]`", "\"fx\"", "f (full) or s (streaming)", "'x'"});
  ExpectError("streaming: {window: 8}\nevery_layer: SF\n", {"`every_layer`", "'S'"});
  ExpectError("streaming: {window: 8}\nlayers: [sf, [f, s], ff]\n",
              {"`layers[1]`", "(a list)", "a string of one letter per KV head"});
}

TEST(HeadPatternTest, WindowAndSinkRanges) {
  ExpectError("streaming: {sink: 4, window: 0}\nevery_layer: sf\n",
              {"`streaming.window`", "= 0", "an integer in [1, 16777216]"});
  ExpectError("streaming: {sink: 4, window: 2147483647}\nevery_layer: sf\n",
              {"`streaming.window`", "2147483647", "[1, 16777216] (positions)"});
  ExpectError("streaming: {sink: -1, window: 8}\nevery_layer: sf\n",
              {"`streaming.sink`", "= -1", "an integer in [0, 16777216]"});
  ExpectError("streaming: {sink: 4}\nevery_layer: sf\n",
              {"missing key `streaming.window`", "integer >= 1"});
  ExpectError("streaming: {window: 99999999999}\nevery_layer: sf\n",
              {"`streaming.window`", "99999999999", "fits in 32 bits"});
}

TEST(HeadPatternTest, DuplicateKeysAreRefused) {
  ExpectError("streaming: {window: 8}\nevery_layer: sf\nevery_layer: ff\n",
              {"duplicate key `every_layer`", "at line 3", "first at line 2"});
  ExpectError("streaming: {window: 8, window: 16}\nevery_layer: sf\n",
              {"duplicate key `streaming.window`", "at line 1"});
}

TEST(HeadPatternTest, NonIntegerValues) {
  ExpectError("streaming: {sink: 4, window: 1.5}\nevery_layer: sf\n",
              {"`streaming.window`", "\"1.5\"", "an integer"});
  ExpectError("streaming: {sink: lots, window: 8}\nevery_layer: sf\n",
              {"`streaming.sink`", "\"lots\"", "an integer"});
  ExpectError("streaming: {sink: [1], window: 8}\nevery_layer: sf\n",
              {"`streaming.sink`", "(a list)", "an integer"});
  ExpectError("streaming: 256\nevery_layer: sf\n",
              {"`streaming`", "\"256\"", "a mapping such as {sink: 64, window: 256}"});
}

TEST(HeadPatternTest, UnknownKeys) {
  ExpectError("streaming: {window: 8}\nevery_layer: sf\nlayer: [sf, sf, sf]\n",
              {"unknown key `layer`", "at the top level", "streaming, layers, every_layer"});
  ExpectError("streaming: {window: 8, sinks: 4}\nevery_layer: sf\n",
              {"unknown key `streaming.sinks`", "in `streaming`", "sink, window"});
}

TEST(HeadPatternTest, LayersAndEveryLayerExclusiveAndOneRequired) {
  ExpectError("streaming: {window: 8}\nevery_layer: sf\nlayers: [sf, sf, sf]\n",
              {"both `layers` and `every_layer`"});
  ExpectError("streaming: {window: 8}\n", {"missing key `layers`", "`every_layer`"});
  ExpectError("", {"(document)", "(empty)", "a mapping"});
}

TEST(HeadPatternTest, StreamingLetterNeedsStreamingSection) {
  ExpectError("layers: [ff, fs, ff]\n",
              {"`layers[1]`", "KV head 1 of layer 1", "no `streaming` section"});
}

TEST(HeadPatternTest, SyntaxErrorHasLine) {
  ExpectError("streaming: {window: 8\nevery_layer: sf\n", {"YAML syntax error", "line"});
}

TEST(HeadPatternTest, ModelWithoutShapeIsRefused) {
  ExpectError("every_layer: f\n", {"no layers or KV heads"}, ModelSpec{});
}

TEST(HeadPatternTest, LoadHeadPatternNamesTheFile) {
  Result<std::vector<SlotSpec>> missing =
      LoadHeadPattern("/nonexistent/heads.yaml", SmallSpec());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/heads.yaml"), std::string::npos);

  const std::string path = ::testing::TempDir() + "/headway_head_pattern_test.yaml";
  {
    std::ofstream out(path);
    out << "streaming: {window: 0}\nevery_layer: sf\n";
  }
  Result<std::vector<SlotSpec>> bad = LoadHeadPattern(path, SmallSpec());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("head pattern " + path), std::string::npos)
      << bad.status().message();
  EXPECT_NE(bad.status().message().find("streaming.window"), std::string::npos);
  std::remove(path.c_str());
}

TEST(HeadPatternTest, ApplyHeadPattern) {
  ModelSpec spec = SmallSpec();
  Config config;
  ASSERT_TRUE(ApplyHeadPattern(config, spec).ok());  // no pattern: unchanged
  EXPECT_EQ(DescribeSlotSpecs(spec), "all 6 KV heads full");

  const std::string path = ::testing::TempDir() + "/headway_head_pattern_apply.yaml";
  {
    std::ofstream out(path);
    out << "streaming: {sink: 16, window: 64}\nevery_layer: sf\n";
  }
  config.head_pattern_path = path;
  ASSERT_TRUE(ApplyHeadPattern(config, spec).ok());
  ExpectSlot(spec.slot_specs, 0, 64, 16);
  ExpectSlot(spec.slot_specs, 1, 0, 0);
  EXPECT_EQ(DescribeSlotSpecs(spec), "3 of 6 KV heads sliding (sink 16, window 64), 3 full");

  config.head_pattern_path = "/nonexistent/heads.yaml";
  Status status = ApplyHeadPattern(config, spec);
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_NE(status.message().find("model.head_pattern"), std::string::npos);
  EXPECT_NE(status.message().find("/nonexistent/heads.yaml"), std::string::npos);
  std::remove(path.c_str());
}

// The shipped pattern fits the real model: one streaming KV head per layer.
TEST(HeadPatternTest, ShippedSmolLm2PatternFitsTheModel) {
  const std::string model = testing::SmolLm2Path();
  HW_REQUIRE_MODEL(model);
  Result<std::unique_ptr<GgufFile>> file = GgufFile::Open(model);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Result<ModelSpec> spec = LoadModelSpec(**file);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  Result<Config> config =
      LoadConfigFile(testing::SourceDir() + "/deploy/configs/smollm2-streaming.yaml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_TRUE(ApplyHeadPattern(*config, *spec).ok());
  ASSERT_EQ(spec->slot_specs.size(), 90u);
  for (int l = 0; l < spec->num_layers; ++l) {
    int streaming = 0;
    for (int h = 0; h < spec->num_kv_heads; ++h) {
      const SlotSpec& slot = spec->slot_specs[size_t(l) * spec->num_kv_heads + h];
      if (!slot.IsSliding()) continue;
      ++streaming;
      EXPECT_EQ(slot.window, 256);
      EXPECT_EQ(slot.sink, 64);
    }
    EXPECT_EQ(streaming, 1) << "layer " << l;
  }
}

}  // namespace
}  // namespace headway
