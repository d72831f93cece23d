// RoPE of Q and K fused with the write of K and V into the head-wise paged
// pool (cpu::Rope followed by cpu::AppendKv, in one kernel).
//
// One CTA per token: it computes the token's cos/sin table once in shared
// memory (angles in double, as cpu::Rope, since positions reach 1e5 where
// f32 angles drift), then rotates every query head in place and every KV
// head into its pool block, and copies V.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/attention.h"

namespace headway::cuda {
namespace {

constexpr int kRopeThreads = 128;
constexpr int kMaxRopeHalf = 256;  // head_dim <= 512

struct RopeAppendParams {
  float* q;                  // [num_tokens, num_heads, head_dim]
  const float* k;            // [num_tokens, num_kv_heads, head_dim]
  const float* v;            // [num_tokens, num_kv_heads, head_dim]
  const int32_t* token_seq;  // [num_tokens]
  const int32_t* positions;  // [num_tokens]
  const int32_t* block_ids;  // [num_seqs, num_kv_heads, max_blocks]
  float* pool;               // [num_blocks, block_floats]
  int num_seqs;
  int num_heads;
  int num_kv_heads;
  int max_blocks;
  int block_size;
  int head_dim;
  long long block_floats;
  float freq_base;
  bool neox;
};

// Where K of (token at `pos` of sequence `seq`, KV head `kv_head`) goes in
// the pool, or nullptr when the table has no block there (never written).
__device__ float* KDestination(const RopeAppendParams& p, int seq, int kv_head, int pos) {
  if (seq < 0 || seq >= p.num_seqs || pos < 0) return nullptr;
  const int logical = pos / p.block_size;
  if (logical >= p.max_blocks) return nullptr;
  const int32_t block_id =
      p.block_ids[(static_cast<size_t>(seq) * p.num_kv_heads + kv_head) * p.max_blocks + logical];
  if (block_id < 0) return nullptr;
  const int in_block = pos - logical * p.block_size;
  return p.pool + static_cast<size_t>(block_id) * static_cast<size_t>(p.block_floats) +
         static_cast<size_t>(in_block) * p.head_dim;
}

__global__ void __launch_bounds__(kRopeThreads) RopeAppendKvKernel(const RopeAppendParams p) {
  __shared__ float cos_s[kMaxRopeHalf];
  __shared__ float sin_s[kMaxRopeHalf];
  const int token = blockIdx.x;
  const int half = p.head_dim / 2;
  const int pos = p.positions[token];
  const int seq = p.token_seq[token];

  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    // The same expression as cpu::Rope, so both round alike.
    const double inv_freq = pow(static_cast<double>(p.freq_base), -2.0 * i / p.head_dim);
    const double theta = pos * inv_freq;
    double s = 0.0, c = 0.0;
    sincos(theta, &s, &c);
    cos_s[i] = static_cast<float>(c);
    sin_s[i] = static_cast<float>(s);
  }
  __syncthreads();

  // Rotation items: (head, pair) over the query heads, then the KV heads.
  const int num_items = (p.num_heads + p.num_kv_heads) * half;
  for (int item = threadIdx.x; item < num_items; item += blockDim.x) {
    const int head = item / half;
    const int i = item - head * half;
    const int i0 = p.neox ? i : 2 * i;
    const int i1 = p.neox ? i + half : 2 * i + 1;
    const float c = cos_s[i];
    const float s = sin_s[i];
    if (head < p.num_heads) {
      float* x = p.q + (static_cast<size_t>(token) * p.num_heads + head) * p.head_dim;
      const float x0 = x[i0];
      const float x1 = x[i1];
      x[i0] = x0 * c - x1 * s;
      x[i1] = x0 * s + x1 * c;
    } else {
      const int kv_head = head - p.num_heads;
      float* dst = KDestination(p, seq, kv_head, pos);
      if (dst == nullptr) continue;
      const float* x = p.k + (static_cast<size_t>(token) * p.num_kv_heads + kv_head) * p.head_dim;
      const float x0 = x[i0];
      const float x1 = x[i1];
      dst[i0] = x0 * c - x1 * s;
      dst[i1] = x0 * s + x1 * c;
    }
  }

  // V rows, unrotated, block_size * head_dim floats after K in the block.
  const size_t v_offset = static_cast<size_t>(p.block_size) * p.head_dim;
  const int num_v = p.num_kv_heads * p.head_dim;
  for (int item = threadIdx.x; item < num_v; item += blockDim.x) {
    const int kv_head = item / p.head_dim;
    const int d = item - kv_head * p.head_dim;
    float* dst = KDestination(p, seq, kv_head, pos);
    if (dst == nullptr) continue;
    dst[v_offset + d] =
        p.v[(static_cast<size_t>(token) * p.num_kv_heads + kv_head) * p.head_dim + d];
  }
}

}  // namespace

void RopeAppendKv(float* q, const float* k, const float* v, const DeviceBatch& batch,
                  const LayerBlockTable& table, const KvCacheLayout& layout, int num_heads,
                  float freq_base, cpu::RopeStyle style, float* pool, Stream stream) {
  if (batch.num_tokens <= 0) return;
  HW_CHECK(layout.head_dim > 0 && layout.head_dim % 2 == 0 && layout.head_dim / 2 <= kMaxRopeHalf);
  HW_CHECK(layout.block_size > 0 && num_heads >= 0 && table.num_kv_heads > 0);
  HW_CHECK(layout.dtype == KvCacheDtype::kFloat32);  // f32 blocks only, so far
  HW_CHECK(batch.token_seq != nullptr && batch.positions != nullptr);
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
  p.block_floats = static_cast<long long>(layout.BlockBytes() / sizeof(float));
  p.freq_base = freq_base;
  p.neox = style == cpu::RopeStyle::kNeox;
  RopeAppendKvKernel<<<batch.num_tokens, kRopeThreads, 0, stream>>>(p);
}

}  // namespace headway::cuda
