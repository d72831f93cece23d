#include "worker/cuda/cuda_decoder_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include <spdlog/spdlog.h>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/sampling.h"
#include "worker/cuda/step_metadata.h"

namespace headway::cuda {
namespace {

Result<DeviceBuffer> AllocateFloats(size_t count) {
  return DeviceBuffer::Allocate(std::max<size_t>(count, 1) * sizeof(float));
}

// The CUDA runtime's current device is per thread, and the worker creates the
// model on its main thread but steps it on a compute thread (worker_loop.cc),
// which starts on device 0: a launch into a stream of another device fails,
// and cuBLAS handles and allocations follow the current device. So every
// entry point makes the model's device current first.
Status BindDevice(int device) { return MakeCurrent(device); }

}  // namespace

Result<std::unique_ptr<CudaDecoderModel>> CudaDecoderModel::Create(
    const ModelSpec& spec, std::unique_ptr<ModelWeights> weights, Communicator* comm,
    const CudaModelOptions& options) {
  HW_RETURN_IF_ERROR(ValidateModel(spec, weights.get(), comm));
  if (spec.head_dim != 64 && spec.head_dim != 128 && spec.head_dim != 256) {
    return Status::InvalidArgument("head_dim " + std::to_string(spec.head_dim) +
                                   " has no CUDA attention kernel (64, 128 or 256)");
  }
  if (options.max_tokens_per_step < 1 || options.max_seqs_per_step < 1 ||
      options.max_model_len < 1 || options.block_size < 1) {
    return Status::InvalidArgument(
        "max_tokens_per_step, max_seqs_per_step, max_model_len and block_size must be >= 1");
  }
  if (comm != nullptr && comm->size() > 1 && std::string(comm->backend()) != "nccl") {
    return Status::InvalidArgument(std::string("a CUDA rank needs the nccl collective backend, "
                                               "not ") + comm->backend());
  }
  HW_RETURN_IF_ERROR(SetDevice(options.device).status());  // checks the ordinal too
  std::unique_ptr<CudaDecoderModel> model(
      new CudaDecoderModel(spec, weights->shard(), comm, options));
  HW_RETURN_IF_ERROR(model->Init(std::move(weights)));
  return model;
}

CudaDecoderModel::CudaDecoderModel(const ModelSpec& spec, const TpShard& shard,
                                   Communicator* comm, const CudaModelOptions& options)
    : spec_(spec),
      shard_(shard),
      arch_(ArchitectureOf(spec)),
      comm_(comm),
      options_(options),
      local_specs_(LocalSlotSpecs(spec, shard)) {}

CudaDecoderModel::~CudaDecoderModel() {
  if (stream_ != nullptr) {
    // Nothing to report errors to here.
    Status bound = BindDevice(options_.device);
    Status drained = Synchronize(stream_, "shutdown");
    (void)bound;
    (void)drained;
    blas_.reset();
    DestroyStream(stream_);
  }
}

Status CudaDecoderModel::Init(std::unique_ptr<ModelWeights> weights) {
  HW_ASSIGN_OR_RETURN(stream_, CreateStream());
  HW_ASSIGN_OR_RETURN(blas_, Blas::Create(stream_));
  HW_ASSIGN_OR_RETURN(weights_, DeviceWeights::Upload(*weights, options_.exact_matmuls));
  weights.reset();  // the host copy is no longer needed

  HW_ASSIGN_OR_RETURN(slot_specs_, DeviceBuffer::Allocate(local_specs_.size() * sizeof(SlotSpec)));
  HW_RETURN_IF_ERROR(CopyToDevice(slot_specs_.data(), local_specs_.data(),
                                  local_specs_.size() * sizeof(SlotSpec), stream_));

  const size_t n = size_t(options_.max_tokens_per_step);
  const size_t hd = size_t(spec_.head_dim);
  const size_t hidden = size_t(spec_.hidden_size);
  const size_t inter = size_t(shard_.intermediate_end - shard_.intermediate_begin);
  const size_t vocab_rows = size_t(shard_.vocab_end - shard_.vocab_begin);
  HW_ASSIGN_OR_RETURN(x_, AllocateFloats(n * hidden));
  HW_ASSIGN_OR_RETURN(h_, AllocateFloats(n * hidden));
  HW_ASSIGN_OR_RETURN(q_, AllocateFloats(n * shard_.num_local_heads() * hd));
  HW_ASSIGN_OR_RETURN(k_, AllocateFloats(n * shard_.num_local_kv_heads() * hd));
  HW_ASSIGN_OR_RETURN(v_, AllocateFloats(n * shard_.num_local_kv_heads() * hd));
  HW_ASSIGN_OR_RETURN(attn_, AllocateFloats(n * shard_.num_local_heads() * hd));
  HW_ASSIGN_OR_RETURN(proj_, AllocateFloats(n * hidden));
  HW_ASSIGN_OR_RETURN(gate_, AllocateFloats(n * inter));
  HW_ASSIGN_OR_RETURN(up_, AllocateFloats(n * inter));
  HW_ASSIGN_OR_RETURN(attention_workspace_,
                      DeviceBuffer::Allocate(std::max<size_t>(
                          1, PagedAttentionWorkspaceBytes(options_.max_tokens_per_step,
                                                          shard_.num_local_heads(),
                                                          spec_.head_dim))));
  // Logit rows: at most one per sequence of a step.
  const size_t rows = size_t(std::min(options_.max_seqs_per_step, options_.max_tokens_per_step));
  HW_ASSIGN_OR_RETURN(local_logits_, AllocateFloats(rows * vocab_rows));
  if (shard_.tp_size > 1 && shard_.tp_rank == 0) {
    HW_ASSIGN_OR_RETURN(gathered_logits_,
                        AllocateFloats(size_t(shard_.tp_size) * rows * vocab_rows));
  }
  if (shard_.tp_rank == 0) {
    HW_ASSIGN_OR_RETURN(logits_host_, PinnedBuffer::Allocate(size_t(shard_.tp_size) * rows *
                                                             vocab_rows * sizeof(float)));
  }
  {
    // Greedy picks: per row a token, a logprob and kMaxTopLogprobs of each.
    const size_t bytes = rows * (2 + 2 * kMaxTopLogprobs) * sizeof(int32_t);
    HW_ASSIGN_OR_RETURN(picks_device_, DeviceBuffer::Allocate(bytes));
    HW_ASSIGN_OR_RETURN(picks_host_, PinnedBuffer::Allocate(bytes));
  }
  // Step metadata for the largest step the scheduler plans, so that it is
  // allocated before the KV pool takes what is left.
  {
    const size_t seqs = rows;
    const size_t max_blocks = size_t(options_.max_model_len + options_.block_size - 1) /
                              size_t(options_.block_size);
    const size_t ints = 3 * n + 2 * seqs + 1 + seqs +
                        size_t(spec_.num_layers) * seqs * shard_.num_local_kv_heads() * max_blocks;
    HW_ASSIGN_OR_RETURN(metadata_host_, PinnedBuffer::Allocate(ints * sizeof(int32_t)));
    HW_ASSIGN_OR_RETURN(metadata_, DeviceBuffer::Allocate(ints * sizeof(int32_t)));
  }
  tables_.resize(size_t(spec_.num_layers));
  // The first bf16 GEMM of a shape grows blas_'s activation scratch (to
  // 1.5 x rows x inputs bf16) and makes cuBLAS set up its workspace. Done here
  // at the step's largest shapes, that memory is in use before the KV pool is
  // sized from what is left, rather than failing a long prefill later (the
  // pool leaves only a small reserve). Inputs are zeroed; outputs are scratch.
  if (spec_.num_layers > 0) {
    const DeviceLayerWeights& w = weights_->layer(0);
    HW_RETURN_IF_ERROR(Memset(h_.data(), 0, h_.bytes(), stream_));
    HW_RETURN_IF_ERROR(Memset(attn_.data(), 0, attn_.bytes(), stream_));
    HW_RETURN_IF_ERROR(Memset(gate_.data(), 0, gate_.bytes(), stream_));
    const int m = options_.max_tokens_per_step;
    HW_RETURN_IF_ERROR(blas_->MatmulTransB(h_.as<float>(), w.wq.bf16_data(), m, w.wq.rows,
                                           w.wq.cols, q_.as<float>()));
    HW_RETURN_IF_ERROR(blas_->MatmulTransB(attn_.as<float>(), w.wo.bf16_data(), m, w.wo.rows,
                                           w.wo.cols, proj_.as<float>()));
    HW_RETURN_IF_ERROR(blas_->MatmulTransB(gate_.as<float>(), w.w_down.bf16_data(), m,
                                           w.w_down.rows, w.w_down.cols, proj_.as<float>()));
  }
  HW_RETURN_IF_ERROR(Synchronize(stream_, "CUDA model init"));
  if (!options_.exact_matmuls) HW_RETURN_IF_ERROR(CalibrateGemv());
  return Status::Ok();
}

Status CudaDecoderModel::CalibrateGemv() {
  std::vector<const DeviceLinear*> linears = {&weights_->lm_head()};
  if (spec_.num_layers > 0) {
    const DeviceLayerWeights& w = weights_->layer(0);
    linears.insert(linears.end(), {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down});
  }
  size_t max_rows = 1, max_cols = 1;
  for (const DeviceLinear* w : linears) {
    max_rows = std::max(max_rows, size_t(w->rows));
    max_cols = std::max(max_cols, size_t(w->cols));
  }
  HW_ASSIGN_OR_RETURN(DeviceBuffer x, AllocateFloats(kMaxDequantGemvRows * max_cols));
  HW_ASSIGN_OR_RETURN(DeviceBuffer y, AllocateFloats(kMaxDequantGemvRows * max_rows));
  HW_RETURN_IF_ERROR(Memset(x.data(), 0, x.bytes(), stream_));
  // Median of 5 timed calls after 2 untimed ones, in milliseconds.
  auto time = [&](auto&& call) -> Result<float> {
    std::vector<float> ms;
    for (int i = 0; i < 7; ++i) {
      EventTimer timer;
      timer.Start(stream_);
      HW_RETURN_IF_ERROR(call());
      timer.Stop(stream_);
      const float t = timer.ElapsedMs();
      if (i >= 2) ms.push_back(t);
    }
    HW_RETURN_IF_ERROR(Synchronize(stream_, "timing linear layers"));
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    return ms[ms.size() / 2];
  };
  for (const DeviceLinear* w : linears) {
    if (!w->has_quant()) continue;
    const GemvKey key{w->rows, w->cols, int(w->quant_type)};
    if (gemv_max_rows_.count(key)) continue;
    int faster_up_to = 0;
    for (int m : {1, 2, 4, kMaxDequantGemvRows}) {
      HW_ASSIGN_OR_RETURN(float gemv, time([&] {
                            DequantGemv(x.as<float>(), w->quant_data(), w->quant_type, m, w->rows,
                                        w->cols, y.as<float>(), stream_);
                            return Status::Ok();
                          }));
      HW_ASSIGN_OR_RETURN(float gemm, time([&] {
                            return blas_->MatmulTransB(x.as<float>(), w->bf16_data(), m, w->rows,
                                                       w->cols, y.as<float>());
                          }));
      if (gemv > gemm) break;
      faster_up_to = m;
    }
    gemv_max_rows_[key] = faster_up_to;
    spdlog::info("cuda:{}: [{} x {}] {} weights: dequantising GEMV for up to {} rows, then "
                 "bf16 GEMM",
                 options_.device, w->rows, w->cols, GgmlTypeName(w->quant_type), faster_up_to);
  }
  return Status::Ok();
}

int CudaDecoderModel::GemvMaxRows(const DeviceLinear& w) const {
  if (!w.has_quant()) return 0;
  if (options_.exact_matmuls) return std::numeric_limits<int>::max();
  auto it = gemv_max_rows_.find(GemvKey{w.rows, w.cols, int(w.quant_type)});
  // Shapes not timed (other layers share layer 0's) default to the GEMV.
  return it != gemv_max_rows_.end() ? it->second : kMaxDequantGemvRows;
}

size_t CudaDecoderModel::device_bytes() const {
  size_t bytes = weights_->num_bytes() + slot_specs_.bytes() + attention_workspace_.bytes() +
                 local_logits_.bytes() + gathered_logits_.bytes() + metadata_.bytes();
  for (const DeviceBuffer* b : {&x_, &h_, &q_, &k_, &v_, &attn_, &proj_, &gate_, &up_}) {
    bytes += b->bytes();
  }
  return bytes;
}

Status CudaDecoderModel::Linear(const DeviceLinear& w, const float* x, int m, float* y) {
  if (m <= GemvMaxRows(w)) {
    for (int r = 0; r < m; r += kMaxDequantGemvRows) {
      const int rows = std::min(kMaxDequantGemvRows, m - r);
      DequantGemv(x + size_t(r) * w.cols, w.quant_data(), w.quant_type, rows, w.rows, w.cols,
                  y + size_t(r) * w.rows, stream_);
    }
    return Status::Ok();
  }
  return blas_->MatmulTransB(x, w.bf16_data(), m, w.rows, w.cols, y);
}

Status CudaDecoderModel::AllReduce(float* data, size_t count) {
  if (comm_ == nullptr || comm_->size() == 1) return Status::Ok();
  HW_RETURN_IF_ERROR(Synchronize(stream_, "before all-reduce"));
  const auto t0 = std::chrono::steady_clock::now();
  Status s = comm_->AllReduceSum(data, count);
  collective_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

Status CudaDecoderModel::UploadBatch(const ForwardBatch& batch) {
  const size_t total = StepMetadataInts(batch, spec_.num_layers);
  if (metadata_host_.bytes() < total * sizeof(int32_t)) {
    HW_RETURN_IF_ERROR(Synchronize(stream_, "growing step metadata"));
    HW_ASSIGN_OR_RETURN(metadata_host_, PinnedBuffer::Allocate(2 * total * sizeof(int32_t)));
    HW_ASSIGN_OR_RETURN(metadata_, DeviceBuffer::Allocate(2 * total * sizeof(int32_t)));
  }
  const StepMetadataLayout m =
      PackStepMetadata(batch, spec_.num_layers, metadata_host_.as<int32_t>());
  const int32_t* device = metadata_.as<const int32_t>();
  token_ids_ = device + m.token_ids;
  logit_rows_ = device + m.logit_rows;
  batch_.num_seqs = batch.layout.num_seqs;
  batch_.num_tokens = batch.layout.num_tokens();
  batch_.query_start = device + m.query_start;
  batch_.start_pos = device + m.start_pos;
  batch_.token_seq = device + m.token_seq;
  batch_.positions = device + m.positions;
  batch_.max_query_len = m.max_query_len;
  batch_.max_context_len = m.max_context_len;
  for (int l = 0; l < spec_.num_layers; ++l) {
    tables_[l] = LayerBlockTable{device + m.tables[l], batch.tables[l].num_kv_heads,
                                 batch.tables[l].max_blocks};
  }
  return CopyToDevice(metadata_.data(), metadata_host_.data(), m.total * sizeof(int32_t), stream_);
}

Status CudaDecoderModel::Forward(const ForwardBatch& batch, KvPool* pool,
                                 std::vector<float>* logits) {
  const int n = batch.layout.num_tokens();
  const int hidden = spec_.hidden_size;
  const int hd = spec_.head_dim;
  const int n_heads = shard_.num_local_heads();
  const int n_kv = shard_.num_local_kv_heads();
  const int inter = shard_.intermediate_end - shard_.intermediate_begin;
  const float eps = spec_.rms_norm_eps;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const KvArenaLayout& arena = pool->arena();
  HW_CHECK(arena.head_dim == hd && pool->device() == options_.device);
  HW_CHECK(n >= 1 && n <= options_.max_tokens_per_step);
  HW_CHECK(batch.num_logit_rows <= options_.max_seqs_per_step);
  HW_CHECK(batch.tables[0].num_kv_heads == n_kv);
  HW_RETURN_IF_ERROR(BindDevice(options_.device).WithContext("forward pass"));
  HW_RETURN_IF_ERROR(UploadBatch(batch));

  float* x = x_.as<float>();
  float* h = h_.as<float>();
  float* q = q_.as<float>();
  float* k = k_.as<float>();
  float* v = v_.as<float>();
  float* attn = attn_.as<float>();
  float* proj = proj_.as<float>();
  float* gate = gate_.as<float>();
  float* up = up_.as<float>();
  const size_t hidden_floats = size_t(n) * hidden;
  const SlotSpec* specs = slot_specs_.as<const SlotSpec>();

  if (weights_->token_embd_f32() != nullptr) {
    EmbeddingShard(weights_->token_embd_f32(), shard_.vocab_begin, shard_.vocab_end, token_ids_, n,
                   hidden, arch_.embedding_scale, x, stream_);
  } else {
    EmbeddingShard(weights_->token_embd().bf16_data(), shard_.vocab_begin, shard_.vocab_end,
                   token_ids_, n, hidden, arch_.embedding_scale, x, stream_);
  }
  HW_RETURN_IF_ERROR(AllReduce(x, hidden_floats).WithContext("embedding all-reduce"));
  RmsNorm(x, weights_->layer(0).attn_norm.as<const float>(), n, hidden, eps, h, stream_);
  for (int l = 0; l < spec_.num_layers; ++l) {
    const DeviceLayerWeights& w = weights_->layer(l);
    // Attention block; h holds rmsnorm(x) with attn_norm.
    HW_RETURN_IF_ERROR(Linear(w.wq, h, n, q));
    HW_RETURN_IF_ERROR(Linear(w.wk, h, n, k));
    HW_RETURN_IF_ERROR(Linear(w.wv, h, n, v));
    if (arch_.qk_norm) {
      RmsNorm(q, w.attn_q_norm.as<const float>(), n * n_heads, hd, eps, q, stream_);
      RmsNorm(k, w.attn_k_norm.as<const float>(), n * n_kv, hd, eps, k, stream_);
    }
    // Each layer's blocks are of its slots' dtype (common/kv_arena.h): the
    // kernels take one layout for all of a layer's KV heads.
    const SlotSpec* layer_specs = local_specs_.data() + size_t(l) * n_kv;
    const KvCacheLayout layout = arena.SlotLayout(layer_specs[0]);
    for (int i = 1; i < n_kv; ++i) HW_CHECK(arena.SlotLayout(layer_specs[i]).dtype == layout.dtype);
    RopeAppendKv(q, k, v, batch_, tables_[l], layout, n_heads, spec_.RopeFreqBase(l),
                 arch_.rope_style, pool->data(), stream_);
    PagedAttention(q, pool->data(), batch_, tables_[l], specs + size_t(l) * n_kv, layout,
                   n_heads, scale, attention_workspace_.data(), attn, stream_);
    HW_RETURN_IF_ERROR(Linear(w.wo, attn, n, proj));
    HW_RETURN_IF_ERROR(AllReduce(proj, hidden_floats).WithContext("attention all-reduce"));
    if (arch_.post_norms) {
      RmsNorm(proj, w.post_attention_norm.as<const float>(), n, hidden, eps, proj, stream_);
    }
    // x += proj; h = rmsnorm(x) with ffn_norm.
    AddRmsNorm(x, proj, w.ffn_norm.as<const float>(), n, hidden, eps, h, stream_);
    // MLP block.
    HW_RETURN_IF_ERROR(Linear(w.w_gate, h, n, gate));
    HW_RETURN_IF_ERROR(Linear(w.w_up, h, n, up));
    if (arch_.gelu_tanh_mlp) {
      GeluTanhGated(gate, up, int64_t(n) * inter, gate, stream_);
    } else {
      SwiGlu(gate, up, int64_t(n) * inter, gate, stream_);
    }
    HW_RETURN_IF_ERROR(Linear(w.w_down, gate, n, proj));
    HW_RETURN_IF_ERROR(AllReduce(proj, hidden_floats).WithContext("MLP all-reduce"));
    if (arch_.post_norms) {
      RmsNorm(proj, w.post_ffw_norm.as<const float>(), n, hidden, eps, proj, stream_);
    }
    // x += proj; h = rmsnorm(x) with the next layer's attn_norm (the last
    // layer's h is unused: the logits norm only the logit rows).
    const float* next_norm = l + 1 < spec_.num_layers
                                 ? weights_->layer(l + 1).attn_norm.as<const float>()
                                 : weights_->output_norm();
    AddRmsNorm(x, proj, next_norm, n, hidden, eps, h, stream_);
  }
  HW_RETURN_IF_ERROR(CheckLastError("forward pass launch"));
  return ComputeLogits(batch, logits);
}

Status CudaDecoderModel::PickGreedyRows(const ForwardBatch& batch, const float* device_logits,
                                        bool* need_logits) {
  const int r = batch.num_logit_rows;
  const int vocab = spec_.vocab_size;
  int k = 0;
  for (int i = 0; i < r; ++i) {
    const int want = batch.greedy_picks != nullptr ? batch.greedy_picks[i] : -1;
    if (want < 0 || want > kMaxTopLogprobs) *need_logits = true;
    if (want > 0 && want <= kMaxTopLogprobs) k = std::max(k, want);
  }
  picks_.assign(size_t(r), SampleResult{});  // token_id -1: not picked
  if (batch.greedy_picks == nullptr) return Status::Ok();
  // Layout: tokens [r] | logprobs [r] | top ids [r, k] | top logprobs [r, k].
  int32_t* tokens = picks_device_.as<int32_t>();
  float* logprobs = reinterpret_cast<float*>(tokens + r);
  int32_t* top_ids = tokens + 2 * size_t(r);
  float* top_logprobs = reinterpret_cast<float*>(top_ids + size_t(r) * k);
  GreedySample(device_logits, r, vocab, tokens, logprobs, stream_);
  if (k > 0) TopLogprobs(device_logits, r, vocab, k, top_ids, top_logprobs, stream_);
  const size_t bytes = (2 * size_t(r) + 2 * size_t(r) * k) * sizeof(int32_t);
  HW_RETURN_IF_ERROR(CopyToHost(picks_host_.data(), tokens, bytes, stream_));
  HW_RETURN_IF_ERROR(Synchronize(stream_, "greedy picks"));
  const int32_t* h_tokens = picks_host_.as<const int32_t>();
  const float* h_logprobs = reinterpret_cast<const float*>(h_tokens + r);
  const int32_t* h_top_ids = h_tokens + 2 * size_t(r);
  const float* h_top_logprobs = reinterpret_cast<const float*>(h_top_ids + size_t(r) * k);
  for (int i = 0; i < r; ++i) {
    const int want = batch.greedy_picks[i];
    if (want < 0 || want > kMaxTopLogprobs) continue;
    if (h_tokens[i] < 0) {  // a row of only -inf: cpu::Sample decides, from the logits
      *need_logits = true;
      continue;
    }
    SampleResult& pick = picks_[i];
    pick.token_id = h_tokens[i];
    pick.logprob = h_logprobs[i];
    for (int j = 0; j < want; ++j) {
      const int32_t id = h_top_ids[size_t(i) * k + j];
      if (id >= 0) pick.top_logprobs.emplace_back(id, h_top_logprobs[size_t(i) * k + j]);
    }
  }
  return Status::Ok();
}

Status CudaDecoderModel::ComputeLogits(const ForwardBatch& batch, std::vector<float>* logits) {
  const int r = batch.num_logit_rows;
  const int hidden = spec_.hidden_size;
  const int vocab_rows = shard_.vocab_end - shard_.vocab_begin;
  logits->resize(shard_.tp_rank == 0 ? size_t(r) * spec_.vocab_size : 0);
  picks_.clear();
  if (r == 0) return Synchronize(stream_, "forward pass");
  // h already holds rmsnorm(x) with output_norm for every row; pick the
  // logit rows into proj_ (n >= r rows of hidden floats).
  float* last = proj_.as<float>();
  GatherRows(h_.as<const float>(), logit_rows_, r, hidden, last, stream_);
  float* local = local_logits_.as<float>();
  HW_RETURN_IF_ERROR(Linear(weights_->lm_head(), last, r, local));
  const float* rank0_logits = local;
  if (shard_.tp_size > 1) {
    HW_RETURN_IF_ERROR(Synchronize(stream_, "before logits gather"));
    const auto t0 = std::chrono::steady_clock::now();
    Status gathered = comm_->Gather(local, size_t(r) * vocab_rows,
                                    shard_.tp_rank == 0 ? gathered_logits_.as<float>() : nullptr,
                                    0);
    collective_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    HW_RETURN_IF_ERROR(gathered.WithContext("logits gather"));
    if (shard_.tp_rank != 0) return Status::Ok();
    rank0_logits = gathered_logits_.as<const float>();
  } else {
    // At TP 1 the rows are whole ([r, vocab]): greedy rows are picked here.
    bool need_logits = options_.copy_all_logits;
    HW_RETURN_IF_ERROR(PickGreedyRows(batch, local, &need_logits));
    if (!need_logits) return Status::Ok();
  }
  const size_t count = size_t(shard_.tp_size) * r * vocab_rows;
  HW_RETURN_IF_ERROR(
      CopyToHost(logits_host_.data(), rank0_logits, count * sizeof(float), stream_));
  HW_RETURN_IF_ERROR(Synchronize(stream_, "forward pass"));
  const float* src = logits_host_.as<const float>();
  if (shard_.tp_size == 1) {
    std::memcpy(logits->data(), src, size_t(r) * spec_.vocab_size * sizeof(float));
    return Status::Ok();
  }
  // [rank, row, local vocab] -> [row, vocab], padding dropped (as the CPU model).
  for (int rank = 0; rank < shard_.tp_size; ++rank) {
    const int begin = rank * vocab_rows;
    const int cols = std::min(vocab_rows, spec_.vocab_size - begin);
    if (cols <= 0) continue;
    for (int i = 0; i < r; ++i) {
      std::memcpy(logits->data() + size_t(i) * spec_.vocab_size + begin,
                  src + (size_t(rank) * r + i) * vocab_rows, size_t(cols) * sizeof(float));
    }
  }
  return Status::Ok();
}

}  // namespace headway::cuda
