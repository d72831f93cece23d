// What the step executor needs from one TP rank of a model replica,
// whichever device runs it: the CPU forward pass (worker/decoder_model.h)
// and the CUDA one (worker/cuda/cuda_decoder_model.h) implement it, and
// share here what does not depend on the device.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "kernels/elementwise.h"
#include "kernels/kv_cache.h"
#include "kernels/sampling.h"
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
  // Optional, [num_logit_rows]: per logit row, -1 when its sampling needs
  // the logits on the host, or k >= 0 when it is greedy and needs only what
  // cpu::Sample's greedy result holds (the argmax, its log-probability, the
  // k best log-probabilities). A model whose device_picks() is not null may
  // then pick such rows where the logits are and leave them out of
  // `logits`. nullptr: every row needs its logits.
  const int32_t* greedy_picks = nullptr;
};

// What the architecture changes in the forward pass (decoder_model.h draws
// the pass): llama uses the defaults; gemma3 sets every field.
struct ModelArchitecture {
  cpu::RopeStyle rope_style = cpu::RopeStyle::kInterleaved;
  bool qk_norm = false;        // RMSNorm of each Q and K head before RoPE
  bool post_norms = false;     // RMSNorm of attention and MLP outputs
  bool gelu_tanh_mlp = false;  // GeGLU (tanh) instead of SwiGLU
  float embedding_scale = 1.0f;
};

// The architecture of `spec` (llama or gemma3).
ModelArchitecture ArchitectureOf(const ModelSpec& spec);

// Checks that `weights` and `comm` can run `spec` on one rank. Errors:
// Unimplemented for an architecture other than llama and gemma3;
// InvalidArgument if the weights do not belong to `spec`, if `comm` is
// missing at tp_size > 1 or its rank/size differ from the shard's, for an
// odd head_dim, or for slot specs that do not cover every (layer, KV head).
Status ValidateModel(const ModelSpec& spec, const ModelWeights* weights,
                     const Communicator* comm);

// The attention specs of the rank's slots, [num_layers * num_local_kv_heads]
// in slot order (layer * num_local_kv_heads + local KV head).
std::vector<SlotSpec> LocalSlotSpecs(const ModelSpec& spec, const TpShard& shard);

class ForwardModel {
 public:
  virtual ~ForwardModel() = default;

  virtual const ModelSpec& spec() const = 0;
  virtual const TpShard& shard() const = 0;
  int vocab_size() const { return spec().vocab_size; }
  int num_local_kv_heads() const { return shard().num_local_kv_heads(); }
  // Slots on this rank: num_layers * num_local_kv_heads.
  int num_slots() const { return spec().num_layers * num_local_kv_heads(); }
  // Attention spec of local slot `slot` (= layer * num_local_kv_heads + h).
  virtual const SlotSpec& slot_spec(int slot) const = 0;

  // Runs the batch: writes this step's K/V into `pool` and fills, on TP rank
  // 0, logits: [num_logit_rows, vocab_size] f32 in host memory (resized;
  // left empty on other ranks). Every rank of the instance must call Forward
  // with the same batch (its own block tables). Errors: Unavailable from a
  // collective (a peer died or timed out) or from the device; the rank is
  // then broken and the KV written by this step is undefined.
  // REQUIRES: the batch satisfies the ForwardBatch comments (the step
  // executor validates plans before calling); pool->arena() was made for
  // spec()'s head_dim and slot specs (MakeKvArenaLayout); the pool lives
  // where the model runs (host memory for the CPU model, the model's GPU for
  // the CUDA one).
  virtual Status Forward(const ForwardBatch& batch, KvPool* pool, std::vector<float>* logits) = 0;

  // Most logit rows one Forward computes (ForwardBatch::num_logit_rows).
  virtual int max_logit_rows() const { return std::numeric_limits<int>::max(); }

  // Seconds spent in TP collectives since construction, wall clock.
  virtual double collective_seconds() const = 0;

  // After Forward on rank 0: the greedy results of the rows the batch's
  // greedy_picks marked, indexed by logit row, as cpu::Sample would give
  // them; an entry with token_id < 0 was not picked (sample it from the
  // logits, which the model then filled). nullptr (the default): the model
  // picks nothing and fills every row's logits.
  virtual const std::vector<SampleResult>* device_picks() const { return nullptr; }
};

}  // namespace headway
