#include "worker/decoder_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "worker/linear.h"

namespace headway {

Result<std::unique_ptr<DecoderModel>> DecoderModel::Create(const ModelSpec& spec,
                                                           std::unique_ptr<ModelWeights> weights,
                                                           Communicator* comm) {
  HW_RETURN_IF_ERROR(ValidateModel(spec, weights.get(), comm));
  if (spec.head_dim % 8 != 0) {  // cpu::PagedAttention works on 8-float lanes
    return Status::Unimplemented("head_dim " + std::to_string(spec.head_dim) +
                                 " is not a multiple of 8, which the CPU attention kernel needs");
  }
  return std::unique_ptr<DecoderModel>(new DecoderModel(spec, std::move(weights), comm));
}

DecoderModel::DecoderModel(const ModelSpec& spec, std::unique_ptr<ModelWeights> weights,
                           Communicator* comm)
    : spec_(spec), arch_(ArchitectureOf(spec)), weights_(std::move(weights)), comm_(comm) {
  local_specs_ = LocalSlotSpecs(spec_, weights_->shard());
}

void DecoderModel::EnsureScratch(int n_tokens) {
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

Status DecoderModel::AllReduce(float* data, size_t count) {
  if (comm_ == nullptr || comm_->size() == 1) return Status::Ok();
  const auto t0 = std::chrono::steady_clock::now();
  Status s = comm_->AllReduceSum(data, count);
  collective_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

const cpu::RopeAngles& DecoderModel::RopeAnglesFor(const ForwardBatch& batch, int n,
                                                   float freq_base) {
  for (int i = 0; i < rope_angles_used_; ++i) {
    if (rope_angles_[size_t(i)].freq_base == freq_base) return rope_angles_[size_t(i)];
  }
  if (size_t(rope_angles_used_) == rope_angles_.size()) rope_angles_.emplace_back();
  cpu::RopeAngles& angles = rope_angles_[size_t(rope_angles_used_++)];
  cpu::ComputeRopeAngles(batch.positions, n, spec_.head_dim, freq_base, &angles);
  return angles;
}

Status DecoderModel::Forward(const ForwardBatch& batch, KvPool* pool, std::vector<float>* logits) {
  const TpShard& s = shard();
  const int n = batch.layout.num_tokens();
  const int hidden = spec_.hidden_size;
  const int hd = spec_.head_dim;
  const int n_heads = s.num_local_heads();
  const int n_kv = s.num_local_kv_heads();
  const int inter = s.intermediate_end - s.intermediate_begin;
  const float eps = spec_.rms_norm_eps;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const KvArenaLayout& arena = pool->arena();
  HW_CHECK(arena.head_dim == hd);
  EnsureScratch(n);
  rope_angles_used_ = 0;

  const size_t hidden_floats = size_t(n) * hidden;
  EmbeddingLookup(weights_->token_embd(), s.vocab_begin, batch.token_ids, n, x_.data());
  HW_RETURN_IF_ERROR(AllReduce(x_.data(), hidden_floats).WithContext("embedding all-reduce"));
  if (arch_.embedding_scale != 1.0f) {
    cpu::ScaleInPlace(x_.data(), arch_.embedding_scale, int64_t(hidden_floats));
  }
  for (int l = 0; l < spec_.num_layers; ++l) {
    const LayerWeights& w = weights_->layer(l);
    const LayerBlockTable& table = batch.tables[l];
    // Attention block.
    cpu::RmsNorm(x_.data(), w.attn_norm.data(), n, hidden, eps, h_.data());
    linear_(w.wq, h_.data(), n, q_.data());
    linear_(w.wk, h_.data(), n, k_.data());
    linear_(w.wv, h_.data(), n, v_.data());
    if (arch_.qk_norm) {
      cpu::RmsNorm(q_.data(), w.attn_q_norm.data(), n * n_heads, hd, eps, q_.data());
      cpu::RmsNorm(k_.data(), w.attn_k_norm.data(), n * n_kv, hd, eps, k_.data());
    }
    const cpu::RopeAngles& angles = RopeAnglesFor(batch, n, spec_.RopeFreqBase(l));
    cpu::Rope(q_.data(), angles, n_heads, arch_.rope_style);
    cpu::Rope(k_.data(), angles, n_kv, arch_.rope_style);
    // Each layer's blocks are of its slots' dtype (common/kv_arena.h): the
    // kernels take one layout for all of a layer's KV heads.
    const SlotSpec* layer_specs = &local_specs_[size_t(l) * n_kv];
    const KvCacheLayout layout = arena.SlotLayout(layer_specs[0]);
    for (int h = 1; h < n_kv; ++h) HW_CHECK(arena.SlotLayout(layer_specs[h]).dtype == layout.dtype);
    cpu::AppendKv(k_.data(), v_.data(), batch.layout, table, layout, pool->data());
    cpu::PagedAttention(q_.data(), pool->data(), batch.layout, table, layer_specs, layout,
                        n_heads, scale, attn_.data());
    linear_(w.wo, attn_.data(), n, proj_.data());
    HW_RETURN_IF_ERROR(AllReduce(proj_.data(), hidden_floats).WithContext("attention all-reduce"));
    if (arch_.post_norms) {
      cpu::RmsNorm(proj_.data(), w.post_attention_norm.data(), n, hidden, eps, proj_.data());
    }
    cpu::AddInPlace(x_.data(), proj_.data(), int64_t(n) * hidden);
    // MLP block.
    cpu::RmsNorm(x_.data(), w.ffn_norm.data(), n, hidden, eps, h_.data());
    linear_(w.w_gate, h_.data(), n, gate_.data());
    linear_(w.w_up, h_.data(), n, up_.data());
    if (arch_.gelu_tanh_mlp) {
      cpu::GeluTanhGated(gate_.data(), up_.data(), int64_t(n) * inter, gate_.data());
    } else {
      cpu::SwiGlu(gate_.data(), up_.data(), int64_t(n) * inter, gate_.data());
    }
    linear_(w.w_down, gate_.data(), n, proj_.data());
    HW_RETURN_IF_ERROR(AllReduce(proj_.data(), hidden_floats).WithContext("MLP all-reduce"));
    if (arch_.post_norms) {
      cpu::RmsNorm(proj_.data(), w.post_ffw_norm.data(), n, hidden, eps, proj_.data());
    }
    cpu::AddInPlace(x_.data(), proj_.data(), int64_t(n) * hidden);
  }
  return ComputeLogits(batch, logits);
}

Status DecoderModel::ComputeLogits(const ForwardBatch& batch, std::vector<float>* logits) {
  const TpShard& s = shard();
  const int hidden = spec_.hidden_size;

  // Final norm and LM head only for the rows that need logits.
  const int r = batch.num_logit_rows;
  const int vocab_rows = s.vocab_end - s.vocab_begin;
  logits->resize(s.tp_rank == 0 ? size_t(r) * spec_.vocab_size : 0);
  if (r == 0) return Status::Ok();
  last_.resize(size_t(r) * hidden);
  for (int i = 0; i < r; ++i) {
    std::copy_n(x_.data() + size_t(batch.logit_rows[i]) * hidden, hidden,
                last_.data() + size_t(i) * hidden);
  }
  cpu::RmsNorm(last_.data(), weights_->output_norm().data(), r, hidden, spec_.rms_norm_eps,
               last_.data());
  if (s.tp_size == 1) {
    HW_CHECK(vocab_rows == spec_.vocab_size);
    linear_(weights_->lm_head(), last_.data(), r, logits->data());
    return Status::Ok();
  }
  local_logits_.resize(size_t(r) * vocab_rows);
  linear_(weights_->lm_head(), last_.data(), r, local_logits_.data());
  if (s.tp_rank == 0) gathered_logits_.resize(size_t(s.tp_size) * r * vocab_rows);
  const auto t0 = std::chrono::steady_clock::now();
  Status gathered = comm_->Gather(local_logits_.data(), local_logits_.size(),
                                  s.tp_rank == 0 ? gathered_logits_.data() : nullptr, 0);
  collective_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  HW_RETURN_IF_ERROR(gathered.WithContext("logits gather"));
  if (s.tp_rank != 0) return Status::Ok();
  // gathered: [rank, row, local vocab] -> logits: [row, vocab], padding dropped.
  for (int rank = 0; rank < s.tp_size; ++rank) {
    const int begin = rank * vocab_rows;
    const int count = std::min(vocab_rows, spec_.vocab_size - begin);
    if (count <= 0) continue;
    for (int i = 0; i < r; ++i) {
      std::copy_n(gathered_logits_.data() + (size_t(rank) * r + i) * vocab_rows, count,
                  logits->data() + size_t(i) * spec_.vocab_size + begin);
    }
  }
  return Status::Ok();
}

}  // namespace headway
