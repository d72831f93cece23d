#include "worker/model_weights.h"

#include <algorithm>
#include <random>
#include <string>

#include "kernels/quant_matmul.h"
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

// Rows [row_begin, row_end) and columns [col_begin, col_end) of the matrix
// `name` (ne = {n_in, n_out}). Rows at or past n_out (vocabulary padding) are
// zero. The stored blocks are kept when QuantMatmulTransBF32Act handles the
// type and the column range does not cut a quantisation block (all-zero
// bytes are a zero block in every such type, so padding stays zero); else the
// slice is dequantised to f32. Never both (worker/linear.h).
Result<LinearWeight> LoadMatrix(const GgufFile& file, const std::string& name, int n_in,
                                int n_out, int row_begin, int row_end, int col_begin,
                                int col_end) {
  HW_ASSIGN_OR_RETURN(const GgufTensorInfo* info,
                      FindChecked(file, name, {uint64_t(n_in), uint64_t(n_out)}));
  HW_ASSIGN_OR_RETURN(uint64_t row_bytes, GgmlBytes(info->type, uint64_t(n_in)));
  HW_ASSIGN_OR_RETURN(GgmlTypeSize block, GgmlTypeSizeOf(info->type));
  LinearWeight w;
  w.rows = row_end - row_begin;
  w.cols = col_end - col_begin;
  const int real_end = std::min(row_end, n_out);
  const int real_rows = std::max(0, real_end - row_begin);
  const uint8_t* src = file.TensorData(*info) + uint64_t(row_begin) * row_bytes;

  if (cpu::QuantMatmulSupported(info->type) && col_begin % block.block_values == 0 &&
      w.cols % block.block_values == 0) {
    const uint64_t byte_begin = col_begin / block.block_values * block.block_bytes;
    const uint64_t slice_bytes = w.cols / block.block_values * block.block_bytes;
    w.quant_type = info->type;
    w.quant.assign(size_t(w.rows) * slice_bytes, 0);
    for (int r = 0; r < real_rows; ++r) {
      std::copy_n(src + uint64_t(r) * row_bytes + byte_begin, slice_bytes,
                  w.quant.data() + size_t(r) * slice_bytes);
    }
    return w;
  }

  // One row at a time, so the transient memory is a row, not the matrix.
  w.f32.assign(size_t(w.rows) * w.cols, 0.0f);
  std::vector<float> row(static_cast<size_t>(n_in));
  for (int r = 0; r < real_rows; ++r) {
    Status s = Dequantize(info->type, src + uint64_t(r) * row_bytes, row.data(), uint64_t(n_in));
    if (!s.ok()) return s.WithContext("tensor " + name);
    std::copy_n(row.data() + col_begin, w.cols, w.f32.data() + size_t(r) * w.cols);
  }
  return w;
}

// Rows [row_begin, row_end), all columns.
Result<LinearWeight> LoadRows(const GgufFile& file, const std::string& name, int n_in,
                              int n_out, int row_begin, int row_end) {
  return LoadMatrix(file, name, n_in, n_out, row_begin, row_end, 0, n_in);
}

// All rows, columns [col_begin, col_end).
Result<LinearWeight> LoadColumns(const GgufFile& file, const std::string& name, int n_in,
                                 int n_out, int col_begin, int col_end) {
  return LoadMatrix(file, name, n_in, n_out, 0, n_out, col_begin, col_end);
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
  if (spec.architecture == "gemma3") {
    HW_ASSIGN_OR_RETURN(w.attn_q_norm, LoadVector(file, p + "attn_q_norm.weight", hd));
    HW_ASSIGN_OR_RETURN(w.attn_k_norm, LoadVector(file, p + "attn_k_norm.weight", hd));
    HW_ASSIGN_OR_RETURN(w.post_attention_norm,
                        LoadVector(file, p + "post_attention_norm.weight", hidden));
    HW_ASSIGN_OR_RETURN(w.post_ffw_norm, LoadVector(file, p + "post_ffw_norm.weight", hidden));
  }
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
  auto random_linear = [&](size_t rows, size_t cols) {
    LinearWeight w;
    w.rows = int(rows);
    w.cols = int(cols);
    w.f32 = random(rows * cols);
    return w;
  };
  const size_t hidden = size_t(spec.hidden_size);
  const size_t hd = size_t(spec.head_dim);
  const size_t inter = size_t(shard.intermediate_end - shard.intermediate_begin);
  std::unique_ptr<ModelWeights> w(new ModelWeights());
  w->shard_ = shard;
  w->tied_ = true;
  w->token_embd_ = random_linear(size_t(shard.vocab_end - shard.vocab_begin), hidden);
  w->output_norm_.assign(hidden, 1.0f);
  w->layers_.resize(spec.num_layers);
  for (LayerWeights& l : w->layers_) {
    l.attn_norm.assign(hidden, 1.0f);
    l.wq = random_linear(shard.num_local_heads() * hd, hidden);
    l.wk = random_linear(shard.num_local_kv_heads() * hd, hidden);
    l.wv = random_linear(shard.num_local_kv_heads() * hd, hidden);
    l.wo = random_linear(hidden, shard.num_local_heads() * hd);
    l.ffn_norm.assign(hidden, 1.0f);
    l.w_gate = random_linear(inter, hidden);
    l.w_up = random_linear(inter, hidden);
    l.w_down = random_linear(hidden, inter);
    if (spec.architecture == "gemma3") {
      l.attn_q_norm.assign(hd, 1.0f);
      l.attn_k_norm.assign(hd, 1.0f);
      l.post_attention_norm.assign(hidden, 1.0f);
      l.post_ffw_norm.assign(hidden, 1.0f);
    }
  }
  return w;
}

size_t ModelWeights::num_bytes() const {
  size_t n = token_embd_.num_bytes() + output_.num_bytes() +
             output_norm_.size() * sizeof(float);
  for (const LayerWeights& l : layers_) {
    n += (l.attn_norm.size() + l.ffn_norm.size() + l.attn_q_norm.size() +
          l.attn_k_norm.size() + l.post_attention_norm.size() + l.post_ffw_norm.size()) *
         sizeof(float);
    for (const LinearWeight* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      n += m->num_bytes();
    }
  }
  return n;
}

}  // namespace headway
