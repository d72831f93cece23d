// The weights of one TP shard of a llama- or gemma3-architecture model in host
// memory: matrices as the file's quantised blocks where the kernels read them,
// else dequantised to f32 at load time (worker/linear.h); norm weights as f32.
//
// GGUF tensor names (llama.cpp `LLM_ARCH_LLAMA`): token_embd.weight,
// output_norm.weight, optional output.weight (absent = tied to token_embd),
// and per layer N: blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
// ffn_norm, ffn_gate, ffn_up, ffn_down}.weight; gemma3 (LLM_ARCH_GEMMA3) adds
// blk.N.{attn_q_norm, attn_k_norm, post_attention_norm, post_ffw_norm}.weight,
// its norm weights already stored as 1 + w by the converter. A GGUF matrix with
// ne = {n_in, n_out} is a row-major [n_out, n_in] matrix (rows = outputs), the
// layout cpu::MatmulTransB takes.
//
// Sharding (DESIGN.md "TP sharding rule", common/model_spec.h TpShard): a rank
// keeps the Q rows of its query heads, the K/V rows of its KV heads, the
// attn_output columns of its query heads, the gate/up rows and down columns of
// its MLP range, and the embedding / LM-head rows of its vocabulary range
// (rows past the real vocabulary are zero). Norm weights are replicated.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/gguf.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "worker/linear.h"

namespace headway {

struct LayerWeights {
  std::vector<float> attn_norm;  // [hidden]
  // gemma3 only (empty for llama): RMSNorm of each Q and K head before RoPE,
  // and of the attention and MLP outputs before their residual adds.
  std::vector<float> attn_q_norm;          // [head_dim]
  std::vector<float> attn_k_norm;          // [head_dim]
  std::vector<float> post_attention_norm;  // [hidden]
  std::vector<float> post_ffw_norm;        // [hidden]
  LinearWeight wq;               // [n_local_heads * head_dim, hidden]
  LinearWeight wk;               // [n_local_kv_heads * head_dim, hidden]
  LinearWeight wv;               // [n_local_kv_heads * head_dim, hidden]
  LinearWeight wo;               // [hidden, n_local_heads * head_dim]
  std::vector<float> ffn_norm;   // [hidden]
  LinearWeight w_gate;           // [n_local_intermediate, hidden]
  LinearWeight w_up;             // [n_local_intermediate, hidden]
  LinearWeight w_down;           // [hidden, n_local_intermediate]
};

class ModelWeights {
 public:
  // Reads the tensors of `shard` from `file` (dequantising what is kept as
  // f32), whose spec is `spec` (LoadModelSpec of the same file). `file` is
  // only read during the call. Errors: NotFound naming a missing tensor; InvalidArgument naming a
  // tensor whose shape differs from what the spec implies (both shapes in the
  // message); Unimplemented for a tensor type that cannot be dequantised.
  static Result<std::unique_ptr<ModelWeights>> Load(const GgufFile& file, const ModelSpec& spec,
                                                    const TpShard& shard);

  // Weights of `shard` drawn uniformly from [-scale, scale] (norm weights 1),
  // held as f32, reproducible from `seed`: a small model for tests that need
  // no file.
  static std::unique_ptr<ModelWeights> TEST_Random(const ModelSpec& spec, const TpShard& shard,
                                                   uint64_t seed, float scale);

  ModelWeights(const ModelWeights&) = delete;
  ModelWeights& operator=(const ModelWeights&) = delete;

  const TpShard& shard() const { return shard_; }
  const LayerWeights& layer(int i) const { return layers_[i]; }
  int num_layers() const { return static_cast<int>(layers_.size()); }

  // [vocab_end - vocab_begin, hidden]: rows of this rank's vocabulary range.
  const LinearWeight& token_embd() const { return token_embd_; }
  const std::vector<float>& output_norm() const { return output_norm_; }  // [hidden]
  // LM head rows of this rank's vocabulary range, [vocab_end - vocab_begin,
  // hidden]: output.weight, or token_embd when the embeddings are tied.
  const LinearWeight& lm_head() const { return tied_ ? token_embd_ : output_; }

  // Bytes of weights held.
  size_t num_bytes() const;

 private:
  ModelWeights() = default;

  TpShard shard_;
  bool tied_ = true;
  LinearWeight token_embd_;
  LinearWeight output_;  // empty when tied
  std::vector<float> output_norm_;
  std::vector<LayerWeights> layers_;
};

}  // namespace headway
