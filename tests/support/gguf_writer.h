// Writes small GGUF files (v3) for tests: metadata of every common kind and
// tensors from f32 values, stored as F32, F16, Q8_0 or Q4_1 so that loaders
// see the real block layouts; plus a random tiny llama model of any shape.
//
// File layout (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md):
//   "GGUF" | u32 version=3 | u64 n_tensors | u64 n_kv |
//   n_kv x (gguf_string key | u32 value type | value) |
//   n_tensors x (gguf_string name | u32 n_dims | u64 dims[n_dims] | u32 type |
//                u64 offset into the data section) |
//   zero padding to the alignment | tensor data, each padded to the alignment.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "common/status.h"

namespace headway::testing {

// Builds a GGUF file in memory. Entries are written in the order added.
// Not thread-safe. Adding a key or tensor name twice writes it twice (which a
// reader must reject), so tests can build corrupt files too.
class GgufWriter {
 public:
  // Metadata. Integers and floats are written with the width in the name.
  void AddString(const std::string& key, const std::string& value);
  void AddUInt32(const std::string& key, uint32_t value);
  void AddInt32(const std::string& key, int32_t value);
  void AddUInt64(const std::string& key, uint64_t value);
  void AddFloat32(const std::string& key, float value);
  void AddBool(const std::string& key, bool value);
  void AddStringArray(const std::string& key, const std::vector<std::string>& values);
  void AddInt32Array(const std::string& key, const std::vector<int32_t>& values);
  void AddFloat32Array(const std::string& key, const std::vector<float>& values);

  // Sets the data alignment and writes `general.alignment` (u32).
  // REQUIRES: a power of two.
  void SetAlignment(uint32_t alignment);

  // Adds tensor `name` of shape `dims` (ggml order: dims[0] is the row length)
  // holding `values` (product of dims long), stored as `type`: F32, F16, Q8_0
  // or Q4_1, quantised with ggml's reference quantisers
  // (ggml-quants.c quantize_row_q8_0_ref / quantize_row_q4_1_ref).
  // InvalidArgument if the value count does not match the shape, or the row
  // length is not a multiple of the type's block; Unimplemented for other types.
  Status AddTensor(const std::string& name, const std::vector<uint64_t>& dims, GgmlType type,
                   const std::vector<float>& values);

  // Adds a tensor with the given type number and bytes, unchecked.
  void AddRawTensor(const std::string& name, const std::vector<uint64_t>& dims,
                    uint32_t type_value, std::vector<uint8_t> bytes);

  // The whole file.
  std::vector<uint8_t> Serialize() const;

  // Writes Serialize() to `path`. Internal on an I/O failure.
  Status WriteFile(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type = 0;
    std::vector<uint8_t> bytes;
  };

  void AddKey(const std::string& key, uint32_t value_type);

  uint64_t alignment_ = 32;
  uint64_t num_kv_ = 0;
  std::vector<uint8_t> kv_bytes_;  // encoded metadata entries, in order
  std::vector<Tensor> tensors_;
};

// f32 to IEEE half, round to nearest even (as ggml's GGML_FP32_TO_FP16).
uint16_t FloatToHalf(float value);

// Bytes of `values` quantised as Q8_0 / Q4_1. REQUIRES: size multiple of 32.
std::vector<uint8_t> QuantizeQ8_0(const std::vector<float>& values);
std::vector<uint8_t> QuantizeQ4_1(const std::vector<float>& values);

// Shape and contents of a random llama model for tests.
struct TinyLlamaOptions {
  std::string name = "tiny-llama";
  // "llama", or "gemma3": then also per-layer attn_q_norm / attn_k_norm
  // [head_dim] and post_attention_norm / post_ffw_norm [hidden], and
  // gemma3.attention.sliding_window (every sixth layer full, as Gemma 3).
  std::string architecture = "llama";
  int sliding_window = 0;      // gemma3 only; must be > 0 there
  int num_layers = 2;
  int hidden_size = 64;
  int num_heads = 4;
  int num_kv_heads = 2;
  int head_dim = 0;            // 0: hidden_size / num_heads
  int intermediate_size = 128;
  int vocab_size = 320;        // >= 259 gives the byte-level vocabulary below
  int context_length = 2048;
  float rope_freq_base = 10000.0f;
  float rms_norm_eps = 1e-5f;
  bool tied_embeddings = true;  // false: also write output.weight
  GgmlType embedding_type = GgmlType::kQ8_0;  // token_embd (and output)
  GgmlType matrix_type = GgmlType::kQ4_1;     // attention and MLP matrices
  uint64_t seed = 1;
  float weight_scale = 0.1f;   // matrices uniform in [-scale, scale)
};

// Writes a llama GGUF laid out like SmolLM2's (or, with architecture
// "gemma3", the same plus Gemma 3's extra norms and sliding window): tensors `token_embd.weight`
// [hidden, vocab], `output_norm.weight` [hidden] (F32), per layer `blk.N.`
// `attn_norm`, `ffn_norm` [hidden] (F32, near 1), `attn_q` [hidden, heads*hd],
// `attn_k`, `attn_v` [hidden, kv_heads*hd], `attn_output` [heads*hd, hidden],
// `ffn_gate`, `ffn_up` [hidden, ffn], `ffn_down` [ffn, hidden]; `llama.*`
// hyper-parameters; a gpt2-style tokenizer whose tokens are
// 0 "<|endoftext|>", 1 "<|im_start|>", 2 "<|im_end|>", then the 256 bytes in
// GPT-2's byte-to-unicode spelling, then "tok<N>"; no merges. Values come from
// a fixed generator seeded by `seed`, the same on every platform.
// Errors: InvalidArgument for a shape the chosen types cannot hold (row
// lengths must be multiples of 32 for Q8_0/Q4_1), Internal on I/O failure.
Status WriteTinyLlama(const std::string& path, const TinyLlamaOptions& options);

// Rewrites, in place, the value of the u32 metadata entry `key` of the GGUF
// file at `path`: a mutated copy whose metadata disagrees with its tensors.
// Errors: NotFound when the key is absent, InvalidArgument when its value is
// not a u32, Internal on an I/O failure.
Status SetUInt32Key(const std::string& path, const std::string& key, uint32_t value);

}  // namespace headway::testing
