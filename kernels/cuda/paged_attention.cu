// Paged attention over head-wise discrete blocks on a CUDA device (the
// contract is kernels/cuda/attention.h; the CPU twin is cpu::PagedAttention).
//
// Work split (FlashDecoding, Dao et al. 2023; vLLM paged attention v2). A CTA
// owns a row tile (up to kQVecs query vectors = rows x query heads of one KV
// head's group, all in one sequence), one KV head and one split of the tile's
// key list. It streams the key list through shared memory 16 keys at a time,
// double-buffered with cp.async, so each K/V row is read from memory once
// per CTA and used by every query vector of the tile. Online softmax in f32
// (FlashAttention, Dao et al. 2022). With one split the CTA writes `out`;
// with several it writes (max, sum, unnormalised output) per split and
// MergeSplitsKernel combines them.
//
// The key list of a tile (rows at positions [p_first, p_last]) is the union
// of the blocks its rows see, in order: the sink blocks [0, num_sink_blocks),
// then the window's blocks [window_block, p_last / block_size]. Every listed
// block holds a key some row sees, so it has a block id (the caller's
// invariant); -1 entries sit outside the list and are never loaded. Keys of
// a listed block that no row sees (before the window, past the sink, after
// p_last) are not loaded either: their shared-memory slots are zero, so
// stale or NaN pool contents never reach the sums.
//
// KV cache dtypes (common/kv_layout.h): float32 rows are copied into shared
// memory with cp.async; the 16-, 8- and 4-bit rows are decoded to f32 on the
// way in (kernels/cuda/kv_codec.cuh), so the tile's arithmetic is the same
// for every dtype. q4_0_hadamard rows stay rotated: the CTA rotates its
// query vectors in shared memory and a last kernel rotates the outputs back,
// as the CPU attention does.
//
// Thread layout of the P.V product (128 threads): thread t owns float4
// column t % (head_dim / 4) of query vectors t / (head_dim / 4) + k * stride,
// k < 8, so each thread keeps 8 float4 accumulators in registers.
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "common/status.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_codec.cuh"

namespace headway::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kKeysPerTile = 16;  // keys per shared-memory stage; = lanes per score group
constexpr int kQPerThread = 8;    // float4 accumulators per thread
constexpr int kMaxSplits = 64;
constexpr int kMaxPartialRows = 2048;  // token rows x splits the workspace holds
constexpr int kMinKeysPerSplit = 128;
constexpr int kTargetCtasPerSm = 16;
constexpr int kScanThreads = 256;
constexpr int kMergeThreads = 128;
constexpr float kNegInf = -__builtin_huge_valf();

// Query vectors per CTA for a head_dim: kQPerThread float4s per thread.
constexpr int QVecsFor(int head_dim) { return kQPerThread * kThreads * 4 / head_dim; }

template <int kHeadDim>
struct Tiling {
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head_dim 64/128/256");
  static constexpr int kCols = kHeadDim / 4;  // float4 columns of a head vector
  static constexpr int kQVecs = QVecsFor(kHeadDim);
  static constexpr int kQStride = kThreads / kCols;  // query vectors between a thread's rows
  // Rows padded by one float4: float4 reads of 8 different rows at one
  // column then hit 8 different bank groups.
  static constexpr int kPitch = kHeadDim + 4;
  static constexpr int kStageFloats = kKeysPerTile * kPitch;
  static constexpr int kSmemFloats =
      kQVecs * kPitch + 4 * kStageFloats + kQVecs * kKeysPerTile + 3 * kQVecs;
  static constexpr size_t kSmemBytes = sizeof(float) * kSmemFloats;
  static_assert(kThreads % kCols == 0, "a thread's column must be fixed");
  static_assert(kQStride * kQPerThread == kQVecs, "threads cover every query vector");
  static_assert((2 * kKeysPerTile * kCols) % kThreads == 0, "even stage loads");
  static_assert(kSmemBytes <= 200 * 1024, "fits one SM's shared memory");
};

// How a launch covers the batch; computed on the host from host scalars.
struct Plan {
  int group = 1;            // query heads per KV head
  int heads_per_cta = 1;    // query heads of the group in one CTA
  int num_head_chunks = 1;  // ceil(group / heads_per_cta)
  int rows_per_tile = 1;
  int num_tiles = 0;  // grid.x: an upper bound on the row tiles of the batch
  bool one_tile_per_seq = false;
  int num_splits = 1;
};

struct AttentionParams {
  const float* q;
  const uint8_t* pool;
  const int32_t* query_start;
  const int32_t* start_pos;
  const int32_t* block_ids;
  const SlotSpec* specs;
  const int32_t* tile_start;  // [num_seqs + 1]; unused when one_tile_per_seq
  float* out;
  float* partial_ml;   // [rows * num_heads * splits, 2]
  float* partial_acc;  // [rows * num_heads * splits, head_dim]
  int num_seqs;
  int num_heads;
  int num_kv_heads;
  int max_blocks;
  int block_size;
  long long row_bytes;
  long long block_bytes;
  float scale;
  Plan plan;
};

// The ordered key list of one row tile (see the file comment).
struct KeyList {
  int p_last = 0;
  bool sliding = false;
  int window = 0;
  int sink_end = 0;      // keys [0, sink_end) are sink keys some row sees
  int window_begin = 0;  // first key the first row sees in its window
  int num_sink_blocks = 0;
  int window_block = 0;   // logical block after the sink blocks
  int num_positions = 0;  // list length in keys (whole blocks)
  int block_size = 1;

  __device__ static KeyList Make(SlotSpec spec, int p_first, int p_last, int block_size) {
    KeyList l;
    l.p_last = p_last;
    l.block_size = block_size;
    l.sliding = spec.window > 0;
    l.window = spec.window;
    const int last_block = p_last / block_size;
    if (l.sliding) {
      l.window_begin = max(0, p_first - spec.window + 1);
      l.sink_end = min(max(spec.sink, 0), p_last + 1);
      l.num_sink_blocks = (l.sink_end + block_size - 1) / block_size;
      l.window_block = max(l.window_begin / block_size, l.num_sink_blocks);
    }
    l.num_positions = (l.num_sink_blocks + (last_block - l.window_block + 1)) * block_size;
    return l;
  }
  // Position of the key at index `i` of the list (i < num_positions).
  __device__ int Position(int i) const {
    const int b = i / block_size;
    const int logical = b < num_sink_blocks ? b : window_block + (b - num_sink_blocks);
    return logical * block_size + (i - b * block_size);
  }
  // Whether some row of the tile sees the key at `pos` (what gets loaded).
  __device__ bool AnyRowSees(int pos) const {
    return pos <= p_last && (!sliding || pos < sink_end || pos >= window_begin);
  }
};

// SlotSpec::Sees on the device.
__device__ bool Sees(const SlotSpec& spec, int query_pos, int key_pos) {
  if (key_pos > query_pos) return false;
  if (spec.window <= 0) return true;
  return key_pos > query_pos - spec.window || key_pos < spec.sink;
}

// tile_start[s] = sum over s' < s of ceil(rows of s' / rows_per_tile);
// tile_start[num_seqs] = total. One CTA.
__global__ void __launch_bounds__(kScanThreads)
    TileStartKernel(const int32_t* query_start, int num_seqs, int rows_per_tile,
                    int32_t* tile_start) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  int carry = 0;
  for (int base = 0; base < num_seqs; base += kScanThreads) {
    const int s = base + static_cast<int>(threadIdx.x);
    int tiles = 0;
    if (s < num_seqs) {
      const int rows = max(0, query_start[s + 1] - query_start[s]);
      tiles = (rows + rows_per_tile - 1) / rows_per_tile;
    }
    int prefix = 0, total = 0;
    Scan(temp).ExclusiveSum(tiles, prefix, total);
    if (s < num_seqs) tile_start[s] = carry + prefix;
    carry += total;
    __syncthreads();  // temp is reused by the next round
  }
  if (threadIdx.x == 0) tile_start[num_seqs] = carry;
}

template <int kHeadDim, KvCacheDtype kDtype>
__global__ void __launch_bounds__(kThreads) PagedAttentionKernel(const AttentionParams p) {
  using T = Tiling<kHeadDim>;
  extern __shared__ float4 smem_f4[];
  float* q_s = reinterpret_cast<float*>(smem_f4);  // [kQVecs][kPitch]
  float* k_s = q_s + T::kQVecs * T::kPitch;        // [2][kKeysPerTile][kPitch]
  float* v_s = k_s + 2 * T::kStageFloats;          // [2][kKeysPerTile][kPitch]
  float* p_s = v_s + 2 * T::kStageFloats;          // [kQVecs][kKeysPerTile]
  float* m_s = p_s + T::kQVecs * kKeysPerTile;     // [kQVecs] running max
  float* l_s = m_s + T::kQVecs;                    // [kQVecs] running sum
  float* c_s = l_s + T::kQVecs;                    // [kQVecs] this stage's rescale

  const Plan& plan = p.plan;
  const int tid = static_cast<int>(threadIdx.x);

  // Which sequence and row tile (block-uniform, so early returns are safe).
  int seq = 0;
  int tile_in_seq = 0;
  const int tile = static_cast<int>(blockIdx.x);
  if (plan.one_tile_per_seq) {
    seq = tile;
    if (seq >= p.num_seqs) return;
  } else {
    if (tile >= p.tile_start[p.num_seqs]) return;
    int lo = 0, hi = p.num_seqs - 1;  // the last s with tile_start[s] <= tile
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (p.tile_start[mid] <= tile)
        lo = mid;
      else
        hi = mid - 1;
    }
    seq = lo;
    // Last rows first: they see the most keys, so the longest CTAs start
    // early and the short ones fill the tail of the grid.
    tile_in_seq = p.tile_start[seq + 1] - 1 - tile;
  }
  const int split = static_cast<int>(blockIdx.y) % plan.num_splits;
  const int chunk = static_cast<int>(blockIdx.y) / plan.num_splits;
  const int kv_head = static_cast<int>(blockIdx.z);
  const int row0 = p.query_start[seq];
  const int q_len = p.query_start[seq + 1] - row0;
  const int row_begin = tile_in_seq * plan.rows_per_tile;  // within the sequence
  if (row_begin >= q_len) return;
  const int rows = min(plan.rows_per_tile, q_len - row_begin);
  const int head_begin = chunk * plan.heads_per_cta;  // within the group
  const int heads = min(plan.heads_per_cta, plan.group - head_begin);
  if (heads <= 0) return;
  const int nq = rows * heads;  // query vector qi = r * heads + g
  const int p_first = p.start_pos[seq] + row_begin;
  const int p_last = p_first + rows - 1;
  const SlotSpec spec = p.specs[kv_head];
  const KeyList keys = KeyList::Make(spec, p_first, p_last, p.block_size);
  const int32_t* block_row =
      p.block_ids + (static_cast<size_t>(seq) * p.num_kv_heads + kv_head) * p.max_blocks;
  const int num_stages = (keys.num_positions + kKeysPerTile - 1) / kKeysPerTile;
  const int per_split = (num_stages + plan.num_splits - 1) / plan.num_splits;
  const int stage_begin = min(num_stages, split * per_split);
  const int stage_end = min(num_stages, stage_begin + per_split);

  // Query vectors of the tile, and fresh softmax state.
  for (int idx = tid; idx < nq * T::kCols; idx += kThreads) {
    const int qi = idx / T::kCols;
    const int c = idx - qi * T::kCols;
    const int r = qi / heads;
    const int g = qi - r * heads;
    const size_t row = static_cast<size_t>(row0 + row_begin + r);
    const int head = kv_head * plan.group + head_begin + g;
    const float4* src =
        reinterpret_cast<const float4*>(p.q + (row * p.num_heads + head) * kHeadDim);
    reinterpret_cast<float4*>(q_s + qi * T::kPitch)[c] = src[c];
  }
  if constexpr (kDtype == KvCacheDtype::kQ4_0Hadamard) {
    // Keys are stored rotated: q . k = (Hq / sqrt(32)) . (Hk / sqrt(32)).
    __syncthreads();
    for (int idx = tid; idx < nq * (kHeadDim / 32); idx += kThreads) {
      const int qi = idx / (kHeadDim / 32);
      Hadamard32(q_s + qi * T::kPitch + 32 * (idx - qi * (kHeadDim / 32)));
    }
  }
  for (int i = tid; i < T::kQVecs; i += kThreads) {
    m_s[i] = kNegInf;
    l_s[i] = 0.0f;
    c_s[i] = 1.0f;
  }

  // Enqueues the K and V rows of stage `stage` into buffer `buf`; keys no row
  // sees (or with no block, which the invariant rules out) become zeros.
  auto issue_stage = [&](int stage, int buf) {
    float* k_dst = k_s + buf * T::kStageFloats;
    float* v_dst = v_s + buf * T::kStageFloats;
    for (int idx = tid; idx < 2 * kKeysPerTile * T::kCols; idx += kThreads) {
      const int is_v = idx / (kKeysPerTile * T::kCols);
      const int rem = idx - is_v * (kKeysPerTile * T::kCols);
      const int j = rem / T::kCols;
      const int c = rem - j * T::kCols;
      float* dst = (is_v ? v_dst : k_dst) + j * T::kPitch + c * 4;
      const uint8_t* src = nullptr;  // the key's K or V row
      const int i = stage * kKeysPerTile + j;
      if (i < keys.num_positions) {
        const int pos = keys.Position(i);
        if (keys.AnyRowSees(pos)) {
          const int logical = pos / p.block_size;
          const int32_t block_id = logical < p.max_blocks ? block_row[logical] : -1;
          if (block_id >= 0) {
            const int in_block = pos - logical * p.block_size;
            src = p.pool + static_cast<size_t>(block_id) * static_cast<size_t>(p.block_bytes) +
                  static_cast<size_t>(is_v ? p.block_size + in_block : in_block) *
                      static_cast<size_t>(p.row_bytes);
          }
        }
      }
      if (src == nullptr) {
        *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      } else if constexpr (kDtype == KvCacheDtype::kFloat32) {
        __pipeline_memcpy_async(dst, src + 16 * c, 16);
      } else {
        // Decoded to f32 on the way in (synchronous loads: the next stage's
        // bytes are not in flight during this stage's compute, as f32's are).
        *reinterpret_cast<float4*>(dst) = DecodeKv4<kDtype>(src, c);
      }
    }
    __pipeline_commit();
  };

  const int col = tid % T::kCols;
  const int qbase = tid / T::kCols;
  float4 acc[kQPerThread];
#pragma unroll
  for (int k = 0; k < kQPerThread; ++k) acc[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

  if (stage_begin < stage_end) issue_stage(stage_begin, 0);
  __syncthreads();  // q_s and the softmax state are visible

  for (int stage = stage_begin; stage < stage_end; ++stage) {
    const int buf = (stage - stage_begin) & 1;
    if (stage + 1 < stage_end) {
      issue_stage(stage + 1, buf ^ 1);  // in flight while this stage computes
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();  // every thread's copies of this stage have landed

    // Scores and the online-softmax update: 16 consecutive lanes hold the 16
    // keys of one query vector. All threads run every round (shuffles need
    // full warps); lanes past nq * 16 carry -inf and write nothing.
    const float* k_buf = k_s + buf * T::kStageFloats;
    for (int base = 0; base < nq * kKeysPerTile; base += kThreads) {
      const int pair = base + tid;
      const bool active = pair < nq * kKeysPerTile;
      const int qi = pair / kKeysPerTile;
      const int j = pair - qi * kKeysPerTile;
      float score = kNegInf;
      if (active) {
        const int i = stage * kKeysPerTile + j;
        if (i < keys.num_positions) {
          const int key_pos = keys.Position(i);
          const int query_pos = p_first + qi / heads;
          if (Sees(spec, query_pos, key_pos)) {
            const float4* qv = reinterpret_cast<const float4*>(q_s + qi * T::kPitch);
            const float4* kv = reinterpret_cast<const float4*>(k_buf + j * T::kPitch);
            float dot = 0.0f;
#pragma unroll 8
            for (int c = 0; c < T::kCols; ++c) {
              const float4 a = qv[c];
              const float4 b = kv[c];
              dot = fmaf(a.x, b.x, dot);
              dot = fmaf(a.y, b.y, dot);
              dot = fmaf(a.z, b.z, dot);
              dot = fmaf(a.w, b.w, dot);
            }
            score = dot * p.scale;
          }
        }
      }
      float stage_max = score;
#pragma unroll
      for (int offset = kKeysPerTile / 2; offset > 0; offset /= 2) {
        stage_max = fmaxf(stage_max, __shfl_xor_sync(0xffffffffu, stage_max, offset));
      }
      const float m_old = active ? m_s[qi] : kNegInf;
      const float m_new = fmaxf(m_old, stage_max);
      const float e = (m_new == kNegInf) ? 0.0f : expf(score - m_new);  // -inf scores -> 0
      float stage_sum = e;
#pragma unroll
      for (int offset = kKeysPerTile / 2; offset > 0; offset /= 2) {
        stage_sum += __shfl_xor_sync(0xffffffffu, stage_sum, offset);
      }
      __syncwarp();  // every lane has read m_s[qi] before lane j == 0 rewrites it
      if (active) {
        p_s[qi * kKeysPerTile + j] = e;
        if (j == 0) {
          const float correction = (m_new == kNegInf) ? 1.0f : expf(m_old - m_new);
          m_s[qi] = m_new;
          l_s[qi] = l_s[qi] * correction + stage_sum;
          c_s[qi] = correction;
        }
      }
    }
    __syncthreads();  // p_s and c_s are complete

    const float* v_buf = v_s + buf * T::kStageFloats;
#pragma unroll
    for (int k = 0; k < kQPerThread; ++k) {
      const int qi = qbase + k * T::kQStride;
      if (qi < nq) {
        const float correction = c_s[qi];
        acc[k].x *= correction;
        acc[k].y *= correction;
        acc[k].z *= correction;
        acc[k].w *= correction;
      }
    }
#pragma unroll 4
    for (int j = 0; j < kKeysPerTile; ++j) {
      const float4 vv = reinterpret_cast<const float4*>(v_buf + j * T::kPitch)[col];
#pragma unroll
      for (int k = 0; k < kQPerThread; ++k) {
        const int qi = qbase + k * T::kQStride;
        if (qi < nq) {
          const float pj = p_s[qi * kKeysPerTile + j];
          acc[k].x = fmaf(pj, vv.x, acc[k].x);
          acc[k].y = fmaf(pj, vv.y, acc[k].y);
          acc[k].z = fmaf(pj, vv.z, acc[k].z);
          acc[k].w = fmaf(pj, vv.w, acc[k].w);
        }
      }
    }
    __syncthreads();  // buffers and p_s are free for the next stage
  }

  const int num_splits = plan.num_splits;
#pragma unroll
  for (int k = 0; k < kQPerThread; ++k) {
    const int qi = qbase + k * T::kQStride;
    if (qi >= nq) continue;
    const int r = qi / heads;
    const int g = qi - r * heads;
    const size_t row = static_cast<size_t>(row0 + row_begin + r);
    const size_t row_head = row * p.num_heads + kv_head * plan.group + head_begin + g;
    if (num_splits == 1) {
      const float l = l_s[qi];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      reinterpret_cast<float4*>(p.out + row_head * kHeadDim)[col] =
          make_float4(acc[k].x * inv, acc[k].y * inv, acc[k].z * inv, acc[k].w * inv);
    } else {
      const size_t slot = row_head * num_splits + split;
      reinterpret_cast<float4*>(p.partial_acc + slot * kHeadDim)[col] = acc[k];
      if (col == 0) {
        p.partial_ml[2 * slot] = m_s[qi];
        p.partial_ml[2 * slot + 1] = l_s[qi];
      }
    }
  }
}

// out[row_head] = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s over the
// splits of one (row, query head), M = max_s m_s; empty splits (m = -inf)
// weigh nothing. One warp per (row, query head).
template <int kHeadDim>
__global__ void __launch_bounds__(kMergeThreads)
    MergeSplitsKernel(const float* partial_ml, const float* partial_acc, long long num_row_heads,
                      int num_splits, float* out) {
  constexpr int kPerLane = kHeadDim / 32;
  const long long row_head =
      (static_cast<long long>(blockIdx.x) * kMergeThreads + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (row_head >= num_row_heads) return;
  const float* ml = partial_ml + row_head * num_splits * 2;
  float m_max = kNegInf;
  for (int s = 0; s < num_splits; ++s) m_max = fmaxf(m_max, ml[2 * s]);
  float sum[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) sum[i] = 0.0f;
  float denom = 0.0f;
  if (m_max != kNegInf) {
    for (int s = 0; s < num_splits; ++s) {
      const float m = ml[2 * s];
      if (m == kNegInf) continue;
      const float w = expf(m - m_max);
      denom += w * ml[2 * s + 1];
      const float* a = partial_acc + (row_head * num_splits + s) * kHeadDim;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) sum[i] = fmaf(w, a[lane + 32 * i], sum[i]);
    }
  }
  const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
  float* o = out + row_head * kHeadDim;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) o[lane + 32 * i] = sum[i] * inv;
}

// Rotates each group of 32 values of x [num_groups * 32] back (the
// Hadamard transform over sqrt(32) is its own inverse): the outputs of
// attention over q4_0_hadamard values. One thread per group.
__global__ void __launch_bounds__(kMergeThreads)
    Hadamard32GroupsKernel(float* x, long long num_groups) {
  const long long g = static_cast<long long>(blockIdx.x) * kMergeThreads + threadIdx.x;
  if (g >= num_groups) return;
  float v[32];
  float4* src = reinterpret_cast<float4*>(x + g * 32);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float4 f = src[i];
    v[4 * i] = f.x;
    v[4 * i + 1] = f.y;
    v[4 * i + 2] = f.z;
    v[4 * i + 3] = f.w;
  }
  Hadamard32(v);
#pragma unroll
  for (int i = 0; i < 8; ++i) src[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}

size_t RoundUp256(size_t bytes) { return (bytes + 255) / 256 * 256; }

size_t TileStartBytes(int max_tokens) { return RoundUp256(sizeof(int32_t) * (max_tokens + 1)); }

// Token-row splits the workspace of `max_tokens` rows holds.
size_t PartialRowCap(int max_tokens) {
  return std::min<size_t>(static_cast<size_t>(max_tokens) * kMaxSplits, kMaxPartialRows);
}

// Per-device facts asked once per process, not per layer of every step.
constexpr int kMaxDevices = 64;

int CurrentDevice() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    cudaGetLastError();  // not sticky; the launch that follows reports real trouble
    return 0;
  }
  return device;
}

int NumSms() {
  static std::atomic<int> cached[kMaxDevices] = {};
  const int device = CurrentDevice();
  int num_sms = cached[device].load(std::memory_order_relaxed);
  if (num_sms > 0) return num_sms;
  if (cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      num_sms <= 0) {
    cudaGetLastError();
    return 132;  // H100 / H200
  }
  cached[device].store(num_sms, std::memory_order_relaxed);
  return num_sms;
}

Plan MakePlan(const DeviceBatch& batch, int num_heads, int num_kv_heads, int head_dim) {
  HW_CHECK(num_kv_heads > 0 && num_heads > 0 && num_heads % num_kv_heads == 0);
  HW_CHECK(head_dim == 64 || head_dim == 128 || head_dim == 256);
  HW_CHECK(batch.num_seqs >= 0 && batch.num_seqs <= batch.num_tokens);
  Plan plan;
  const int q_vecs = QVecsFor(head_dim);
  plan.group = num_heads / num_kv_heads;
  plan.heads_per_cta = std::min(plan.group, q_vecs);
  plan.num_head_chunks = (plan.group + plan.heads_per_cta - 1) / plan.heads_per_cta;
  plan.rows_per_tile = std::max(1, q_vecs / plan.heads_per_cta);
  // Every sequence has >= 1 row, so equal counts mean one row each.
  plan.one_tile_per_seq = batch.num_tokens == batch.num_seqs;
  // sum_s ceil(rows_s / R) <= num_seqs + (num_tokens - num_seqs) / R.
  plan.num_tiles = plan.one_tile_per_seq
                       ? batch.num_seqs
                       : batch.num_seqs + (batch.num_tokens - batch.num_seqs) / plan.rows_per_tile;
  const long long base_ctas =
      std::max(1LL, static_cast<long long>(plan.num_tiles) * plan.num_head_chunks * num_kv_heads);
  const long long want =
      (static_cast<long long>(kTargetCtasPerSm) * NumSms() + base_ctas - 1) / base_ctas;
  const long long by_context =
      (std::max(batch.max_context_len, 1) + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  const long long by_workspace =
      static_cast<long long>(PartialRowCap(batch.num_tokens)) / std::max(batch.num_tokens, 1);
  const long long splits =
      std::min({want, by_context, by_workspace, static_cast<long long>(kMaxSplits)});
  plan.num_splits = splits >= 2 ? static_cast<int>(splits) : 1;
  return plan;
}

template <int kHeadDim, KvCacheDtype kDtype>
void Launch(const AttentionParams& params, Stream stream) {
  using T = Tiling<kHeadDim>;
  const Plan& plan = params.plan;
  // Above 48 KiB of dynamic shared memory a kernel must opt in, once per
  // device; a failure here makes the launch below fail, which the caller's
  // check reports.
  static std::atomic<bool> opted_in[kMaxDevices] = {};
  const int device = CurrentDevice();
  if (!opted_in[device].load(std::memory_order_acquire)) {
    if (cudaFuncSetAttribute(PagedAttentionKernel<kHeadDim, kDtype>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(T::kSmemBytes)) == cudaSuccess) {
      opted_in[device].store(true, std::memory_order_release);
    }
  }
  const dim3 grid(static_cast<unsigned>(plan.num_tiles),
                  static_cast<unsigned>(plan.num_splits * plan.num_head_chunks),
                  static_cast<unsigned>(params.num_kv_heads));
  PagedAttentionKernel<kHeadDim, kDtype><<<grid, kThreads, T::kSmemBytes, stream>>>(params);
}

}  // namespace

size_t PagedAttentionWorkspaceBytes(int max_tokens, int num_heads, int head_dim) {
  HW_CHECK(max_tokens >= 0 && num_heads >= 0 && head_dim >= 0);
  const size_t cap = PartialRowCap(max_tokens) * static_cast<size_t>(num_heads);
  return TileStartBytes(max_tokens) + RoundUp256(cap * 2 * sizeof(float)) +
         RoundUp256(cap * static_cast<size_t>(head_dim) * sizeof(float));
}

int PagedAttentionSplits(const DeviceBatch& batch, int num_heads, int num_kv_heads, int head_dim) {
  if (batch.num_tokens <= 0) return 1;
  return MakePlan(batch, num_heads, num_kv_heads, head_dim).num_splits;
}

void PagedAttention(const float* q, const uint8_t* pool, const DeviceBatch& batch,
                    const LayerBlockTable& table, const SlotSpec* specs,
                    const KvCacheLayout& layout, int num_heads, float scale, void* workspace,
                    float* out, Stream stream) {
  if (batch.num_tokens <= 0 || batch.num_seqs <= 0) return;
  const int head_dim = layout.head_dim;
  const Plan plan = MakePlan(batch, num_heads, table.num_kv_heads, head_dim);
  HW_CHECK(layout.block_size > 0 && table.max_blocks >= 0 && layout.Check().empty());
  HW_CHECK(static_cast<size_t>(KvRowBytes(layout.dtype, head_dim)) == layout.RowBytes());
  HW_CHECK(plan.num_splits * plan.num_head_chunks <= 65535 && table.num_kv_heads <= 65535);
  for (const void* ptr : {static_cast<const void*>(q), static_cast<const void*>(pool),
                          static_cast<const void*>(out), static_cast<const void*>(workspace)}) {
    HW_CHECK(ptr != nullptr && reinterpret_cast<uintptr_t>(ptr) % 16 == 0);
  }

  // Workspace laid out for this batch's num_tokens (never more than the
  // caller's PagedAttentionWorkspaceBytes(max_tokens, ...) holds).
  char* ws = static_cast<char*>(workspace);
  int32_t* tile_start = reinterpret_cast<int32_t*>(ws);
  const size_t cap = PartialRowCap(batch.num_tokens) * static_cast<size_t>(num_heads);
  float* partial_ml = reinterpret_cast<float*>(ws + TileStartBytes(batch.num_tokens));
  float* partial_acc = reinterpret_cast<float*>(ws + TileStartBytes(batch.num_tokens) +
                                                RoundUp256(cap * 2 * sizeof(float)));
  HW_CHECK(plan.num_splits == 1 || static_cast<size_t>(batch.num_tokens) * plan.num_splits <=
                                       PartialRowCap(batch.num_tokens));

  AttentionParams params;
  params.q = q;
  params.pool = pool;
  params.query_start = batch.query_start;
  params.start_pos = batch.start_pos;
  params.block_ids = table.block_ids;
  params.specs = specs;
  params.tile_start = plan.one_tile_per_seq ? nullptr : tile_start;
  params.out = out;
  params.partial_ml = partial_ml;
  params.partial_acc = partial_acc;
  params.num_seqs = batch.num_seqs;
  params.num_heads = num_heads;
  params.num_kv_heads = table.num_kv_heads;
  params.max_blocks = table.max_blocks;
  params.block_size = layout.block_size;
  params.row_bytes = static_cast<long long>(layout.RowBytes());
  params.block_bytes = static_cast<long long>(layout.BlockBytes());
  params.scale = scale;
  params.plan = plan;

  if (!plan.one_tile_per_seq) {
    TileStartKernel<<<1, kScanThreads, 0, stream>>>(batch.query_start, batch.num_seqs,
                                                    plan.rows_per_tile, tile_start);
  }
  DispatchKvDtype(layout.dtype, [&](auto dtype) {
    constexpr KvCacheDtype kDtype = decltype(dtype)::value;
    switch (head_dim) {
      case 64:
        Launch<64, kDtype>(params, stream);
        break;
      case 128:
        Launch<128, kDtype>(params, stream);
        break;
      default:
        Launch<256, kDtype>(params, stream);
        break;
    }
  });
  if (plan.num_splits > 1) {
    const long long num_row_heads = static_cast<long long>(batch.num_tokens) * num_heads;
    const long long warps_per_cta = kMergeThreads / 32;
    const unsigned merge_ctas =
        static_cast<unsigned>((num_row_heads + warps_per_cta - 1) / warps_per_cta);
    switch (head_dim) {
      case 64:
        MergeSplitsKernel<64><<<merge_ctas, kMergeThreads, 0, stream>>>(
            partial_ml, partial_acc, num_row_heads, plan.num_splits, out);
        break;
      case 128:
        MergeSplitsKernel<128><<<merge_ctas, kMergeThreads, 0, stream>>>(
            partial_ml, partial_acc, num_row_heads, plan.num_splits, out);
        break;
      default:
        MergeSplitsKernel<256><<<merge_ctas, kMergeThreads, 0, stream>>>(
            partial_ml, partial_acc, num_row_heads, plan.num_splits, out);
        break;
    }
  }
  if (KvCacheDtypeIsRotated(layout.dtype)) {
    const long long num_groups = static_cast<long long>(batch.num_tokens) * num_heads * head_dim / 32;
    const unsigned ctas = static_cast<unsigned>((num_groups + kMergeThreads - 1) / kMergeThreads);
    Hadamard32GroupsKernel<<<ctas, kMergeThreads, 0, stream>>>(out, num_groups);
  }
}

}  // namespace headway::cuda
