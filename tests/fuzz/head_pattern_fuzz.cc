// The head-pattern loader on arbitrary text, for two models: a llama whose
// slots are all full, and a Gemma 3-like one whose first layer slides.
// What ParseHeadPattern accepts must have one spec per slot, the model's
// own sliding slots unchanged, and sane windows.
#include <cstdint>
#include <string>
#include <vector>

#include "common/head_pattern.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace headway;

ModelSpec Spec(bool first_layer_slides) {
  ModelSpec spec;
  spec.name = "fuzz";
  spec.architecture = first_layer_slides ? "gemma3" : "llama";
  spec.num_layers = 3;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 16;
  spec.hidden_size = 64;
  spec.slot_specs.assign(size_t(spec.num_layers * spec.num_kv_heads), SlotSpec{});
  if (first_layer_slides) {
    for (int h = 0; h < spec.num_kv_heads; ++h) spec.slot_specs[size_t(h)] = SlotSpec{512, 0};
  }
  return spec;
}

void Check(const std::string& text, const ModelSpec& spec) {
  Result<std::vector<SlotSpec>> slots = ParseHeadPattern(text, spec);
  if (!slots.ok()) {
    FUZZ_CHECK(slots.status().code() == StatusCode::kInvalidArgument, slots.status().ToString());
    return;
  }
  FUZZ_CHECK(slots->size() == spec.slot_specs.size(), std::to_string(slots->size()) + " slots");
  for (size_t i = 0; i < slots->size(); ++i) {
    const SlotSpec& s = (*slots)[i];
    FUZZ_CHECK(s.window >= 0 && s.sink >= 0, "slot " + std::to_string(i));
    if (spec.slot_specs[i].IsSliding()) {
      FUZZ_CHECK(s.window == spec.slot_specs[i].window && s.sink == spec.slot_specs[i].sink,
                 "changed the model's own sliding slot " + std::to_string(i));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ModelSpec llama = Spec(false);
  static const ModelSpec gemma = Spec(true);
  const std::string text(reinterpret_cast<const char*>(data), size);
  Check(text, llama);
  Check(text, gemma);
  return 0;
}
