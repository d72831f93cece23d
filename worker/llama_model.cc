#include "worker/llama_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "worker/linear.h"

namespace headway {

Result<std::unique_ptr<LlamaModel>> LlamaModel::Create(const ModelSpec& spec,
                                                       std::unique_ptr<ModelWeights> weights) {
  if (spec.architecture != "llama") {
    return Status::Unimplemented("model architecture '" + spec.architecture +
                                 "' is not supported (only llama)");
  }
  if (weights == nullptr || weights->num_layers() != spec.num_layers) {
    return Status::InvalidArgument("weights do not match model spec '" + spec.name + "'");
  }
  if (weights->shard().tp_size > 1) {
    return Status::Unimplemented("tensor parallelism not yet supported (tp_size " +
                                 std::to_string(weights->shard().tp_size) + ")");
  }
  if (spec.head_dim % 2 != 0) {
    return Status::InvalidArgument("head_dim " + std::to_string(spec.head_dim) +
                                   " must be even for RoPE");
  }
  if (spec.slot_specs.size() != size_t(spec.num_layers) * spec.num_kv_heads) {
    return Status::InvalidArgument("model spec '" + spec.name + "' has " +
                                   std::to_string(spec.slot_specs.size()) +
                                   " slot specs, expected num_layers * num_kv_heads");
  }
  return std::unique_ptr<LlamaModel>(new LlamaModel(spec, std::move(weights)));
}

LlamaModel::LlamaModel(const ModelSpec& spec, std::unique_ptr<ModelWeights> weights)
    : spec_(spec), weights_(std::move(weights)) {
  const TpShard& s = weights_->shard();
  for (int l = 0; l < spec_.num_layers; ++l) {
    for (int h = s.kv_head_begin; h < s.kv_head_end; ++h) {
      local_specs_.push_back(spec_.slot_specs[size_t(l) * spec_.num_kv_heads + h]);
    }
  }
}

void LlamaModel::EnsureScratch(int n_tokens) {
  if (n_tokens <= scratch_tokens_) return;
  const TpShard& s = shard();
  const size_t n = size_t(n_tokens);
  const size_t hd = size_t(spec_.head_dim);
  x_.resize(n * spec_.hidden_size);
  h_.resize(n * spec_.hidden_size);
  q_.resize(n * s.num_local_heads() * hd);
  k_.resize(n * s.num_local_kv_heads() * hd);
  v_.resize(n * s.num_local_kv_heads() * hd);
  attn_.resize(n * s.num_local_heads() * hd);
  proj_.resize(n * spec_.hidden_size);
  gate_.resize(n * (s.intermediate_end - s.intermediate_begin));
  up_.resize(n * (s.intermediate_end - s.intermediate_begin));
  scratch_tokens_ = n_tokens;
}

void LlamaModel::Forward(const ForwardBatch& batch, KvPool* pool, std::vector<float>* logits) {
  const TpShard& s = shard();
  const int n = batch.layout.num_tokens();
  const int hidden = spec_.hidden_size;
  const int hd = spec_.head_dim;
  const int n_heads = s.num_local_heads();
  const int n_kv = s.num_local_kv_heads();
  const int inter = s.intermediate_end - s.intermediate_begin;
  const float eps = spec_.rms_norm_eps;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const KvCacheLayout& layout = pool->layout();
  HW_CHECK(layout.head_dim == hd);
  EnsureScratch(n);

  cpu::Embedding(weights_->token_embd().f32.data(), batch.token_ids, n, hidden, x_.data());
  for (int l = 0; l < spec_.num_layers; ++l) {
    const LayerWeights& w = weights_->layer(l);
    const LayerBlockTable& table = batch.tables[l];
    // Attention block.
    cpu::RmsNorm(x_.data(), w.attn_norm.data(), n, hidden, eps, h_.data());
    ApplyLinear(w.wq, h_.data(), n, q_.data(), matmul_path_);
    ApplyLinear(w.wk, h_.data(), n, k_.data(), matmul_path_);
    ApplyLinear(w.wv, h_.data(), n, v_.data(), matmul_path_);
    cpu::Rope(q_.data(), batch.positions, n, n_heads, hd, spec_.rope_freq_base,
              cpu::RopeStyle::kInterleaved);
    cpu::Rope(k_.data(), batch.positions, n, n_kv, hd, spec_.rope_freq_base,
              cpu::RopeStyle::kInterleaved);
    cpu::AppendKv(k_.data(), v_.data(), batch.layout, table, layout, pool->data());
    cpu::PagedAttention(q_.data(), pool->data(), batch.layout, table,
                        &local_specs_[size_t(l) * n_kv], layout, n_heads, scale, attn_.data());
    ApplyLinear(w.wo, attn_.data(), n, proj_.data(), matmul_path_);
    cpu::AddInPlace(x_.data(), proj_.data(), int64_t(n) * hidden);
    // MLP block.
    cpu::RmsNorm(x_.data(), w.ffn_norm.data(), n, hidden, eps, h_.data());
    ApplyLinear(w.w_gate, h_.data(), n, gate_.data(), matmul_path_);
    ApplyLinear(w.w_up, h_.data(), n, up_.data(), matmul_path_);
    cpu::SwiGlu(gate_.data(), up_.data(), int64_t(n) * inter, gate_.data());
    ApplyLinear(w.w_down, gate_.data(), n, proj_.data(), matmul_path_);
    cpu::AddInPlace(x_.data(), proj_.data(), int64_t(n) * hidden);
  }

  // Final norm and LM head only for the rows that need logits.
  const int r = batch.num_logit_rows;
  const int vocab_rows = s.vocab_end - s.vocab_begin;
  logits->resize(size_t(r) * spec_.vocab_size);
  if (r == 0) return;
  last_.resize(size_t(r) * hidden);
  for (int i = 0; i < r; ++i) {
    std::copy_n(x_.data() + size_t(batch.logit_rows[i]) * hidden, hidden,
                last_.data() + size_t(i) * hidden);
  }
  cpu::RmsNorm(last_.data(), weights_->output_norm().data(), r, hidden, eps, last_.data());
  // TP 1 only (Create): the local vocabulary range is the whole vocabulary.
  HW_CHECK(vocab_rows == spec_.vocab_size);
  ApplyLinear(weights_->lm_head(), last_.data(), r, logits->data(), matmul_path_);
}

}  // namespace headway
