// append_kv and paged attention over head-wise blocks, CPU backend.
//
// Work is split into items of (token row, KV head): one item computes every
// query head of the KV head's group, so the group shares each K/V row while it
// is in L1. Items are dealt out to threads in strides (PagedAttention), because
// later rows of a prefill chunk see more keys than earlier ones.
#include "kernels/attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/status.h"
#include "kernels/threads.h"

namespace headway::cpu {
namespace {

// Strides PagedAttention deals items out in.
constexpr int64_t kLanes = 64;

// The sequence of each token row, so an item finds its sequence in O(1).
std::vector<int32_t> SeqOfRows(const BatchLayout& batch) {
  std::vector<int32_t> seq_of_row(batch.num_tokens());
  for (int s = 0; s < batch.num_seqs; ++s) {
    for (int r = batch.query_start[s]; r < batch.query_start[s + 1]; ++r) seq_of_row[r] = s;
  }
  return seq_of_row;
}

// Position ranges a query at `pos` sees under `spec`: the sink [0, sink_end)
// and the window [window_begin, pos]. Either may be empty; they never overlap.
struct VisibleRanges {
  int64_t sink_end = 0;
  int64_t window_begin = 0;
};

VisibleRanges RangesFor(const SlotSpec& spec, int64_t pos) {
  VisibleRanges r;
  if (!spec.IsSliding()) return r;  // window [0, pos]
  r.window_begin = std::max<int64_t>(0, pos - spec.window + 1);
  if (spec.sink >= r.window_begin) {
    r.window_begin = 0;  // the sink reaches the window: one range
  } else {
    r.sink_end = spec.sink;
  }
  return r;
}

// e^x for x <= 0 in f32, written so that the compiler vectorises it (std::exp
// does not): Cephes expf (range reduction by ln 2, degree-6 polynomial),
// relative error below 1e-7 on [-87, 0]; smaller x gives about 1e-38, as
// good as zero next to the e^0 = 1 term every softmax row holds.
inline float ExpNonPositive(float x) {
  x = std::max(x, -87.0f);
  const float n = std::floor(x * 1.44269504f + 0.5f);
  const float r = x - n * 0.693359375f - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float mantissa = p * r * r + r + 1.0f;
  return mantissa * std::bit_cast<float>((int32_t(n) + 127) << 23);
}

// Online-softmax state of the query heads of one item (FlashAttention,
// Dao et al. 2022): running max, running denominator, unnormalised output.
class GroupAccumulator {
 public:
  GroupAccumulator(int group, int head_dim, int block_size)
      : group_(group), head_dim_(head_dim), max_(group), denom_(group),
        acc_(size_t(group) * head_dim), scores_(block_size) {}

  void Reset() {
    std::fill(max_.begin(), max_.end(), -std::numeric_limits<float>::infinity());
    std::fill(denom_.begin(), denom_.end(), 0.0f);
    std::fill(acc_.begin(), acc_.end(), 0.0f);
  }

  // Folds in `n` consecutive keys/values (rows of head_dim floats, n <= block_size).
  void Add(const float* q, float scale, const float* k, const float* v, int n) {
    // A compile-time head_dim lets the compiler unroll the head_dim loops fully.
    switch (head_dim_) {
      case 64: return AddKeys<64>(q, scale, k, v, n);
      case 128: return AddKeys<128>(q, scale, k, v, n);
      case 256: return AddKeys<256>(q, scale, k, v, n);
      default: return AddKeys<0>(q, scale, k, v, n);
    }
  }

  void Write(float* out) const {
    for (int g = 0; g < group_; ++g) {
      const float inv = 1.0f / denom_[g];
      const float* acc = acc_.data() + size_t(g) * head_dim_;
      float* o = out + size_t(g) * head_dim_;
#pragma omp simd
      for (int d = 0; d < head_dim_; ++d) o[d] = acc[d] * inv;
    }
  }

 private:
  // kHeadDim == 0: head_dim_ known only at run time.
  template <int kHeadDim>
  void AddKeys(const float* q, float scale, const float* k, const float* v, int n) {
    const int hd = kHeadDim > 0 ? kHeadDim : head_dim_;
    float* scores = scores_.data();
    for (int g = 0; g < group_; ++g) {
      const float* qg = q + size_t(g) * hd;
      for (int j = 0; j < n; ++j) {
        const float* kj = k + size_t(j) * hd;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int d = 0; d < hd; ++d) dot += qg[d] * kj[d];
        scores[j] = dot * scale;
      }
      float block_max = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < n; ++j) block_max = std::max(block_max, scores[j]);
      float* acc = acc_.data() + size_t(g) * hd;
      const float new_max = std::max(max_[g], block_max);
      if (new_max > max_[g]) {
        const float correction = std::exp(max_[g] - new_max);  // 0 on the first keys
        denom_[g] *= correction;
#pragma omp simd
        for (int d = 0; d < hd; ++d) acc[d] *= correction;
        max_[g] = new_max;
      }
      float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
      for (int j = 0; j < n; ++j) {
        scores[j] = ExpNonPositive(scores[j] - new_max);
        block_sum += scores[j];
      }
      denom_[g] += block_sum;
      if constexpr (kHeadDim > 0) {
        // A local copy the compiler can keep in registers across keys.
        float local[kHeadDim];
        std::copy_n(acc, kHeadDim, local);
        for (int j = 0; j < n; ++j) {
          const float p = scores[j];
          const float* vj = v + size_t(j) * kHeadDim;
#pragma omp simd
          for (int d = 0; d < kHeadDim; ++d) local[d] += p * vj[d];
        }
        std::copy_n(local, kHeadDim, acc);
      } else {
        for (int j = 0; j < n; ++j) {
          const float p = scores[j];
          const float* vj = v + size_t(j) * hd;
#pragma omp simd
          for (int d = 0; d < hd; ++d) acc[d] += p * vj[d];
        }
      }
    }
  }

  const int group_;
  const int head_dim_;
  std::vector<float> max_;     // [group]
  std::vector<float> denom_;   // [group]
  std::vector<float> acc_;     // [group, head_dim]
  std::vector<float> scores_;  // [block_size]
};

// Folds keys [begin, end) of one slot into `acc`, block by block. Only blocks
// that hold a key of the range are looked up.
void AddRange(GroupAccumulator& acc, const float* q, float scale, const float* pool,
              const int32_t* block_row, int max_blocks, const KvCacheLayout& layout,
              int64_t begin, int64_t end) {
  const int bs = layout.block_size;
  for (int64_t key = begin; key < end;) {
    const int64_t logical = key / bs;
    const int in_block = int(key - logical * bs);
    const int n = int(std::min<int64_t>(end - key, bs - in_block));
    HW_CHECK(logical < max_blocks);
    const int32_t block_id = block_row[logical];
    HW_CHECK(block_id >= 0);  // a visible position must have a block
    const float* block = pool + size_t(block_id) * layout.BlockFloats();
    acc.Add(q, scale, block + layout.KOffset(in_block), block + layout.VOffset(in_block), n);
    key += n;
  }
}

}  // namespace

void AppendKv(const float* k, const float* v, const BatchLayout& batch,
              const LayerBlockTable& table, const KvCacheLayout& layout, float* pool) {
  const int n_tokens = batch.num_tokens();
  const int num_kv_heads = table.num_kv_heads;
  const int hd = layout.head_dim;
  const std::vector<int32_t> seq_of_row = SeqOfRows(batch);
  const int64_t n_items = int64_t(n_tokens) * num_kv_heads;
  ParallelFor(n_items, 128, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int row = int(item / num_kv_heads);
      const int h = int(item % num_kv_heads);
      const int s = seq_of_row[row];
      const int64_t pos = int64_t(batch.start_pos[s]) + (row - batch.query_start[s]);
      const int64_t logical = pos / layout.block_size;
      const int in_block = int(pos - logical * layout.block_size);
      HW_CHECK(logical < table.max_blocks);
      const int32_t block_id = table.Row(s, h)[logical];
      HW_CHECK(block_id >= 0);
      float* block = pool + size_t(block_id) * layout.BlockFloats();
      const size_t src = (size_t(row) * num_kv_heads + h) * hd;
      std::memcpy(block + layout.KOffset(in_block), k + src, sizeof(float) * hd);
      std::memcpy(block + layout.VOffset(in_block), v + src, sizeof(float) * hd);
    }
  });
}

void PagedAttention(const float* q, const float* pool, const BatchLayout& batch,
                    const LayerBlockTable& table, const SlotSpec* specs,
                    const KvCacheLayout& layout, int num_heads, float scale, float* out) {
  const int n_tokens = batch.num_tokens();
  const int num_kv_heads = table.num_kv_heads;
  HW_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0);
  const int group = num_heads / num_kv_heads;
  const int hd = layout.head_dim;
  const std::vector<int32_t> seq_of_row = SeqOfRows(batch);
  const int64_t n_items = int64_t(n_tokens) * num_kv_heads;
  // Rows of a prefill chunk see more keys the later they are: item lane L
  // computes items L, L + kLanes, ..., so that every lane gets early and
  // late rows alike and the threads finish together.
  const int64_t lanes = std::min<int64_t>(n_items, kLanes);
  ParallelFor(lanes, 1, [&](int64_t lane_begin, int64_t lane_end) {
    GroupAccumulator acc(group, hd, layout.block_size);
    for (int64_t lane = lane_begin; lane < lane_end; ++lane) {
      for (int64_t item = lane; item < n_items; item += lanes) {
        const int row = int(item / num_kv_heads);
        const int h = int(item % num_kv_heads);
        const int s = seq_of_row[row];
        const int64_t pos = int64_t(batch.start_pos[s]) + (row - batch.query_start[s]);
        const VisibleRanges ranges = RangesFor(specs[h], pos);
        // Query heads [h * group, (h + 1) * group) are contiguous in q and out.
        const size_t head_offset = (size_t(row) * num_heads + size_t(h) * group) * hd;
        const int32_t* block_row = table.Row(s, h);
        acc.Reset();
        AddRange(acc, q + head_offset, scale, pool, block_row, table.max_blocks, layout, 0,
                 ranges.sink_end);
        AddRange(acc, q + head_offset, scale, pool, block_row, table.max_blocks, layout,
                 ranges.window_begin, pos + 1);
        acc.Write(out + head_offset);
      }
    }
  });
}

}  // namespace headway::cpu
