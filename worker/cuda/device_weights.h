// The weights of one TP shard on a CUDA device, uploaded from the host copy
// (worker/model_weights.h): matrices as bf16 (dequantised and rounded at
// upload, for cuBLAS GEMMs) and, where the file stored them in a block format
// DequantGemv reads, also as those blocks (for decode-sized products that
// then use the exact stored weights); norm weights as f32.
#pragma once

#include <memory>
#include <vector>

#include "common/gguf.h"
#include "common/status.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/runtime.h"
#include "worker/model_weights.h"

namespace headway::cuda {

struct DeviceLinear {
  int rows = 0;  // outputs
  int cols = 0;  // inputs
  DeviceBuffer bf16;                  // [rows, cols] bf16
  GgmlType quant_type = GgmlType::kF32;
  DeviceBuffer quant;                 // stored blocks, row i at i * quant.bytes() / rows; empty = none

  bool has_quant() const { return quant.bytes() > 0; }
  const bf16_bits* bf16_data() const { return bf16.as<const bf16_bits>(); }
  const uint8_t* quant_data() const { return quant.as<const uint8_t>(); }
};

struct DeviceLayerWeights {
  DeviceBuffer attn_norm, attn_q_norm, attn_k_norm, post_attention_norm, post_ffw_norm,
      ffn_norm;  // f32; gemma3-only ones empty for llama
  DeviceLinear wq, wk, wv, wo, w_gate, w_up, w_down;
};

class DeviceWeights {
 public:
  // Copies `host` to the current device (synchronously; the host copy may
  // be dropped afterwards). `f32_embedding` also keeps the embedding table
  // as f32 (the exact dequantised values; tests compare with the CPU
  // worker). Errors: ResourceExhausted when device memory runs out (naming
  // the tensor); Unavailable for a copy error.
  static Result<std::unique_ptr<DeviceWeights>> Upload(const ModelWeights& host,
                                                       bool f32_embedding = false);

  const DeviceLayerWeights& layer(int i) const { return layers_[i]; }
  int num_layers() const { return int(layers_.size()); }
  // [vocab rows of the shard, hidden]; the LM head when embeddings are tied.
  const DeviceLinear& token_embd() const { return token_embd_; }
  const DeviceLinear& lm_head() const { return tied_ ? token_embd_ : output_; }
  const float* output_norm() const { return output_norm_.as<const float>(); }
  // [vocab rows of the shard, hidden] f32, or nullptr unless uploaded with
  // f32_embedding.
  const float* token_embd_f32() const { return token_embd_f32_.as<const float>(); }
  // Device bytes held.
  size_t num_bytes() const { return num_bytes_; }

 private:
  DeviceWeights() = default;
  Status UploadLinear(const LinearWeight& host, const char* name, DeviceLinear* out);
  Status UploadVector(const std::vector<float>& host, const char* name, DeviceBuffer* out);
  // The matrix dequantised to f32, [rows, cols], a chunk of rows at a time.
  Status UploadF32(const LinearWeight& host, const char* name, DeviceBuffer* out);

  std::vector<DeviceLayerWeights> layers_;
  DeviceLinear token_embd_;
  DeviceLinear output_;
  bool tied_ = true;
  DeviceBuffer output_norm_;
  DeviceBuffer token_embd_f32_;
  size_t num_bytes_ = 0;
};

}  // namespace headway::cuda
