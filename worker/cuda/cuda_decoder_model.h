// The decoder forward pass (worker/decoder_model.h draws it) on one CUDA
// device, for one TP rank. The KV pool is in the device's memory
// (device_kv_pool.h) with the same block layout as a CPU rank's.
//
// The CPU/GPU split of a step:
//   host:   plan validation, block-table deltas, the dense per-layer tables
//           (step_executor.cc), packing the step's metadata (token ids,
//           positions, row -> sequence, query starts, start positions,
//           logit rows, every layer's table) into one pinned buffer;
//           sampling the non-greedy rows from copied logits (cpu::Sample:
//           one sampler for every device, so a seed gives the same tokens
//           anywhere).
//   device: one copy of that metadata in; embedding, every layer (RMSNorm,
//           Q/K/V GEMMs, RoPE fused with append_kv, paged attention, O
//           GEMM, MLP), the final norm and LM head of the logit rows; at TP
//           1 the greedy rows' picks (argmax, its log-probability, top
//           log-probabilities: cpu::Sample's greedy result), so a step of
//           greedy rows copies back a few bytes per row, not the logits
//           (cpu::Sample of a greedy 49,152-entry row measured 0.41 ms, 1.5
//           ms with 5 top logprobs, on one core of a busy build machine).
//           All on one stream.
//   TP:     NCCL all-reduces on device pointers between the stream's work
//           (the stream is synchronised before each collective, whose
//           communicator waits on its own stream).
// Linear layers: decode-sized products read the stored quantised blocks with
// cuda::DequantGemv (exact weights, f32 activations, as the CPU path) where
// that measured faster than the bf16 GEMM at model creation (per weight
// shape and type, for 1, 2, 4 and kMaxDequantGemvRows rows); the others use
// cuBLAS bf16 GEMMs on the bf16 copy (activations rounded to bf16, f32
// accumulation).
#pragma once

#include <array>
#include <map>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/runtime.h"
#include "worker/cuda/device_weights.h"
#include "worker/forward_model.h"

namespace headway::cuda {

struct CudaModelOptions {
  int device = 0;                  // CUDA device ordinal
  int max_tokens_per_step = 8192;  // step buffers are allocated for this many rows up front
  int max_seqs_per_step = 256;     // logits buffers: one row per sequence of a step
  // With max_seqs_per_step, sizes the step metadata (the dense block tables)
  // up front; longer steps grow it inside Forward.
  int max_model_len = 8192;
  int block_size = 16;             // the KV pool's (common/kv_layout.h)
  // Tests: copy every logit row to the host, also those picked on the
  // device (greedy rows are still picked there).
  bool copy_all_logits = false;
  // Tests: every linear layer through DequantGemv (in chunks of
  // kMaxDequantGemvRows rows) where the stored blocks allow, and the
  // embedding from an f32 table, so the GPU computes with exactly the CPU
  // worker's weights.
  bool exact_matmuls = false;
};

class CudaDecoderModel final : public ForwardModel {
 public:
  // Uploads `weights` to options.device and allocates the step buffers for
  // options.max_tokens_per_step rows (so that the memory left for the KV
  // pool is known when it is sized). `comm` (nccl backend, same device) must
  // outlive the model; nullptr only at tp_size 1. Errors: those of
  // ValidateModel; InvalidArgument for a bad device or a head_dim the
  // attention kernels lack (64, 128, 256); ResourceExhausted when device
  // memory runs out; Unavailable from the runtime or cuBLAS.
  static Result<std::unique_ptr<CudaDecoderModel>> Create(const ModelSpec& spec,
                                                          std::unique_ptr<ModelWeights> weights,
                                                          Communicator* comm,
                                                          const CudaModelOptions& options);
  ~CudaDecoderModel() override;

  const ModelSpec& spec() const override { return spec_; }
  const TpShard& shard() const override { return shard_; }
  const SlotSpec& slot_spec(int slot) const override { return local_specs_[slot]; }
  // ForwardModel::Forward. REQUIRES additionally: pool->device() == the
  // model's device; n_tokens <= max_tokens_per_step (the executor's limit);
  // num_logit_rows <= max_seqs_per_step.
  Status Forward(const ForwardBatch& batch, KvPool* pool, std::vector<float>* logits) override;
  double collective_seconds() const override { return collective_seconds_; }
  int max_logit_rows() const override { return options_.max_seqs_per_step; }
  // At TP 1, greedy rows (ForwardBatch::greedy_picks) are picked on the GPU
  // (cuda::GreedySample, cuda::TopLogprobs) and their logits stay there
  // unless another row needs the host's; at TP > 1 nullptr (the logits are
  // gathered to rank 0's host and sampled there).
  const std::vector<SampleResult>* device_picks() const override {
    return shard_.tp_size == 1 ? &picks_ : nullptr;
  }

  int device() const { return options_.device; }
  // Device bytes of weights and step buffers.
  size_t device_bytes() const;

 private:
  CudaDecoderModel(const ModelSpec& spec, const TpShard& shard, Communicator* comm,
                   const CudaModelOptions& options);
  Status Init(std::unique_ptr<ModelWeights> weights);
  Status Linear(const DeviceLinear& w, const float* x, int m, float* y);
  // Times DequantGemv against the bf16 GEMM for layer 0's weights and the
  // LM head and fills gemv_max_rows_.
  Status CalibrateGemv();
  // Most rows of a product with `w` that go through DequantGemv (0: none).
  int GemvMaxRows(const DeviceLinear& w) const;
  Status AllReduce(float* data, size_t count);
  // Packs and uploads the step's metadata; fills batch_ (device pointers).
  Status UploadBatch(const ForwardBatch& batch);
  Status ComputeLogits(const ForwardBatch& batch, std::vector<float>* logits);
  // Picks the greedy rows of `batch` from `device_logits` ([r, vocab] on the
  // device) into picks_; sets *need_logits when some row must be sampled
  // on the host.
  Status PickGreedyRows(const ForwardBatch& batch, const float* device_logits,
                        bool* need_logits);

  const ModelSpec spec_;
  const TpShard shard_;
  const ModelArchitecture arch_;
  Communicator* const comm_;
  const CudaModelOptions options_;
  std::vector<SlotSpec> local_specs_;
  double collective_seconds_ = 0.0;
  using GemvKey = std::array<int, 3>;  // rows, cols, GgmlType
  std::map<GemvKey, int> gemv_max_rows_;

  Stream stream_ = nullptr;
  std::unique_ptr<Blas> blas_;
  std::unique_ptr<DeviceWeights> weights_;
  DeviceBuffer slot_specs_;  // [num_slots] SlotSpec

  // Step buffers, [max_tokens, width] f32 unless noted.
  DeviceBuffer x_, h_, q_, k_, v_, attn_, proj_, gate_, up_;
  DeviceBuffer attention_workspace_;
  DeviceBuffer local_logits_;     // [max_tokens, local vocab rows]
  DeviceBuffer gathered_logits_;  // rank 0 at TP > 1: [tp_size, max_tokens, local vocab rows]
  DeviceBuffer metadata_;         // int32, grown as needed
  PinnedBuffer metadata_host_;    // int32 staging, grown as needed
  PinnedBuffer logits_host_;      // f32 staging of the logits
  // Greedy picks: token [rows] i32, logprob [rows] f32, top ids [rows, 32]
  // i32, top logprobs [rows, 32] f32, on the device and staged on the host.
  DeviceBuffer picks_device_;
  PinnedBuffer picks_host_;
  std::vector<SampleResult> picks_;  // [num_logit_rows] of the last step
  DeviceBatch batch_;
  std::vector<LayerBlockTable> tables_;  // [num_layers], device block ids
  const int32_t* logit_rows_ = nullptr;  // device, into metadata_
  const int32_t* token_ids_ = nullptr;   // device, into metadata_
};

}  // namespace headway::cuda
