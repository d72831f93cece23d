// The decoder-only transformer forward pass over head-wise KV blocks, for one
// TP rank: the llama and gemma3 architectures.
//
// One call runs a batch that mixes prefill chunks and decode tokens
// (kernels/kv_cache.h BatchLayout):
//   x = embedding(tokens)                        // [n, hidden]; gemma3: * sqrt(hidden)
//   per layer:
//     h = rmsnorm(x) ; q, k, v = h Wq^T, h Wk^T, h Wv^T
//     gemma3: q, k = rmsnorm per head (attn_q_norm, attn_k_norm)
//     rope(q), rope(k)   llama: interleaved pairs (the GGUF converter permutes
//                        the Q/K rows of llama weights; LLAMA_ROPE_TYPE_NORM);
//                        gemma3: NeoX halves, base per layer (ModelSpec::RopeFreqBase)
//     append_kv(k, v) ; a = paged_attention(q) / sqrt(head_dim) ; o = a Wo^T
//     gemma3: o = rmsnorm(o) (post_attention_norm)
//     x += o
//     h = rmsnorm(x) ; m = (act(h Wgate^T) * h Wup^T) Wdown^T
//                        act = silu (llama) or gelu-tanh (gemma3)
//     gemma3: m = rmsnorm(m) (post_ffw_norm)
//     x += m
//   logits = rmsnorm(x[rows]) Wlm^T only for the requested rows.
// With TP (Megatron-LM, Shoeybi et al. 2019): Wq/Wk/Wv and Wgate/Wup are
// column-parallel (this rank's heads / MLP rows), Wo and Wdown row-parallel,
// so `a Wo^T` and the MLP output are partial sums, completed by one
// all-reduce each (before gemma3's post-norms, which need the whole sum); the
// embedding and LM head are vocab-parallel (an all-reduce after the lookup;
// the logits gathered to rank 0, which samples).
// References: llama.cpp src/llama-model.cpp (llm_build_llama,
// llm_build_gemma3_iswa), Hugging Face transformers LlamaModel and
// Gemma3TextModel.
#pragma once

#include <memory>
#include <vector>

#include "common/model_spec.h"
#include "comm/communicator.h"
#include "common/status.h"
#include "kernels/elementwise.h"
#include "kernels/kv_cache.h"
#include "worker/kv_pool.h"
#include "worker/model_weights.h"

namespace headway {

// Inputs of one forward pass. All pointers are host memory owned by the
// caller and only read during Forward.
struct ForwardBatch {
  const int32_t* token_ids = nullptr;  // [n_tokens], each in [0, vocab_size)
  const int32_t* positions = nullptr;  // [n_tokens], consistent with `layout`
  BatchLayout layout;                  // sequences and their rows
  // Per layer, the batch's dense head-wise block table of this rank's KV heads
  // ([num_layers] entries, num_kv_heads = num_local_kv_heads). Every position
  // written or visible to a row must have a block id in [0, num_blocks).
  const LayerBlockTable* tables = nullptr;
  // Rows (token indices in [0, n_tokens)) whose logits are wanted, in order.
  const int32_t* logit_rows = nullptr;
  int num_logit_rows = 0;
};

// Not thread-safe: a model owns scratch buffers reused across calls.
class DecoderModel {
 public:
  // Takes the rank's weights. `comm` joins the ranks of the instance: it
  // must outlive the model; nullptr is allowed only at tp_size 1. Errors:
  // Unimplemented for an architecture other than llama and gemma3; InvalidArgument if
  // the weights do not belong to `spec`, or if `comm` is missing or its
  // rank/size differ from the shard's.
  static Result<std::unique_ptr<DecoderModel>> Create(const ModelSpec& spec,
                                                    std::unique_ptr<ModelWeights> weights,
                                                    Communicator* comm = nullptr);

  DecoderModel(const DecoderModel&) = delete;
  DecoderModel& operator=(const DecoderModel&) = delete;

  const ModelSpec& spec() const { return spec_; }
  const TpShard& shard() const { return weights_->shard(); }
  int vocab_size() const { return spec_.vocab_size; }
  int num_local_kv_heads() const { return shard().num_local_kv_heads(); }
  // Slots on this rank: num_layers * num_local_kv_heads.
  int num_slots() const { return spec_.num_layers * num_local_kv_heads(); }
  // Attention spec of local slot `slot` (= layer * num_local_kv_heads + h).
  const SlotSpec& slot_spec(int slot) const { return local_specs_[slot]; }

  // Runs the batch: writes this step's K/V into `pool` and fills, on TP rank
  // 0, logits: [num_logit_rows, vocab_size] f32 (resized; left empty on other
  // ranks). Every rank of the instance must call Forward with the same batch
  // (its own block tables). Errors: Unavailable from a collective (a peer
  // died or timed out); the communicator is then broken and the KV written by
  // this step is undefined.
  // REQUIRES: the batch satisfies the ForwardBatch comments (the step
  // executor validates plans before calling); pool->layout().head_dim ==
  // spec().head_dim.
  Status Forward(const ForwardBatch& batch, KvPool* pool, std::vector<float>* logits);

  // Seconds spent in TP collectives (all-reduces and the logits gather) since
  // construction, wall clock: the waiting for slower ranks included.
  double collective_seconds() const { return collective_seconds_; }

  // Serving uses MatmulPath::kQuantisedF32Act (worker/linear.h); tests
  // switch paths to compare each with its reference.
  void TEST_set_matmul_path(MatmulPath path) { matmul_path_ = path; }

 private:
  DecoderModel(const ModelSpec& spec, std::unique_ptr<ModelWeights> weights, Communicator* comm);
  void EnsureScratch(int n_tokens);
  // Sums `data` over the ranks (no-op at TP 1).
  Status AllReduce(float* data, size_t count);
  // Final norm and LM head of the logit rows; gathers to rank 0.
  Status ComputeLogits(const ForwardBatch& batch, std::vector<float>* logits);

  // What the architecture changes in the forward pass (see the top of the file).
  struct Architecture {
    cpu::RopeStyle rope_style = cpu::RopeStyle::kInterleaved;
    bool qk_norm = false;       // RMSNorm of each Q and K head before RoPE
    bool post_norms = false;    // RMSNorm of attention and MLP outputs
    bool gelu_tanh_mlp = false; // GeGLU (tanh) instead of SwiGLU
    float embedding_scale = 1.0f;
  };
  static Architecture ArchitectureOf(const ModelSpec& spec);

  const ModelSpec spec_;
  const Architecture arch_;
  const std::unique_ptr<ModelWeights> weights_;
  Communicator* const comm_;  // nullptr at TP 1
  double collective_seconds_ = 0.0;
  std::vector<SlotSpec> local_specs_;  // [num_layers * num_local_kv_heads]
  MatmulPath matmul_path_ = MatmulPath::kQuantisedF32Act;

  // Scratch, grown to the largest batch seen; [n_tokens, width] row-major.
  int scratch_tokens_ = 0;
  std::vector<float> x_;     // hidden state [n, hidden]
  std::vector<float> h_;     // normed [n, hidden]
  std::vector<float> q_;     // [n, local_heads * head_dim]
  std::vector<float> k_;     // [n, local_kv_heads * head_dim]
  std::vector<float> v_;     // [n, local_kv_heads * head_dim]
  std::vector<float> attn_;  // [n, local_heads * head_dim]
  std::vector<float> proj_;  // [n, hidden]
  std::vector<float> gate_;  // [n, local_intermediate]
  std::vector<float> up_;    // [n, local_intermediate]
  std::vector<float> last_;  // [num_logit_rows, hidden]
  std::vector<float> local_logits_;     // [num_logit_rows, local vocab rows]
  std::vector<float> gathered_logits_;  // rank 0: [tp_size, num_logit_rows, local vocab rows]
};

}  // namespace headway
