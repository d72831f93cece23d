// RoPE of Q and K fused with the write of K and V into the head-wise paged
// pool (cpu::Rope followed by cpu::AppendKv, in one kernel).
//
// One CTA per token: it computes the token's cos/sin table once in shared
// memory (angles in double, as cpu::Rope, since positions reach 1e5 where
// f32 angles drift), then rotates every query head in place and, one KV
// head at a time, stages the rotated K row and the V row in shared memory
// and encodes both into the pool block in the KV cache dtype.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_codec.cuh"

namespace headway::cuda {
namespace {

constexpr int kRopeThreads = 128;
constexpr int kMaxHeadDim = 512;
constexpr int kMaxRopeHalf = kMaxHeadDim / 2;

struct RopeAppendParams {
  float* q;                  // [num_tokens, num_heads, head_dim]
  const float* k;            // [num_tokens, num_kv_heads, head_dim]
  const float* v;            // [num_tokens, num_kv_heads, head_dim]
  const int32_t* token_seq;  // [num_tokens]
  const int32_t* positions;  // [num_tokens]
  const int32_t* block_ids;  // [num_seqs, num_kv_heads, max_blocks]
  uint8_t* pool;             // [num_blocks, block_bytes]
  int num_seqs;
  int num_heads;
  int num_kv_heads;
  int max_blocks;
  int block_size;
  int head_dim;
  long long row_bytes;
  long long block_bytes;
  float freq_base;
  bool neox;
};

// Where the K row of (token at `pos` of sequence `seq`, KV head `kv_head`)
// goes in the pool (its V row is block_size rows further), or nullptr when
// the table has no block there (never written).
__device__ uint8_t* KDestination(const RopeAppendParams& p, int seq, int kv_head, int pos) {
  if (seq < 0 || seq >= p.num_seqs || pos < 0) return nullptr;
  const int logical = pos / p.block_size;
  if (logical >= p.max_blocks) return nullptr;
  const int32_t block_id =
      p.block_ids[(static_cast<size_t>(seq) * p.num_kv_heads + kv_head) * p.max_blocks + logical];
  if (block_id < 0) return nullptr;
  const int in_block = pos - logical * p.block_size;
  return p.pool + static_cast<size_t>(block_id) * static_cast<size_t>(p.block_bytes) +
         static_cast<size_t>(in_block) * static_cast<size_t>(p.row_bytes);
}

// One RoPE pair, with every rounding explicit so the f32 K rows of every
// dtype's kernel are the same bits (the 8- and 4-bit encodings are then
// exactly the reference's encoding of the float32 kernel's rows).
__device__ inline void RotatePair(float x0, float x1, float c, float s, float* y0, float* y1) {
  *y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  *y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

template <KvCacheDtype kDtype>
__global__ void __launch_bounds__(kRopeThreads) RopeAppendKvKernel(const RopeAppendParams p) {
  __shared__ float cos_s[kMaxRopeHalf];
  __shared__ float sin_s[kMaxRopeHalf];
  __shared__ float kv_s[2 * kMaxHeadDim];  // one KV head's rotated K row, then its V row
  const int token = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const int hd = p.head_dim;
  const int half = hd / 2;
  const int pos = p.positions[token];
  const int seq = p.token_seq[token];

  for (int i = tid; i < half; i += blockDim.x) {
    // The same expression as cpu::Rope, so both round alike.
    const double inv_freq = pow(static_cast<double>(p.freq_base), -2.0 * i / hd);
    const double theta = pos * inv_freq;
    double s = 0.0, c = 0.0;
    sincos(theta, &s, &c);
    cos_s[i] = static_cast<float>(c);
    sin_s[i] = static_cast<float>(s);
  }
  __syncthreads();

  auto pair = [&](int i, int* i0, int* i1) {
    *i0 = p.neox ? i : 2 * i;
    *i1 = p.neox ? i + half : 2 * i + 1;
  };
  for (int item = tid; item < p.num_heads * half; item += blockDim.x) {
    const int head = item / half;
    const int i = item - head * half;
    int i0, i1;
    pair(i, &i0, &i1);
    float* x = p.q + (static_cast<size_t>(token) * p.num_heads + head) * hd;
    RotatePair(x[i0], x[i1], cos_s[i], sin_s[i], &x[i0], &x[i1]);
  }

  // K and V of each KV head go through shared memory so that the q dtypes'
  // groups of 32 are encoded whole. The destination is the same for every
  // thread, so the skip and the barriers are uniform.
  for (int kv_head = 0; kv_head < p.num_kv_heads; ++kv_head) {
    uint8_t* dst = KDestination(p, seq, kv_head, pos);
    if (dst == nullptr) continue;
    const size_t src = (static_cast<size_t>(token) * p.num_kv_heads + kv_head) * hd;
    for (int i = tid; i < half; i += blockDim.x) {
      int i0, i1;
      pair(i, &i0, &i1);
      RotatePair(p.k[src + i0], p.k[src + i1], cos_s[i], sin_s[i], &kv_s[i0], &kv_s[i1]);
    }
    for (int d = tid; d < hd; d += blockDim.x) kv_s[hd + d] = p.v[src + d];
    __syncthreads();
    EncodeKvRowsCta<kDtype>(kv_s, 2, hd, dst,
                            static_cast<size_t>(p.block_size) * static_cast<size_t>(p.row_bytes));
    __syncthreads();  // kv_s is free for the next head
  }
}

}  // namespace

void RopeAppendKv(float* q, const float* k, const float* v, const DeviceBatch& batch,
                  const LayerBlockTable& table, const KvCacheLayout& layout, int num_heads,
                  float freq_base, cpu::RopeStyle style, uint8_t* pool, Stream stream) {
  if (batch.num_tokens <= 0) return;
  HW_CHECK(layout.head_dim > 0 && layout.head_dim % 2 == 0 && layout.head_dim <= kMaxHeadDim);
  HW_CHECK(layout.Check().empty());
  HW_CHECK(layout.block_size > 0 && num_heads >= 0 && table.num_kv_heads > 0);
  HW_CHECK(batch.token_seq != nullptr && batch.positions != nullptr);
  HW_CHECK(static_cast<size_t>(KvRowBytes(layout.dtype, layout.head_dim)) == layout.RowBytes());
  RopeAppendParams p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.token_seq = batch.token_seq;
  p.positions = batch.positions;
  p.block_ids = table.block_ids;
  p.pool = pool;
  p.num_seqs = batch.num_seqs;
  p.num_heads = num_heads;
  p.num_kv_heads = table.num_kv_heads;
  p.max_blocks = table.max_blocks;
  p.block_size = layout.block_size;
  p.head_dim = layout.head_dim;
  p.row_bytes = static_cast<long long>(layout.RowBytes());
  p.block_bytes = static_cast<long long>(layout.BlockBytes());
  p.freq_base = freq_base;
  p.neox = style == cpu::RopeStyle::kNeox;
  DispatchKvDtype(layout.dtype, [&](auto dtype) {
    RopeAppendKvKernel<decltype(dtype)::value><<<batch.num_tokens, kRopeThreads, 0, stream>>>(p);
  });
}

}  // namespace headway::cuda
