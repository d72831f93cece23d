#include "worker/model_weights.h"

#include <algorithm>
#include <random>
#include <string>

#include "worker/dequant.h"

namespace headway {
namespace {

std::string DimsString(const std::vector<uint64_t>& dims) {
  std::string s = "{";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "}";
}

// Finds `name` and checks its ggml dims are exactly `expected`.
Result<const GgufTensorInfo*> FindChecked(const GgufFile& file, const std::string& name,
                                          const std::vector<uint64_t>& expected) {
  const GgufTensorInfo* info = file.FindTensor(name);
  if (info == nullptr) {
    return Status::NotFound("tensor " + name + " is missing from " + file.path());
  }
  if (info->dims != expected) {
    return Status::InvalidArgument("tensor " + name + " in " + file.path() + " has shape " +
                                   DimsString(info->dims) + ", the model spec needs " +
                                   DimsString(expected));
  }
  return info;
}

// Rows [row_begin, row_end) of the matrix `name` (ne = {n_in, n_out}) as f32
// [row_end - row_begin, n_in]; rows at or past n_out (vocabulary padding)
// are zero.
Result<std::vector<float>> LoadRows(const GgufFile& file, const std::string& name, int n_in,
                                    int n_out, int row_begin, int row_end) {
  HW_ASSIGN_OR_RETURN(const GgufTensorInfo* info,
                      FindChecked(file, name, {uint64_t(n_in), uint64_t(n_out)}));
  HW_ASSIGN_OR_RETURN(uint64_t row_bytes, GgmlBytes(info->type, uint64_t(n_in)));
  std::vector<float> out(size_t(row_end - row_begin) * n_in, 0.0f);
  const int real_end = std::min(row_end, n_out);
  if (real_end > row_begin) {
    const uint8_t* src = file.TensorData(*info) + uint64_t(row_begin) * row_bytes;
    Status s = Dequantize(info->type, src, out.data(), uint64_t(real_end - row_begin) * n_in);
    if (!s.ok()) return s.WithContext("tensor " + name);
  }
  return out;
}

// Columns [col_begin, col_end) of the matrix `name` (ne = {n_in, n_out}) as
// f32 [n_out, col_end - col_begin].
Result<std::vector<float>> LoadColumns(const GgufFile& file, const std::string& name, int n_in,
                                       int n_out, int col_begin, int col_end) {
  HW_ASSIGN_OR_RETURN(std::vector<float> full, LoadRows(file, name, n_in, n_out, 0, n_out));
  if (col_begin == 0 && col_end == n_in) return full;
  const int n_cols = col_end - col_begin;
  std::vector<float> out(size_t(n_out) * n_cols);
  for (int r = 0; r < n_out; ++r) {
    std::copy_n(full.data() + size_t(r) * n_in + col_begin, n_cols,
                out.data() + size_t(r) * n_cols);
  }
  return out;
}

// A 1-D tensor of `n` values (norm weights), replicated on every rank.
Result<std::vector<float>> LoadVector(const GgufFile& file, const std::string& name, int n) {
  HW_ASSIGN_OR_RETURN(const GgufTensorInfo* info, FindChecked(file, name, {uint64_t(n)}));
  std::vector<float> out(n);
  Status s = Dequantize(info->type, file.TensorData(*info), out.data(), uint64_t(n));
  if (!s.ok()) return s.WithContext("tensor " + name);
  return out;
}

Status LoadLayer(const GgufFile& file, const ModelSpec& spec, const TpShard& shard, int layer,
                 LayerWeights& w) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  const int hidden = spec.hidden_size;
  const int hd = spec.head_dim;
  const int q_rows = spec.num_heads * hd;
  const int kv_rows = spec.num_kv_heads * hd;
  const int inter = spec.intermediate_size;
  HW_ASSIGN_OR_RETURN(w.attn_norm, LoadVector(file, p + "attn_norm.weight", hidden));
  HW_ASSIGN_OR_RETURN(w.wq, LoadRows(file, p + "attn_q.weight", hidden, q_rows,
                                     shard.q_head_begin * hd, shard.q_head_end * hd));
  HW_ASSIGN_OR_RETURN(w.wk, LoadRows(file, p + "attn_k.weight", hidden, kv_rows,
                                     shard.kv_head_begin * hd, shard.kv_head_end * hd));
  HW_ASSIGN_OR_RETURN(w.wv, LoadRows(file, p + "attn_v.weight", hidden, kv_rows,
                                     shard.kv_head_begin * hd, shard.kv_head_end * hd));
  HW_ASSIGN_OR_RETURN(w.wo, LoadColumns(file, p + "attn_output.weight", q_rows, hidden,
                                        shard.q_head_begin * hd, shard.q_head_end * hd));
  HW_ASSIGN_OR_RETURN(w.ffn_norm, LoadVector(file, p + "ffn_norm.weight", hidden));
  HW_ASSIGN_OR_RETURN(w.w_gate, LoadRows(file, p + "ffn_gate.weight", hidden, inter,
                                         shard.intermediate_begin, shard.intermediate_end));
  HW_ASSIGN_OR_RETURN(w.w_up, LoadRows(file, p + "ffn_up.weight", hidden, inter,
                                       shard.intermediate_begin, shard.intermediate_end));
  HW_ASSIGN_OR_RETURN(w.w_down, LoadColumns(file, p + "ffn_down.weight", inter, hidden,
                                            shard.intermediate_begin, shard.intermediate_end));
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<ModelWeights>> ModelWeights::Load(const GgufFile& file,
                                                         const ModelSpec& spec,
                                                         const TpShard& shard) {
  std::unique_ptr<ModelWeights> w(new ModelWeights());
  w->shard_ = shard;
  const int hidden = spec.hidden_size;
  HW_ASSIGN_OR_RETURN(w->token_embd_, LoadRows(file, "token_embd.weight", hidden,
                                               spec.vocab_size, shard.vocab_begin,
                                               shard.vocab_end));
  w->tied_ = file.FindTensor("output.weight") == nullptr;
  if (!w->tied_) {
    HW_ASSIGN_OR_RETURN(w->output_, LoadRows(file, "output.weight", hidden, spec.vocab_size,
                                             shard.vocab_begin, shard.vocab_end));
  }
  HW_ASSIGN_OR_RETURN(w->output_norm_, LoadVector(file, "output_norm.weight", hidden));
  w->layers_.resize(spec.num_layers);
  for (int l = 0; l < spec.num_layers; ++l) {
    HW_RETURN_IF_ERROR(LoadLayer(file, spec, shard, l, w->layers_[l]));
  }
  return w;
}

std::unique_ptr<ModelWeights> ModelWeights::TEST_Random(const ModelSpec& spec,
                                                        const TpShard& shard, uint64_t seed,
                                                        float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  };
  const size_t hidden = size_t(spec.hidden_size);
  const size_t hd = size_t(spec.head_dim);
  const size_t inter = size_t(shard.intermediate_end - shard.intermediate_begin);
  std::unique_ptr<ModelWeights> w(new ModelWeights());
  w->shard_ = shard;
  w->tied_ = true;
  w->token_embd_ = random(size_t(shard.vocab_end - shard.vocab_begin) * hidden);
  w->output_norm_.assign(hidden, 1.0f);
  w->layers_.resize(spec.num_layers);
  for (LayerWeights& l : w->layers_) {
    l.attn_norm.assign(hidden, 1.0f);
    l.wq = random(shard.num_local_heads() * hd * hidden);
    l.wk = random(shard.num_local_kv_heads() * hd * hidden);
    l.wv = random(shard.num_local_kv_heads() * hd * hidden);
    l.wo = random(hidden * shard.num_local_heads() * hd);
    l.ffn_norm.assign(hidden, 1.0f);
    l.w_gate = random(inter * hidden);
    l.w_up = random(inter * hidden);
    l.w_down = random(hidden * inter);
  }
  return w;
}

size_t ModelWeights::num_bytes() const {
  size_t n = token_embd_.size() + output_.size() + output_norm_.size();
  for (const LayerWeights& l : layers_) {
    n += l.attn_norm.size() + l.wq.size() + l.wk.size() + l.wv.size() + l.wo.size() +
         l.ffn_norm.size() + l.w_gate.size() + l.w_up.size() + l.w_down.size();
  }
  return n * sizeof(float);
}

}  // namespace headway
