// append_kv and paged attention over head-wise blocks, CPU backend (AVX2).
//
// Blocks in a 16-, 8- or 4-bit KV cache dtype are decoded to f32, a block's
// keys and values at a time, and go through the f32 code from there: a row
// gets exactly the output the f32 kernel gives it over the decoded values.
//
// Attention works on tiles: up to kTileRows consecutive query rows of one
// sequence with every query head of one KV head, so the tile's query
// vectors share each K/V row while it is in L1. Tiles are dealt out to
// threads in strides (PagedAttention), because later rows of a prefill chunk
// see more keys than earlier ones.
#include "kernels/attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <immintrin.h>

#include "common/status.h"
#include "kernels/cpu/exp_avx2.h"
#include "kernels/cpu/kv_codec.h"
#include "kernels/threads.h"

namespace headway::cpu {
namespace {

// Query rows of one sequence in a tile. With the query heads of one KV
// head's group they give up to kTileRows * group query vectors, which share
// every K and V row the tile loads.
constexpr int kTileRows = 4;

// Strides PagedAttention deals tiles out in.
constexpr int64_t kLanes = 64;

// The sequence of each token row, so an item finds its sequence in O(1).
std::vector<int32_t> SeqOfRows(const BatchLayout& batch) {
  std::vector<int32_t> seq_of_row(batch.num_tokens());
  for (int s = 0; s < batch.num_seqs; ++s) {
    for (int r = batch.query_start[s]; r < batch.query_start[s + 1]; ++r) seq_of_row[r] = s;
  }
  return seq_of_row;
}

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// e^x for x <= 0 in f32: Cephes expf (range reduction by ln 2, degree-6
// polynomial), relative error below 1e-7 on [-87, 0]; smaller x gives about
// 1e-38, as good as zero next to the e^0 = 1 term every softmax row holds.
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

// Lane t of the result is the sum of v_t's 8 lanes, added as
// ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)) whatever t is.
inline __m256 LaneSums(__m256 v0, __m256 v1, __m256 v2, __m256 v3, __m256 v4, __m256 v5,
                       __m256 v6, __m256 v7) {
  const __m256 g0 = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
  const __m256 g1 = _mm256_hadd_ps(_mm256_hadd_ps(v4, v5), _mm256_hadd_ps(v6, v7));
  // g0 = [sum of lanes 0-3 of v0..v3, sum of lanes 4-7 of v0..v3]; g1 for v4..v7.
  return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}

// The scores of query vectors qa and qb against keys k[0..3] (rows of
// head_dim floats): sa[j] = scale * (qa . k[j]), sb[j] likewise.
// Every score, here and in ScoresOne8, is computed the same way: lane l of
// an accumulator sums dimensions l, l + 8, ... in order, then LaneSums adds
// the lanes. So a score's bits do not depend on which rows and keys share
// its tile, and a row gets the same output in a prefill chunk as in decode.
inline void ScoresPair4(const float* qa, const float* qb, const float* const* k, int hd,
                        __m256 scale, float* sa, float* sb) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  for (int d = 0; d < hd; d += 8) {
    const __m256 x = _mm256_loadu_ps(qa + d), y = _mm256_loadu_ps(qb + d);
    const __m256 k0 = _mm256_loadu_ps(k[0] + d), k1 = _mm256_loadu_ps(k[1] + d);
    const __m256 k2 = _mm256_loadu_ps(k[2] + d), k3 = _mm256_loadu_ps(k[3] + d);
    a0 = _mm256_fmadd_ps(x, k0, a0);
    a1 = _mm256_fmadd_ps(x, k1, a1);
    a2 = _mm256_fmadd_ps(x, k2, a2);
    a3 = _mm256_fmadd_ps(x, k3, a3);
    b0 = _mm256_fmadd_ps(y, k0, b0);
    b1 = _mm256_fmadd_ps(y, k1, b1);
    b2 = _mm256_fmadd_ps(y, k2, b2);
    b3 = _mm256_fmadd_ps(y, k3, b3);
  }
  const __m256 s = _mm256_mul_ps(LaneSums(a0, a1, a2, a3, b0, b1, b2, b3), scale);
  _mm_storeu_ps(sa, _mm256_castps256_ps128(s));
  _mm_storeu_ps(sb, _mm256_extractf128_ps(s, 1));
}

// s[j] = scale * (q . k[j]) for keys k[0..7], as ScoresPair4 computes them.
inline void ScoresOne8(const float* q, const float* const* k, int hd, __m256 scale, float* s) {
  __m256 a[8];
  for (__m256& x : a) x = _mm256_setzero_ps();
  for (int d = 0; d < hd; d += 8) {
    const __m256 x = _mm256_loadu_ps(q + d);
    for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[j] + d), a[j]);
  }
  _mm256_storeu_ps(s, _mm256_mul_ps(LaneSums(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]),
                                    scale));
}

// acc[d] += p[j] * v[j][d] for keys j = 0..n-1 in order, for two query
// vectors that share each V load; AccumulateOne does the same for one, with
// the same roundings. v: [n, hd] rows; acc: [hd].
inline void AccumulatePair(const float* pa, const float* pb, const float* v, int n, int hd,
                           float* acc_a, float* acc_b) {
  int d = 0;
  for (; d + 32 <= hd; d += 32) {
    __m256 a[4], b[4];
    for (int c = 0; c < 4; ++c) {
      a[c] = _mm256_loadu_ps(acc_a + d + 8 * c);
      b[c] = _mm256_loadu_ps(acc_b + d + 8 * c);
    }
    for (int j = 0; j < n; ++j) {
      const float* vj = v + size_t(j) * hd + d;
      const __m256 x = _mm256_set1_ps(pa[j]), y = _mm256_set1_ps(pb[j]);
      for (int c = 0; c < 4; ++c) {
        const __m256 vv = _mm256_loadu_ps(vj + 8 * c);
        a[c] = _mm256_fmadd_ps(x, vv, a[c]);
        b[c] = _mm256_fmadd_ps(y, vv, b[c]);
      }
    }
    for (int c = 0; c < 4; ++c) {
      _mm256_storeu_ps(acc_a + d + 8 * c, a[c]);
      _mm256_storeu_ps(acc_b + d + 8 * c, b[c]);
    }
  }
  for (; d < hd; d += 8) {
    __m256 a = _mm256_loadu_ps(acc_a + d), b = _mm256_loadu_ps(acc_b + d);
    for (int j = 0; j < n; ++j) {
      const __m256 vv = _mm256_loadu_ps(v + size_t(j) * hd + d);
      a = _mm256_fmadd_ps(_mm256_set1_ps(pa[j]), vv, a);
      b = _mm256_fmadd_ps(_mm256_set1_ps(pb[j]), vv, b);
    }
    _mm256_storeu_ps(acc_a + d, a);
    _mm256_storeu_ps(acc_b + d, b);
  }
}

inline void AccumulateOne(const float* p, const float* v, int n, int hd, float* acc) {
  int d = 0;
  for (; d + 64 <= hd; d += 64) {
    __m256 a[8];
    for (int c = 0; c < 8; ++c) a[c] = _mm256_loadu_ps(acc + d + 8 * c);
    for (int j = 0; j < n; ++j) {
      const float* vj = v + size_t(j) * hd + d;
      const __m256 x = _mm256_set1_ps(p[j]);
      for (int c = 0; c < 8; ++c) a[c] = _mm256_fmadd_ps(x, _mm256_loadu_ps(vj + 8 * c), a[c]);
    }
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(acc + d + 8 * c, a[c]);
  }
  for (; d < hd; d += 8) {
    __m256 a = _mm256_loadu_ps(acc + d);
    for (int j = 0; j < n; ++j) {
      a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + size_t(j) * hd + d), a);
    }
    _mm256_storeu_ps(acc + d, a);
  }
}

// Attention of one tile: consecutive query rows of one sequence, every query
// head of one KV head, with an online softmax (FlashAttention, Dao et al.
// 2022) over the slot's blocks in key order.
//
// Why a row's output does not depend on its tile: keys are taken a whole
// block at a time ([block start, min(block end, last row + 1))) for every
// row, and a key a row does not see gets probability exactly 0, which
// leaves its sums unchanged (x + 0 * v = x); a block it sees nothing of
// leaves its running max unchanged, and the rescale is skipped, as it is
// whenever the max does not grow. Each score and each sum is computed in a
// fixed order (ScoresPair4, AccumulatePair), so decode and prefill, and any
// chunking, give a row the same bits.
class TileAttention {
 public:
  TileAttention(int group, int head_dim, int block_size)
      : group_(group),
        hd_(head_dim),
        bs_(block_size),
        bs_padded_((block_size + 7) / 8 * 8),
        max_(size_t(kTileRows) * group),
        denom_(max_.size()),
        acc_(max_.size() * head_dim),
        scores_(max_.size() * bs_padded_),
        decoded_k_(size_t(block_size) * head_dim),
        decoded_v_(size_t(block_size) * head_dim),
        zero_row_(head_dim, 0.0f),
        q_(max_.size()) {}

  // Query rows [0, rows) of the tile are at positions pos0, pos0 + 1, ...;
  // query vector i = r * group + g is q_rows + r * row_stride + g * hd
  // (floats), and its output goes to the same offset from out_rows.
  void Run(const float* q_rows, float* out_rows, size_t row_stride, int rows, int64_t pos0,
           const SlotSpec& spec, const uint8_t* pool, const int32_t* block_row, int max_blocks,
           const KvCacheLayout& layout, float scale) {
    const int nq = rows * group_;
    std::fill_n(max_.begin(), nq, kMinusInf);
    std::fill_n(denom_.begin(), nq, 0.0f);
    std::fill_n(acc_.begin(), size_t(nq) * hd_, 0.0f);
    for (int i = 0; i < nq; ++i) q_[i] = q_rows + (i / group_) * row_stride + (i % group_) * hd_;

    // The keys some row sees: the sink [0, sink_end) and [window_begin, pos_last].
    const int64_t pos_last = pos0 + rows - 1;
    int64_t window_begin = 0, sink_end = 0;
    if (spec.IsSliding()) {
      window_begin = std::max<int64_t>(0, pos0 - spec.window + 1);
      sink_end = spec.sink;
      if (sink_end >= window_begin) window_begin = sink_end = 0;  // one range
    }
    const int64_t first_window_block = window_begin / bs_;
    const int64_t sink_blocks = std::min((sink_end + bs_ - 1) / bs_, first_window_block);
    const BlockArgs args{pos0, pos_last, rows, &spec, pool, block_row, max_blocks, &layout, scale};
    for (int64_t b = 0; b < sink_blocks; ++b) AddBlock(b, args);
    for (int64_t b = first_window_block; b * bs_ <= pos_last; ++b) AddBlock(b, args);

    for (int i = 0; i < nq; ++i) {
      const float inv = 1.0f / denom_[i];
      const float* acc = acc_.data() + size_t(i) * hd_;
      float* o = out_rows + (i / group_) * row_stride + (i % group_) * hd_;
      for (int d = 0; d < hd_; ++d) o[d] = acc[d] * inv;
    }
  }

 private:
  // What every block of one Run shares.
  struct BlockArgs {
    int64_t pos0, pos_last;
    int rows;
    const SlotSpec* spec;
    const uint8_t* pool;
    const int32_t* block_row;
    int max_blocks;
    const KvCacheLayout* layout;
    float scale;
  };

  // Folds the keys of logical block b that the tile's rows see into their
  // running max, denominator and output.
  void AddBlock(int64_t b, const BlockArgs& args) {
    const auto [pos0, pos_last, rows, spec_ptr, pool, block_row, max_blocks, layout_ptr, scale] =
        args;
    const SlotSpec& spec = *spec_ptr;
    const KvCacheLayout& layout = *layout_ptr;
    HW_CHECK(b < max_blocks);
    const int32_t block_id = block_row[b];
    HW_CHECK(block_id >= 0);  // a visible position must have a block
    const uint8_t* block = pool + size_t(block_id) * layout.BlockBytes();
    const int64_t k0 = b * bs_;
    const int n = int(std::min<int64_t>(bs_, pos_last + 1 - k0));
    // Blocks sit anywhere in the pool, so the hardware prefetcher cannot
    // guess the next one: fetch it while this one is computed.
    if (b + 1 < max_blocks && (b + 1) * bs_ <= pos_last && block_row[b + 1] >= 0) {
      Prefetch(pool + size_t(block_row[b + 1]) * layout.BlockBytes(), layout.BlockBytes());
    }

    // Rows sorted by position see keys of this block in one run [r_lo, r_hi).
    int r_lo = rows, r_hi = 0;
    for (int r = 0; r < rows; ++r) {
      const int64_t pos = pos0 + r;
      if (SeesSome(spec, pos, k0, n)) {
        r_lo = std::min(r_lo, r);
        r_hi = r + 1;
      }
    }
    if (r_lo >= r_hi) return;
    const int i_lo = r_lo * group_, i_hi = r_hi * group_;

    const float* k = reinterpret_cast<const float*>(block + layout.KOffset(0));
    const float* v = reinterpret_cast<const float*>(block + layout.VOffset(0));
    if (layout.dtype != KvCacheDtype::kFloat32) {
      DecodeKvRows(block + layout.KOffset(0), n, hd_, layout.dtype, decoded_k_.data());
      DecodeKvRows(block + layout.VOffset(0), n, hd_, layout.dtype, decoded_v_.data());
      k = decoded_k_.data();
      v = decoded_v_.data();
    }

    // Scores, -inf where a row does not see the key and past the block's keys.
    const float* key[8];
    const __m256 scale8 = _mm256_set1_ps(scale);
    int i = i_lo;
    for (; i + 2 <= i_hi; i += 2) {
      for (int j = 0; j < n; j += 4) {
        for (int t = 0; t < 4; ++t) key[t] = j + t < n ? k + size_t(j + t) * hd_ : zero_row_.data();
        ScoresPair4(q_[i], q_[i + 1], key, hd_, scale8, Scores(i) + j, Scores(i + 1) + j);
      }
    }
    if (i < i_hi) {
      for (int j = 0; j < n; j += 8) {
        for (int t = 0; t < 8; ++t) key[t] = j + t < n ? k + size_t(j + t) * hd_ : zero_row_.data();
        ScoresOne8(q_[i], key, hd_, scale8, Scores(i) + j);
      }
    }
    for (int r = r_lo; r < r_hi; ++r) {
      const int64_t pos = pos0 + r;
      const bool sees_all = pos >= k0 + n - 1 && (!spec.IsSliding() || k0 > pos - spec.window ||
                                                  k0 + n <= spec.sink);
      for (int g = 0; g < group_; ++g) {
        float* s = Scores(r * group_ + g);
        if (!sees_all) {
          for (int j = 0; j < n; ++j) {
            if (!spec.Sees(pos, k0 + j)) s[j] = kMinusInf;
          }
        }
        for (int j = n; j < bs_padded_; ++j) s[j] = kMinusInf;
      }
    }

    // Online softmax: scores become probabilities against the running max.
    for (int iq = i_lo; iq < i_hi; ++iq) {
      float* s = Scores(iq);
      __m256 block_max8 = _mm256_set1_ps(kMinusInf);
      for (int j = 0; j < bs_padded_; j += 8) block_max8 = _mm256_max_ps(block_max8, _mm256_loadu_ps(s + j));
      float lanes[8];
      _mm256_storeu_ps(lanes, block_max8);
      float block_max = kMinusInf;
      for (float x : lanes) block_max = std::max(block_max, x);
      if (!(block_max > max_[iq])) {
        if (block_max == kMinusInf) {  // sees none of these keys: a no-op
          std::fill_n(s, n, 0.0f);
          continue;
        }
      } else {
        const float correction = ExpNonPositive(max_[iq] - block_max);  // ~0 on the first keys
        denom_[iq] *= correction;
        float* acc = acc_.data() + size_t(iq) * hd_;
        for (int d = 0; d < hd_; ++d) acc[d] *= correction;
        max_[iq] = block_max;
      }
      const __m256 m8 = _mm256_set1_ps(max_[iq]);
      const __m256 minus_inf = _mm256_set1_ps(kMinusInf);
      for (int j = 0; j < bs_padded_; j += 8) {
        const __m256 x = _mm256_loadu_ps(s + j);
        const __m256 p = avx2::Exp8(_mm256_sub_ps(x, m8));
        _mm256_storeu_ps(s + j, _mm256_andnot_ps(_mm256_cmp_ps(x, minus_inf, _CMP_EQ_OQ), p));
      }
      float denom = denom_[iq];
      for (int j = 0; j < n; ++j) denom += s[j];  // in key order, as any tile adds them
      denom_[iq] = denom;
    }

    i = i_lo;
    for (; i + 2 <= i_hi; i += 2) {
      AccumulatePair(Scores(i), Scores(i + 1), v, n, hd_, Acc(i), Acc(i + 1));
    }
    if (i < i_hi) AccumulateOne(Scores(i), v, n, hd_, Acc(i));
  }

  static void Prefetch(const uint8_t* p, size_t bytes) {
    for (size_t at = 0; at < bytes; at += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(p + at), _MM_HINT_T0);
    }
  }

  // Whether a query at `pos` sees some key of [k0, k0 + n).
  static bool SeesSome(const SlotSpec& spec, int64_t pos, int64_t k0, int n) {
    if (pos < k0) return false;
    if (!spec.IsSliding()) return true;
    return k0 + n - 1 > pos - spec.window || k0 < spec.sink;
  }

  float* Scores(int i) { return scores_.data() + size_t(i) * bs_padded_; }
  float* Acc(int i) { return acc_.data() + size_t(i) * hd_; }

  const int group_;
  const int hd_;
  const int bs_;
  const int bs_padded_;  // block_size rounded up to 8 lanes
  std::vector<float> max_;     // [kTileRows * group] running max
  std::vector<float> denom_;   // [kTileRows * group] running denominator
  std::vector<float> acc_;     // [kTileRows * group, head_dim] unnormalised output
  std::vector<float> scores_;  // [kTileRows * group, bs_padded]
  std::vector<float> decoded_k_;  // [block_size, head_dim]: a block's keys, decoded
  std::vector<float> decoded_v_;  // [block_size, head_dim]: its values
  std::vector<float> zero_row_;  // [head_dim] zeros: the key padding a score group reads
  std::vector<const float*> q_;  // [kTileRows * group] query vectors of the tile
};

}  // namespace

void AppendKv(const float* k, const float* v, const BatchLayout& batch,
              const LayerBlockTable& table, const KvCacheLayout& layout, uint8_t* pool) {
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
      uint8_t* block = pool + size_t(block_id) * layout.BlockBytes();
      const size_t src = (size_t(row) * num_kv_heads + h) * hd;
      EncodeKvRow(k + src, hd, layout.dtype, block + layout.KOffset(in_block));
      EncodeKvRow(v + src, hd, layout.dtype, block + layout.VOffset(in_block));
    }
  });
}

void PagedAttention(const float* q, const uint8_t* pool, const BatchLayout& batch,
                    const LayerBlockTable& table, const SlotSpec* specs,
                    const KvCacheLayout& layout, int num_heads, float scale, float* out) {
  if (KvCacheDtypeIsRotated(layout.dtype)) {
    // Keys and values are stored rotated: q . k = q' . k' with q' the
    // rotated query, and the output, a sum of rotated values, rotates back.
    const int64_t n = int64_t(batch.num_tokens()) * num_heads * layout.head_dim;
    std::vector<float> q_rotated(q, q + n);
    Hadamard32Groups(q_rotated.data(), n);
    KvCacheLayout stored = layout;
    stored.dtype = KvCacheDtype::kQ4_0;  // the rows' bytes, read without rotating
    PagedAttention(q_rotated.data(), pool, batch, table, specs, stored, num_heads, scale, out);
    Hadamard32Groups(out, n);
    return;
  }
  const int num_kv_heads = table.num_kv_heads;
  HW_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0);
  const int group = num_heads / num_kv_heads;
  const int hd = layout.head_dim;
  HW_CHECK(hd % 8 == 0);
  // Tiles of up to kTileRows consecutive rows of one sequence.
  struct Tile {
    int32_t seq;
    int32_t row_begin;
    int32_t rows;
  };
  std::vector<Tile> tiles;
  for (int s = 0; s < batch.num_seqs; ++s) {
    for (int r = batch.query_start[s]; r < batch.query_start[s + 1]; r += kTileRows) {
      tiles.push_back({s, r, std::min(kTileRows, batch.query_start[s + 1] - r)});
    }
  }
  const size_t row_stride = size_t(num_heads) * hd;
  const int64_t n_items = int64_t(tiles.size()) * num_kv_heads;
  // Rows of a prefill chunk see more keys the later they are: lane L
  // computes items L, L + kLanes, ..., so that every lane gets early and
  // late rows alike and the threads finish together.
  const int64_t lanes = std::min<int64_t>(n_items, kLanes);
  ParallelFor(lanes, 1, [&](int64_t lane_begin, int64_t lane_end) {
    TileAttention attention(group, hd, layout.block_size);
    for (int64_t lane = lane_begin; lane < lane_end; ++lane) {
      for (int64_t item = lane; item < n_items; item += lanes) {
        const Tile& tile = tiles[size_t(item / num_kv_heads)];
        const int h = int(item % num_kv_heads);
        const int64_t pos0 =
            int64_t(batch.start_pos[tile.seq]) + (tile.row_begin - batch.query_start[tile.seq]);
        // Query heads [h * group, (h + 1) * group) are contiguous in q and out.
        const size_t offset = size_t(tile.row_begin) * row_stride + size_t(h) * group * hd;
        attention.Run(q + offset, out + offset, row_stride, tile.rows, pos0, specs[h], pool,
                      table.Row(tile.seq, h), table.max_blocks, layout, scale);
      }
    }
  });
}

}  // namespace headway::cpu
