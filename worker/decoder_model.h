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

#include "common/aligned_vector.h"
#include "common/model_spec.h"
#include "comm/communicator.h"
#include "common/status.h"
#include "kernels/elementwise.h"
#include "kernels/kv_cache.h"
#include "worker/kv_pool.h"
#include "worker/forward_model.h"
#include "worker/linear.h"
#include "worker/model_weights.h"

namespace headway {

// Not thread-safe: a model owns scratch buffers reused across calls.
class DecoderModel final : public ForwardModel {
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

  const ModelSpec& spec() const override { return spec_; }
  const TpShard& shard() const override { return weights_->shard(); }
  const SlotSpec& slot_spec(int slot) const override { return local_specs_[slot]; }

  // ForwardModel::Forward on the CPU: `pool` is in host memory.
  Status Forward(const ForwardBatch& batch, KvPool* pool, std::vector<float>* logits) override;

  // Seconds spent in TP collectives (all-reduces and the logits gather) since
  // construction, wall clock: the waiting for slower ranks included.
  double collective_seconds() const override { return collective_seconds_; }

  // Serving applies every matrix with ApplyLinear (worker/linear.h); tests
  // swap in another LinearFn to compare an arithmetic path with its
  // reference. `fn` must not be null.
  void TEST_set_linear(LinearFn fn) { linear_ = fn; }

 private:
  DecoderModel(const ModelSpec& spec, std::unique_ptr<ModelWeights> weights, Communicator* comm);
  void EnsureScratch(int n_tokens);
  // Sums `data` over the ranks (no-op at TP 1).
  Status AllReduce(float* data, size_t count);
  // Final norm and LM head of the logit rows; gathers to rank 0.
  Status ComputeLogits(const ForwardBatch& batch, std::vector<float>* logits);

  const ModelSpec spec_;
  const ModelArchitecture arch_;
  const std::unique_ptr<ModelWeights> weights_;
  Communicator* const comm_;  // nullptr at TP 1
  double collective_seconds_ = 0.0;
  std::vector<SlotSpec> local_specs_;  // [num_layers * num_local_kv_heads]
  LinearFn linear_ = &ApplyLinear;

  // Scratch, grown to the largest batch seen; [n_tokens, width] row-major.
  int scratch_tokens_ = 0;
  AlignedVector<float> x_;     // hidden state [n, hidden]
  AlignedVector<float> h_;     // normed [n, hidden]
  AlignedVector<float> q_;     // [n, local_heads * head_dim]
  AlignedVector<float> k_;     // [n, local_kv_heads * head_dim]
  AlignedVector<float> v_;     // [n, local_kv_heads * head_dim]
  AlignedVector<float> attn_;  // [n, local_heads * head_dim]
  AlignedVector<float> proj_;  // [n, hidden]
  AlignedVector<float> gate_;  // [n, local_intermediate]
  AlignedVector<float> up_;    // [n, local_intermediate]
  AlignedVector<float> last_;  // [num_logit_rows, hidden]
  AlignedVector<float> local_logits_;     // [num_logit_rows, local vocab rows]
  std::vector<float> gathered_logits_;  // rank 0: [tp_size, num_logit_rows, local vocab rows]
  // RoPE's cos and sin for this pass's positions, one entry per distinct
  // freq base among the layers (Gemma 3: local and global), filled as the
  // layers ask for them; only the first rope_angles_used_ are this pass's.
  std::vector<cpu::RopeAngles> rope_angles_;
  int rope_angles_used_ = 0;
  const cpu::RopeAngles& RopeAnglesFor(const ForwardBatch& batch, int n, float freq_base);
};

}  // namespace headway
