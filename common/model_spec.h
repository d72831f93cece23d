// Model architecture facts both processes need, and the TP sharding rule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "common/kv_layout.h"
#include "common/status.h"

namespace headway {

// Hyper-parameters of a decoder-only transformer, from GGUF metadata
// (`general.architecture` = A, then `A.block_count`, `A.embedding_length`,
// `A.attention.head_count`, `A.attention.head_count_kv`,
// `A.feed_forward_length`, `A.rope.freq_base`,
// `A.attention.layer_norm_rms_epsilon`, `A.context_length`; vocabulary size
// from `tokenizer.ggml.tokens`).
struct ModelSpec {
  std::string name;          // general.name
  std::string architecture;  // "llama" or "gemma3"
  int num_layers = 0;
  int hidden_size = 0;
  int num_heads = 0;         // query heads
  int num_kv_heads = 0;
  int head_dim = 0;          // hidden_size / num_heads unless the file says otherwise
  int intermediate_size = 0;
  int vocab_size = 0;
  int context_length = 0;    // positions the model was trained for
  float rope_freq_base = 10000.0f;
  // RoPE base of each layer, [num_layers]; empty = rope_freq_base on every
  // layer. gemma3 turns its sliding-window layers with base 10,000 and its
  // full layers with rope_freq_base (llama.cpp src/llama-model.cpp,
  // LLM_ARCH_GEMMA3: rope_freq_base_train_swa).
  std::vector<float> layer_rope_freq_base;
  float rms_norm_eps = 1e-5f;
  bool tied_embeddings = false;  // no output.weight: LM head = token_embd
  // Attention spec per (layer, KV head) of the whole model:
  // slot_specs[layer * num_kv_heads + kv_head]. All full for llama.
  std::vector<SlotSpec> slot_specs;

  // The RoPE base of `layer` (see layer_rope_freq_base).
  float RopeFreqBase(int layer) const {
    return layer_rope_freq_base.empty() ? rope_freq_base : layer_rope_freq_base[layer];
  }
};

// Reads the spec from an opened GGUF. Errors name the file and key:
// NotFound (missing key), Unimplemented (architecture not supported),
// InvalidArgument (inconsistent values, e.g. heads not dividing hidden size).
Result<ModelSpec> LoadModelSpec(const GgufFile& file);

// Which KV heads a TP rank holds (DESIGN.md "TP sharding rule").
struct TpShard {
  int tp_size = 1;
  int tp_rank = 0;
  int kv_head_begin = 0;    // global KV heads [kv_head_begin, kv_head_end)
  int kv_head_end = 0;
  int q_head_begin = 0;     // global query heads [q_head_begin, q_head_end)
  int q_head_end = 0;
  int intermediate_begin = 0;  // MLP rows [begin, end)
  int intermediate_end = 0;
  int padded_vocab_size = 0;   // vocab rounded up to a multiple of tp_size
  // Rows [vocab_begin, vocab_end) of the padded vocabulary for the
  // vocab-parallel embedding / LM head. Rows >= vocab_size are padding: the
  // loader zeroes them and sampling masks them.
  int vocab_begin = 0;
  int vocab_end = 0;
  int num_local_kv_heads() const { return kv_head_end - kv_head_begin; }
  int num_local_heads() const { return q_head_end - q_head_begin; }
};

// OK if `tp_size` is valid for `spec`; otherwise InvalidArgument whose message
// names the model, the field, its value, the TP size and the TP sizes that
// would work (ValidTpSizes up to 64).
Status ValidateTpSize(const ModelSpec& spec, int tp_size);

// Every valid TP size in [1, max_tp_size], ascending.
std::vector<int> ValidTpSizes(const ModelSpec& spec, int max_tp_size);

// The shard of rank `tp_rank`. REQUIRES: ValidateTpSize(spec, tp_size).ok(),
// 0 <= tp_rank < tp_size.
TpShard ShardForRank(const ModelSpec& spec, int tp_size, int tp_rank);

// The lowest rank whose shard holds global KV head `kv_head` (the inverse of
// ShardForRank's rule; with replication, tp_size / num_kv_heads consecutive
// ranks hold it and this is the first). REQUIRES: ValidateTpSize(spec,
// tp_size).ok(), 0 <= kv_head < spec.num_kv_heads.
int FirstRankHoldingKvHead(const ModelSpec& spec, int tp_size, int kv_head);

}  // namespace headway
