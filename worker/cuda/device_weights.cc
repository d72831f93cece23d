#include "worker/cuda/device_weights.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/matmul.h"

namespace headway::cuda {
namespace {

Status Copy(DeviceBuffer* out, const void* src, size_t bytes, const char* name) {
  HW_ASSIGN_OR_RETURN(*out, DeviceBuffer::Allocate(bytes));
  HW_RETURN_IF_ERROR(CopyToDevice(out->data(), src, bytes, nullptr));
  return Synchronize(nullptr, name);
}

// Rows per host-side chunk of an upload: about 2^20 values, at least one row.
int ChunkRows(int cols) { return std::max(1, int((size_t(1) << 20) / size_t(std::max(cols, 1)))); }

}  // namespace

Status DeviceWeights::UploadF32(const LinearWeight& host, const char* name, DeviceBuffer* out) {
  const std::string what = std::string("uploading ") + name;
  const size_t total = size_t(host.rows) * size_t(host.cols);
  if (total == 0) return Status::Ok();
  HW_ASSIGN_OR_RETURN(*out, DeviceBuffer::Allocate(total * sizeof(float)));
  const int chunk_rows = ChunkRows(host.cols);
  std::vector<float> staged(size_t(std::min(chunk_rows, host.rows)) * host.cols);
  for (int r0 = 0; r0 < host.rows; r0 += chunk_rows) {
    const int r1 = std::min(host.rows, r0 + chunk_rows);
    host.DequantizeRows(r0, r1, staged.data());
    HW_RETURN_IF_ERROR(CopyToDevice(out->as<float>() + size_t(r0) * host.cols, staged.data(),
                                    size_t(r1 - r0) * host.cols * sizeof(float), nullptr)
                           .WithContext(what));
    HW_RETURN_IF_ERROR(Synchronize(nullptr, name).WithContext(what));
  }
  num_bytes_ += out->bytes();
  return Status::Ok();
}

Status DeviceWeights::UploadVector(const std::vector<float>& host, const char* name,
                                   DeviceBuffer* out) {
  if (host.empty()) return Status::Ok();
  HW_RETURN_IF_ERROR(Copy(out, host.data(), host.size() * sizeof(float), name)
                         .WithContext(std::string("uploading ") + name));
  num_bytes_ += out->bytes();
  return Status::Ok();
}

Status DeviceWeights::UploadLinear(const LinearWeight& host, const char* name, DeviceLinear* out) {
  out->rows = host.rows;
  out->cols = host.cols;
  const std::string what = std::string("uploading ") + name;
  // Dequantised and rounded to bf16 on the host a chunk of rows at a time,
  // so the extra host memory is one chunk, not an f32 copy of the matrix.
  const size_t total = size_t(host.rows) * size_t(host.cols);
  HW_ASSIGN_OR_RETURN(out->bf16, DeviceBuffer::Allocate(total * sizeof(bf16_bits)));
  const int chunk_rows = ChunkRows(host.cols);
  std::vector<float> rows_f32(size_t(std::min(chunk_rows, host.rows)) * host.cols);
  std::vector<bf16_bits> staged(rows_f32.size());
  for (int r0 = 0; r0 < host.rows; r0 += chunk_rows) {
    const int r1 = std::min(host.rows, r0 + chunk_rows);
    const size_t count = size_t(r1 - r0) * host.cols;
    host.DequantizeRows(r0, r1, rows_f32.data());
    for (size_t i = 0; i < count; ++i) staged[i] = FloatToBf16(rows_f32[i]);
    // From pageable memory the copy returns once `staged` is consumed.
    HW_RETURN_IF_ERROR(CopyToDevice(out->bf16.as<bf16_bits>() + size_t(r0) * host.cols,
                                    staged.data(), count * sizeof(bf16_bits), nullptr)
                           .WithContext(what));
    HW_RETURN_IF_ERROR(Synchronize(nullptr, name).WithContext(what));
  }
  HW_RETURN_IF_ERROR(Synchronize(nullptr, name).WithContext(what));
  num_bytes_ += out->bf16.bytes();
  // DequantGemv launches nothing for a row length it cannot split (leaving
  // its output stale), so such a matrix keeps only the bf16 copy.
  const bool k_quant = host.quant_type == GgmlType::kQ4_K || host.quant_type == GgmlType::kQ6_K;
  const bool gemv_shape = host.cols > 0 && host.cols % (k_quant ? 256 : 32) == 0;
  if (host.has_quant() && DequantGemvSupported(host.quant_type) && gemv_shape) {
    out->quant_type = host.quant_type;
    HW_RETURN_IF_ERROR(Copy(&out->quant, host.quant.data(), host.quant.size(), name)
                           .WithContext(what));
    num_bytes_ += out->quant.bytes();
  }
  return Status::Ok();
}

Result<std::unique_ptr<DeviceWeights>> DeviceWeights::Upload(const ModelWeights& host,
                                                             bool f32_embedding) {
  std::unique_ptr<DeviceWeights> w(new DeviceWeights());
  HW_RETURN_IF_ERROR(w->UploadLinear(host.token_embd(), "token_embd", &w->token_embd_));
  if (f32_embedding) {
    HW_RETURN_IF_ERROR(w->UploadF32(host.token_embd(), "token_embd (f32)", &w->token_embd_f32_));
  }
  w->tied_ = &host.lm_head() == &host.token_embd();
  if (!w->tied_) HW_RETURN_IF_ERROR(w->UploadLinear(host.lm_head(), "output", &w->output_));
  HW_RETURN_IF_ERROR(w->UploadVector(host.output_norm(), "output_norm", &w->output_norm_));
  w->layers_.resize(size_t(host.num_layers()));
  for (int l = 0; l < host.num_layers(); ++l) {
    const LayerWeights& h = host.layer(l);
    DeviceLayerWeights& d = w->layers_[l];
    HW_RETURN_IF_ERROR(w->UploadVector(h.attn_norm, "attn_norm", &d.attn_norm));
    HW_RETURN_IF_ERROR(w->UploadVector(h.attn_q_norm, "attn_q_norm", &d.attn_q_norm));
    HW_RETURN_IF_ERROR(w->UploadVector(h.attn_k_norm, "attn_k_norm", &d.attn_k_norm));
    HW_RETURN_IF_ERROR(
        w->UploadVector(h.post_attention_norm, "post_attention_norm", &d.post_attention_norm));
    HW_RETURN_IF_ERROR(w->UploadVector(h.post_ffw_norm, "post_ffw_norm", &d.post_ffw_norm));
    HW_RETURN_IF_ERROR(w->UploadVector(h.ffn_norm, "ffn_norm", &d.ffn_norm));
    HW_RETURN_IF_ERROR(w->UploadLinear(h.wq, "attn_q", &d.wq));
    HW_RETURN_IF_ERROR(w->UploadLinear(h.wk, "attn_k", &d.wk));
    HW_RETURN_IF_ERROR(w->UploadLinear(h.wv, "attn_v", &d.wv));
    HW_RETURN_IF_ERROR(w->UploadLinear(h.wo, "attn_output", &d.wo));
    HW_RETURN_IF_ERROR(w->UploadLinear(h.w_gate, "ffn_gate", &d.w_gate));
    HW_RETURN_IF_ERROR(w->UploadLinear(h.w_up, "ffn_up", &d.w_up));
    HW_RETURN_IF_ERROR(w->UploadLinear(h.w_down, "ffn_down", &d.w_down));
  }
  return w;
}

}  // namespace headway::cuda
