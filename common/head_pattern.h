// Head patterns: per-(layer, KV head) attention specs read from a YAML file,
// so any model can serve some KV heads as streaming heads (attention sink +
// sliding window) and keep the rest full, as in DuoAttention (Xiao et al.,
// "DuoAttention: Efficient Long-Context LLM Inference with Retrieval and
// Streaming Heads", 2024). A streaming slot holds only its sink and window
// blocks (DESIGN.md "Attention spec", "Recycling"), so it saves KV memory on
// long sequences at some cost in quality: which heads can stream is a
// property of the model, found offline; Headway only applies the result.
//
// File format:
//   # One entry per layer, one letter per KV head: f = full, s = streaming.
//   streaming: {sink: 64, window: 256}   # positions, for every `s` head
//   layers: [sff, sff, fsf, ...]         # exactly num_layers strings
// or, for the same letters on every layer:
//   streaming: {sink: 64, window: 256}
//   every_layer: sff                     # exactly num_kv_heads letters
//
// Keys: `layers` or `every_layer` (exactly one); `streaming` (required when a
// letter is `s`) with `window` (integer >= 1) and `sink` (integer >= 0,
// default 0). A `s` slot gets SlotSpec{window, sink}: a query at position p
// sees keys k <= p with k > p - window or k < sink. The sink need not be a
// multiple of the block size. Spaces inside a layer's letters are ignored
// (`sfff ffff` for 8 KV heads). KV heads are the model's global KV heads
// (before TP sharding), so one file serves every TP size.
//
// `f` keeps the model's own spec for the slot (full for llama; Gemma 3's
// sliding layers stay sliding). `s` on a slot the model already makes
// sliding is an error: the two windows cannot be combined into one spec, and
// silently widening a trained window would change the model.
#pragma once

#include <string>
#include <vector>

#include "common/config.h"
#include "common/kv_layout.h"
#include "common/model_spec.h"
#include "common/status.h"

namespace headway {

// Parses a head pattern for `spec`. Returns slot specs in ModelSpec order
// (slot_specs[layer * num_kv_heads + kv_head], num_layers * num_kv_heads
// entries). `spec.slot_specs` is the model's own spec (empty = all full).
// Errors: InvalidArgument naming the key (`layers[3]`, `streaming.window`),
// the value found and what is allowed: wrong number of layers or KV heads
// (with the model's numbers), unknown letter, window < 1, sink < 0,
// non-integer values, unknown keys, missing keys, YAML syntax errors (with
// line and column), `s` on a slot the model already makes sliding.
Result<std::vector<SlotSpec>> ParseHeadPattern(const std::string& yaml_text,
                                               const ModelSpec& spec);

// Reads and parses the file at `path`. NotFound if it cannot be read; parse
// errors are InvalidArgument prefixed with "head pattern <path>".
Result<std::vector<SlotSpec>> LoadHeadPattern(const std::string& path, const ModelSpec& spec);

// Replaces spec.slot_specs with the pattern of `config.head_pattern_path`;
// does nothing when that is empty. Every process that builds a ModelSpec
// from the GGUF (coordinator, workers, launcher checks) calls this right
// after LoadModelSpec so that all agree on the slots. Errors: as
// LoadHeadPattern, prefixed with "model.head_pattern".
Status ApplyHeadPattern(const Config& config, ModelSpec& spec);

// One line for logs, e.g. "30 of 90 KV heads sliding (sink 64, window
// 256), 60 full" or "all 90 KV heads full".
std::string DescribeSlotSpecs(const ModelSpec& spec);

}  // namespace headway
