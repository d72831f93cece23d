#include "common/head_pattern.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cstdint>
#include <limits>
#include <map>
#include <utility>

#include "common/yaml_fields.h"

namespace headway {
namespace {

using yaml::BadValue;
using yaml::CheckKeys;
using yaml::Describe;
using yaml::ReadInt;

constexpr char kFull = 'f';
constexpr char kStreaming = 's';

std::string Quote(const std::string& text) { return "\"" + text + "\""; }

std::string ModelName(const ModelSpec& spec) {
  return "model '" + (spec.name.empty() ? spec.architecture : spec.name) + "'";
}

struct Streaming {
  bool present = false;
  SlotSpec spec;
};

constexpr int64_t kMaxPositions = int64_t(1) << 24;

Result<Streaming> ParseStreaming(const YAML::Node& node) {
  Streaming out;
  if (!node) return out;
  if (!node.IsMap()) {
    return BadValue("streaming", Describe(node), "a mapping such as {sink: 64, window: 256}");
  }
  HW_RETURN_IF_ERROR(CheckKeys(node, "streaming", {"sink", "window"}));
  if (!node["window"]) {
    return Status::InvalidArgument(
        "missing key `streaming.window`: must be the number of recent positions a streaming "
        "head sees (an integer >= 1)");
  }
  HW_RETURN_IF_ERROR(ReadInt(node["window"], "streaming.window", out.spec.window));
  // Positions fit in 24 bits (scheduler.max_model_len's bound): a bigger
  // window would only overflow the window arithmetic of the kernels.
  HW_RETURN_IF_ERROR(
      yaml::CheckRange("streaming.window", out.spec.window, 1, kMaxPositions, "(positions)"));
  if (node["sink"]) {
    HW_RETURN_IF_ERROR(ReadInt(node["sink"], "streaming.sink", out.spec.sink));
    HW_RETURN_IF_ERROR(yaml::CheckRange("streaming.sink", out.spec.sink, 0, kMaxPositions,
                                        "(positions; 0 = no attention sink)"));
  }
  out.present = true;
  return out;
}

// One layer's letters, spaces dropped. `key` names the entry in messages.
Result<std::string> ReadLetters(const YAML::Node& node, const std::string& key,
                                const ModelSpec& spec) {
  if (!node.IsScalar()) {
    return BadValue(key, Describe(node),
                    "a string of one letter per KV head (f = full, s = streaming)");
  }
  std::string letters;
  for (char c : node.Scalar()) {
    if (c == ' ') continue;
    if (c != kFull && c != kStreaming) {
      return BadValue(key, Quote(node.Scalar()),
                      "letters f (full) or s (streaming) only; found '" + std::string(1, c) + "'");
    }
    letters.push_back(c);
  }
  if (int(letters.size()) != spec.num_kv_heads) {
    return BadValue(key, Quote(node.Scalar()) + " (" + std::to_string(letters.size()) +
                             " KV heads)",
                    "one letter per KV head: " + ModelName(spec) + " has " +
                        std::to_string(spec.num_kv_heads) + " KV heads per layer");
  }
  return letters;
}

Status ParseDocument(const YAML::Node& root, const ModelSpec& spec,
                     std::vector<SlotSpec>& slots) {
  if (!root.IsMap()) {
    return BadValue("(document)", Describe(root),
                    "a mapping with `layers` or `every_layer`, and `streaming`");
  }
  HW_RETURN_IF_ERROR(CheckKeys(root, "", {"streaming", "layers", "every_layer"}));
  HW_ASSIGN_OR_RETURN(Streaming streaming, ParseStreaming(root["streaming"]));

  const YAML::Node layers = root["layers"];
  const YAML::Node every_layer = root["every_layer"];
  if (layers && every_layer) {
    return Status::InvalidArgument(
        "both `layers` and `every_layer` are set: use `layers` (one entry per layer) or "
        "`every_layer` (the same letters on every layer), not both");
  }
  if (!layers && !every_layer) {
    return Status::InvalidArgument(
        "missing key `layers` (one string per layer, one letter per KV head: f = full, "
        "s = streaming) or `every_layer` (the same letters on every layer)");
  }

  // letters_of[layer] and the key it came from, for messages.
  std::vector<std::pair<std::string, std::string>> letters_of;
  if (every_layer) {
    HW_ASSIGN_OR_RETURN(std::string letters, ReadLetters(every_layer, "every_layer", spec));
    letters_of.assign(size_t(spec.num_layers), {letters, "every_layer"});
  } else {
    if (!layers.IsSequence()) {
      return BadValue("layers", Describe(layers),
                      "a list of one string per layer, e.g. [sff, fsf]");
    }
    if (int(layers.size()) != spec.num_layers) {
      return BadValue("layers", "a list of " + std::to_string(layers.size()) + " entries",
                      "one entry per layer: " + ModelName(spec) + " has " +
                          std::to_string(spec.num_layers) + " layers");
    }
    for (size_t l = 0; l < layers.size(); ++l) {
      const std::string key = "layers[" + std::to_string(l) + "]";
      HW_ASSIGN_OR_RETURN(std::string letters, ReadLetters(layers[l], key, spec));
      letters_of.emplace_back(std::move(letters), key);
    }
  }

  const size_t num_slots = size_t(spec.num_layers) * spec.num_kv_heads;
  slots = spec.slot_specs.size() == num_slots ? spec.slot_specs
                                              : std::vector<SlotSpec>(num_slots, SlotSpec{});
  for (int l = 0; l < spec.num_layers; ++l) {
    const auto& [letters, key] = letters_of[size_t(l)];
    for (int h = 0; h < spec.num_kv_heads; ++h) {
      if (letters[size_t(h)] != kStreaming) continue;
      if (!streaming.present) {
        return Status::InvalidArgument("`" + key + "` makes KV head " + std::to_string(h) +
                                       " of layer " + std::to_string(l) +
                                       " streaming, but there is no `streaming` section: add "
                                       "e.g. `streaming: {sink: 64, window: 256}`");
      }
      SlotSpec& slot = slots[size_t(l) * spec.num_kv_heads + h];
      if (slot.IsSliding()) {
        return BadValue(key, Quote(letters),
                        "f for KV head " + std::to_string(h) + " of layer " + std::to_string(l) +
                            ": " + ModelName(spec) + " already gives it a sliding window of " +
                            std::to_string(slot.window) +
                            ", and a head pattern only makes full heads streaming");
      }
      slot = streaming.spec;
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<SlotSpec>> ParseHeadPattern(const std::string& yaml_text,
                                               const ModelSpec& spec) {
  if (spec.num_layers <= 0 || spec.num_kv_heads <= 0) {
    return Status::InvalidArgument(ModelName(spec) +
                                   " has no layers or KV heads; load its spec first");
  }
  std::vector<SlotSpec> slots;
  HW_ASSIGN_OR_RETURN(const YAML::Node root, yaml::LoadDocument(yaml_text));
  try {
    HW_RETURN_IF_ERROR(ParseDocument(root, spec, slots));
  } catch (const YAML::Exception& e) {
    return yaml::SyntaxError(e);
  }
  return slots;
}

Result<std::vector<SlotSpec>> LoadHeadPattern(const std::string& path, const ModelSpec& spec) {
  HW_ASSIGN_OR_RETURN(std::string text, yaml::ReadDocumentText(path, "head pattern file"));
  Result<std::vector<SlotSpec>> slots = ParseHeadPattern(text, spec);
  if (!slots.ok()) return slots.status().WithContext("head pattern " + path);
  return slots;
}

Status ApplyHeadPattern(const Config& config, ModelSpec& spec) {
  if (config.head_pattern_path.empty()) return Status::Ok();
  Result<std::vector<SlotSpec>> slots = LoadHeadPattern(config.head_pattern_path, spec);
  if (!slots.ok()) return slots.status().WithContext("model.head_pattern");
  spec.slot_specs = std::move(slots).value();
  return Status::Ok();
}

std::string DescribeSlotSpecs(const ModelSpec& spec) {
  int full = 0;
  std::map<std::pair<int32_t, int32_t>, int> sliding;  // (window, sink) -> slots
  for (const SlotSpec& slot : spec.slot_specs) {
    if (slot.IsSliding()) {
      ++sliding[{slot.window, slot.sink}];
    } else {
      ++full;
    }
  }
  const std::string total = std::to_string(spec.slot_specs.size());
  if (sliding.empty()) return "all " + total + " KV heads full";
  std::string out;
  for (const auto& [key, count] : sliding) {
    out += (out.empty() ? "" : ", ") + std::to_string(count) + " of " + total +
           " KV heads sliding (sink " + std::to_string(key.second) + ", window " +
           std::to_string(key.first) + ")";
  }
  return out + ", " + std::to_string(full) + " full";
}

}  // namespace headway
