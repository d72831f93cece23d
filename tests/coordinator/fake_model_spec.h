// A small llama-shaped ModelSpec for coordinator tests (no model file).
#pragma once

#include "common/model_spec.h"

namespace headway::testing {

// 2 layers, 9 query heads, 3 KV heads (head_dim 64, hidden 576, MLP 1536):
// SmolLM2's head layout with few layers, so TP 1 and 3 are valid.
inline ModelSpec FakeLlamaSpec(int num_layers = 2) {
  ModelSpec spec;
  spec.name = "fake-llama";
  spec.architecture = "llama";
  spec.num_layers = num_layers;
  spec.hidden_size = 576;
  spec.num_heads = 9;
  spec.num_kv_heads = 3;
  spec.head_dim = 64;
  spec.intermediate_size = 1536;
  spec.vocab_size = 1000;
  spec.context_length = 8192;
  spec.slot_specs.assign(size_t(num_layers) * spec.num_kv_heads, SlotSpec{});
  return spec;
}

}  // namespace headway::testing
