// PagedAttention and AppendKv against reference::Attention, which reads
// contiguous K/V histories instead of the pool.
//
// Every case builds the head-wise table the way the allocator does after
// recycling: a logical block holding no key visible to any row of the batch
// is -1, and the pool behind it (and every unused position) holds NaN, so a
// read of it would poison the output. Block ids are a random permutation of
// the pool, so blocks are never contiguous.
//
// Tolerance: outputs are convex combinations of values in [-1, 1]. The
// reference accumulates in double; the kernel in f32 with an online softmax.
// With head_dim <= 128 and contexts < 400 keys, f32 rounding stays near
// 1e-6; we allow 2e-5 absolute. A key wrongly masked in or out moves an
// output by about 1/context > 2.5e-3, far above that.
//
// KV cache dtypes other than float32: the pool holds the rows quantized
// (the prefix by reference::QuantizeKvRow, this step's rows by AppendKv,
// whose bytes must equal it), and the reference reads the histories
// dequantized, so the same 2e-5 holds. Against the f32 reference over the
// original values the outputs are also checked within kDtypeTolerance.
// The pool's unused bytes are 0xFF: NaN in every dtype (f32, f16, and the
// f16 scale of a q8_0 / q4_0 group).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "kernels/attention.h"
#include "kernels/reference/reference.h"

namespace headway {
namespace {

constexpr float kTolerance = 2e-5f;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr uint8_t kNaNByte = 0xFF;

// Largest |output - f32 reference| over the test's values (uniform in
// [-1, 1]), from the dtype's step: half an f16 ulp at 1 (2.4e-4) for
// float16; amax / 254 for q8_0 (4e-3 per value); amax / 16 for q4_0
// (6e-2 per value). Attention averages those errors over the keys it sees,
// but a sharp softmax over few keys passes them through almost whole, and
// errors in K move the weights too. The largest errors these cases give are
// 4.2e-4, 6.9e-3 and 0.125; the bounds leave 2.4-2.9x over them.
float DtypeTolerance(KvCacheDtype dtype) {
  switch (dtype) {
    case KvCacheDtype::kFloat32: return kTolerance;
    case KvCacheDtype::kFloat16: return 1e-3f;
    case KvCacheDtype::kQ8_0: return 2e-2f;
    case KvCacheDtype::kQ4_0: return 0.35f;
    case KvCacheDtype::kQ4_0Hadamard: return 0.35f;
  }
  return 0.0f;
}

// The values `dtype` stores for x: quantized, then dequantized, per head
// vector of head_dim values.
std::vector<float> RoundTrip(const std::vector<float>& x, int head_dim, KvCacheDtype dtype) {
  const KvCacheLayout layout{1, head_dim, dtype};
  std::vector<uint8_t> row(layout.RowBytes());
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); i += size_t(head_dim)) {
    reference::QuantizeKvRow(x.data() + i, head_dim, dtype, row.data());
    reference::DequantizeKvRow(row.data(), head_dim, dtype, out.data() + i);
  }
  return out;
}

struct SeqShape {
  int start_pos = 0;  // cached prefix length
  int n_new = 1;      // rows this step
};

struct Case {
  int block_size = 16;
  int head_dim = 64;
  int group = 1;  // query heads per KV head
  std::vector<SlotSpec> specs;  // one per KV head
  std::vector<SeqShape> seqs;
  float q_scale = 1.0f;  // larger: sharper softmax
  uint64_t seed = 1;
  KvCacheDtype dtype = KvCacheDtype::kFloat32;
};

std::string Describe(const Case& c) {
  std::string s = "block_size=" + std::to_string(c.block_size) +
                  " head_dim=" + std::to_string(c.head_dim) +
                  " group=" + std::to_string(c.group) + " specs=";
  for (const SlotSpec& sp : c.specs) {
    s += "(" + std::to_string(sp.window) + "," + std::to_string(sp.sink) + ")";
  }
  s += " seqs=";
  for (const SeqShape& q : c.seqs) {
    s += "(" + std::to_string(q.start_pos) + "+" + std::to_string(q.n_new) + ")";
  }
  return s + " seed=" + std::to_string(c.seed) + " dtype=" + KvCacheDtypeName(c.dtype);
}

// True if some row of the sequence sees a key in [key_begin, key_end).
bool BlockNeeded(const SlotSpec& spec, int start_pos, int context_len, int key_begin,
                 int key_end) {
  for (int key = key_begin; key < std::min(key_end, context_len); ++key) {
    for (int pos = start_pos; pos < context_len; ++pos) {
      if (spec.Sees(pos, key)) return true;
    }
  }
  return false;
}

// Runs one case; returns how many table entries inside the sequences' block
// ranges are -1 (recycled), so callers can check that skipping was exercised.
int RunCase(const Case& c) {
  SCOPED_TRACE(Describe(c));
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const int num_kv_heads = int(c.specs.size());
  const int num_heads = num_kv_heads * c.group;
  const int hd = c.head_dim;
  const int bs = c.block_size;
  const int num_seqs = int(c.seqs.size());

  std::vector<int32_t> query_start(num_seqs + 1, 0), start_pos(num_seqs);
  std::vector<int> context_len(num_seqs);
  int max_blocks = 1;
  size_t hist_rows = 0;
  for (int s = 0; s < num_seqs; ++s) {
    start_pos[s] = c.seqs[s].start_pos;
    query_start[s + 1] = query_start[s] + c.seqs[s].n_new;
    context_len[s] = c.seqs[s].start_pos + c.seqs[s].n_new;
    max_blocks = std::max(max_blocks, (context_len[s] + bs - 1) / bs + 1);  // a spare -1
    hist_rows += context_len[s];
  }
  const BatchLayout batch{num_seqs, query_start.data(), start_pos.data()};
  const int n_tokens = batch.num_tokens();

  // Histories [context_len, num_kv_heads, head_dim] per sequence, concatenated.
  std::vector<float> k_hist(hist_rows * num_kv_heads * hd), v_hist(k_hist.size());
  for (float& x : k_hist) x = unit(rng);
  for (float& x : v_hist) x = unit(rng);
  std::vector<float> q(size_t(n_tokens) * num_heads * hd);
  for (float& x : q) x = unit(rng) * c.q_scale;

  // This step's K/V rows, taken from the histories.
  std::vector<float> k_new(size_t(n_tokens) * num_kv_heads * hd), v_new(k_new.size());
  size_t hist_offset = 0;
  for (int s = 0; s < num_seqs; ++s) {
    for (int j = 0; j < c.seqs[s].n_new; ++j) {
      const size_t src = (hist_offset + start_pos[s] + j) * num_kv_heads * hd;
      const size_t dst = size_t(query_start[s] + j) * num_kv_heads * hd;
      std::copy_n(k_hist.begin() + src, num_kv_heads * hd, k_new.begin() + dst);
      std::copy_n(v_hist.begin() + src, num_kv_heads * hd, v_new.begin() + dst);
    }
    hist_offset += context_len[s];
  }

  // The table: needed blocks get shuffled ids, the rest stay -1.
  std::vector<int32_t> table_ids(size_t(num_seqs) * num_kv_heads * max_blocks, -1);
  int num_needed = 0;
  for (int s = 0; s < num_seqs; ++s) {
    for (int h = 0; h < num_kv_heads; ++h) {
      for (int i = 0; i * bs < context_len[s]; ++i) {
        if (BlockNeeded(c.specs[h], start_pos[s], context_len[s], i * bs, (i + 1) * bs)) {
          table_ids[(size_t(s) * num_kv_heads + h) * max_blocks + i] = num_needed++;
        }
      }
    }
  }
  int num_recycled = 0;
  for (int s = 0; s < num_seqs; ++s) {
    for (int h = 0; h < num_kv_heads; ++h) {
      for (int i = 0; i * bs < context_len[s]; ++i) {
        num_recycled += table_ids[(size_t(s) * num_kv_heads + h) * max_blocks + i] < 0;
      }
    }
  }
  const int num_blocks = num_needed + 5;  // spare blocks, never referenced
  std::vector<int32_t> permutation(num_blocks);
  std::iota(permutation.begin(), permutation.end(), 0);
  std::shuffle(permutation.begin(), permutation.end(), rng);
  for (int32_t& id : table_ids) {
    if (id >= 0) id = permutation[id];
  }
  const KvCacheLayout layout{bs, hd, c.dtype};
  const LayerBlockTable table{table_ids.data(), num_kv_heads, max_blocks};
  std::vector<uint8_t> pool(size_t(num_blocks) * layout.BlockBytes(), kNaNByte);

  // The cached prefix goes straight into the pool, as earlier steps left it.
  hist_offset = 0;
  for (int s = 0; s < num_seqs; ++s) {
    for (int h = 0; h < num_kv_heads; ++h) {
      const int32_t* row = table.Row(s, h);
      for (int pos = 0; pos < start_pos[s]; ++pos) {
        const int32_t id = row[pos / bs];
        if (id < 0) continue;
        uint8_t* block = pool.data() + size_t(id) * layout.BlockBytes();
        const size_t src = ((hist_offset + pos) * num_kv_heads + h) * hd;
        reference::QuantizeKvRow(&k_hist[src], hd, c.dtype, block + layout.KOffset(pos % bs));
        reference::QuantizeKvRow(&v_hist[src], hd, c.dtype, block + layout.VOffset(pos % bs));
      }
    }
    hist_offset += context_len[s];
  }

  cpu::AppendKv(k_new.data(), v_new.data(), batch, table, layout, pool.data());

  // This step's rows hold the reference's bytes.
  std::vector<uint8_t> want_row(layout.RowBytes());
  for (int s = 0; s < num_seqs; ++s) {
    for (int j = 0; j < c.seqs[s].n_new; ++j) {
      const int pos = start_pos[s] + j;
      for (int h = 0; h < num_kv_heads; ++h) {
        const int32_t id = table.Row(s, h)[pos / bs];
        if (id < 0) continue;
        const uint8_t* block = pool.data() + size_t(id) * layout.BlockBytes();
        const size_t src = (size_t(query_start[s] + j) * num_kv_heads + h) * hd;
        reference::QuantizeKvRow(&k_new[src], hd, c.dtype, want_row.data());
        EXPECT_EQ(std::memcmp(block + layout.KOffset(pos % bs), want_row.data(), want_row.size()), 0)
            << "K of seq " << s << " pos " << pos << " head " << h;
        reference::QuantizeKvRow(&v_new[src], hd, c.dtype, want_row.data());
        EXPECT_EQ(std::memcmp(block + layout.VOffset(pos % bs), want_row.data(), want_row.size()), 0)
            << "V of seq " << s << " pos " << pos << " head " << h;
      }
    }
  }

  const float scale = 1.0f / std::sqrt(float(hd));
  std::vector<float> out(q.size(), kNaN), ref(q.size(), kNaN), ref_f32(q.size(), kNaN);
  cpu::PagedAttention(q.data(), pool.data(), batch, table, c.specs.data(), layout, num_heads,
                      scale, out.data());
  const std::vector<float> k_stored = RoundTrip(k_hist, hd, c.dtype);
  const std::vector<float> v_stored = RoundTrip(v_hist, hd, c.dtype);
  reference::Attention(q.data(), k_stored.data(), v_stored.data(), batch, c.specs.data(),
                       num_heads, num_kv_heads, hd, scale, ref.data());
  reference::Attention(q.data(), k_hist.data(), v_hist.data(), batch, c.specs.data(),
                       num_heads, num_kv_heads, hd, scale, ref_f32.data());

  int reported = 0;
  float max_f32_error = 0.0f;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!(std::fabs(out[i] - ref[i]) <= kTolerance)) {  // also catches NaN
      const size_t row = i / (size_t(num_heads) * hd);
      const size_t head = i / hd % num_heads;
      ADD_FAILURE() << "row " << row << " head " << head << " dim " << i % hd << ": got "
                    << out[i] << " want " << ref[i];
      if (++reported >= 5) break;
    }
    max_f32_error = std::max(max_f32_error, std::fabs(out[i] - ref_f32[i]));
  }
  EXPECT_LE(max_f32_error, DtypeTolerance(c.dtype)) << "against attention over f32 K/V";
  return num_recycled;
}

TEST(AttentionTest, DecodeFullAttentionGqa) {
  for (int group : {1, 3, 8}) {
    Case c;
    c.group = group;
    c.specs = {SlotSpec{}, SlotSpec{}, SlotSpec{}};
    c.seqs = {{0, 1}, {1, 1}, {15, 1}, {16, 1}, {17, 1}, {100, 1}};
    c.seed = 10 + group;
    RunCase(c);
  }
}

TEST(AttentionTest, PrefillChunksOverCachedPrefixMixedWithDecode) {
  for (int bs : {1, 16, 32}) {
    Case c;
    c.block_size = bs;
    c.group = 3;
    c.specs = {SlotSpec{}, SlotSpec{20, 4}};
    c.seqs = {{0, 37}, {5, 1}, {45, 19}, {64, 1}, {31, 33}};
    c.seed = 20 + bs;
    RunCase(c);
  }
}

// Decode rows right at the window's edge, sinks that end mid-block or reach
// the window, window 1.
TEST(AttentionTest, SlidingWindowEdges) {
  const int window = 16;
  int num_recycled = 0;
  for (int bs : {1, 16, 32}) {
    for (int sink : {0, 5, 16, 17}) {
      Case c;
      c.block_size = bs;
      c.group = 3;
      c.specs = {SlotSpec{window, sink}, SlotSpec{1, sink}, SlotSpec{}};
      for (int pos : {0, 1, window - 2, window - 1, window, window + 1, 2 * window + 3, 90}) {
        c.seqs.push_back({pos, 1});
      }
      c.seqs.push_back({window + 3, 21});  // a chunk crossing several window edges
      c.seed = 100 + bs * 7 + sink;
      num_recycled += RunCase(c);
    }
  }
  EXPECT_GT(num_recycled, 0);
}

TEST(AttentionTest, WindowOneSeesOnlyItselfAndSink) {
  for (int sink : {0, 3}) {
    Case c;
    c.block_size = 16;
    c.group = 8;
    c.specs = {SlotSpec{1, sink}};
    c.seqs = {{0, 1}, {40, 1}, {10, 30}};
    c.q_scale = 4.0f;
    c.seed = 200 + sink;
    EXPECT_GT(RunCase(c), 0);
  }
}

TEST(AttentionTest, SharpSoftmax) {
  Case c;
  c.group = 3;
  c.specs = {SlotSpec{}, SlotSpec{8, 2}, SlotSpec{64, 0}};
  c.seqs = {{70, 1}, {3, 60}};
  c.q_scale = 12.0f;  // logits up to ~12 sqrt(64)/8 apart
  c.seed = 300;
  RunCase(c);
}

TEST(AttentionTest, RandomShapes) {
  std::mt19937_64 rng(12345);
  auto pick = [&rng](std::initializer_list<int> values) {
    std::vector<int> v(values);
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
  };
  auto range = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 40; ++trial) {
    Case c;
    c.block_size = pick({1, 16, 32});
    c.head_dim = pick({64, 64, 32, 80, 128, 8});
    c.group = pick({1, 3, 8});
    const int num_kv_heads = range(1, 3);
    for (int h = 0; h < num_kv_heads; ++h) {
      if (range(0, 2) == 0) {
        c.specs.push_back(SlotSpec{});
      } else {
        c.specs.push_back(SlotSpec{range(1, 48), pick({0, 0, 1, 4, 16, 20})});
      }
    }
    const int num_seqs = range(1, 5);
    for (int s = 0; s < num_seqs; ++s) {
      if (range(0, 1) == 0) {
        c.seqs.push_back({range(0, 150), 1});  // decode
      } else {
        c.seqs.push_back({pick({0, range(1, 120)}), range(2, 40)});  // prefill chunk
      }
    }
    c.q_scale = float(pick({1, 3}));
    c.seed = 1000 + trial;
    RunCase(c);
    if (::testing::Test::HasFailure()) return;
  }
}

// Every KV cache dtype, decode and prefill over a cached prefix, windows
// and sinks, the head sizes of the real models (64, 256) and others.
TEST(AttentionTest, EveryKvCacheDtype) {
  std::mt19937_64 rng(777);
  auto range = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int num_recycled = 0;
  for (KvCacheDtype dtype : {KvCacheDtype::kFloat16, KvCacheDtype::kQ8_0, KvCacheDtype::kQ4_0,
                             KvCacheDtype::kQ4_0Hadamard}) {
    for (int hd : {32, 64, 128, 256}) {
      for (int trial = 0; trial < 3; ++trial) {
        Case c;
        c.dtype = dtype;
        c.head_dim = hd;
        c.block_size = std::vector<int>{1, 16, 32}[size_t(trial)];
        c.group = std::vector<int>{1, 3, 4}[size_t(trial)];
        c.specs = {SlotSpec{}, SlotSpec{range(1, 40), range(0, 5)}};
        c.seqs = {{range(0, 100), 1}, {0, range(2, 40)}, {range(1, 90), range(2, 30)}, {16, 1}};
        c.q_scale = float(1 + trial);
        c.seed = 5000 + 100 * int(dtype) + hd + trial;
        num_recycled += RunCase(c);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
  EXPECT_GT(num_recycled, 0);
}

// A row's output is the same bits however its sequence's rows are cut into
// steps: all at once (prefill), in uneven chunks, or one per step (decode).
// Preemption and recompute, chunked prefill and prefix caching rely on it:
// the K/V a row writes does not depend on how it was scheduled.
TEST(AttentionTest, RowBitsDoNotDependOnChunking) {
  const int context = 90;
  for (int bs : {1, 16, 32}) {
    for (auto [hd, dtype] : {std::pair{64, KvCacheDtype::kFloat32}, {80, KvCacheDtype::kFloat32},
                             {64, KvCacheDtype::kFloat16}, {64, KvCacheDtype::kQ8_0},
                             {64, KvCacheDtype::kQ4_0}, {64, KvCacheDtype::kQ4_0Hadamard}}) {
      SCOPED_TRACE("block_size=" + std::to_string(bs) + " head_dim=" + std::to_string(hd) +
                   " dtype=" + KvCacheDtypeName(dtype));
      const std::vector<SlotSpec> specs = {SlotSpec{}, SlotSpec{20, 4}, SlotSpec{1, 3},
                                           SlotSpec{16, 17}};
      const int num_kv_heads = int(specs.size()), group = 3, num_heads = num_kv_heads * group;
      const KvCacheLayout layout{bs, hd, dtype};
      const int max_blocks = (context + bs - 1) / bs;
      std::mt19937_64 rng(7 + bs + hd);
      std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
      std::vector<int32_t> ids(size_t(num_kv_heads) * max_blocks);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      std::vector<uint8_t> pool(ids.size() * layout.BlockBytes(), kNaNByte);
      std::vector<float> k_row(hd), v_row(hd);
      for (int h = 0; h < num_kv_heads; ++h) {
        for (int pos = 0; pos < context; ++pos) {
          uint8_t* block = pool.data() + size_t(ids[size_t(h) * max_blocks + pos / bs]) *
                                             layout.BlockBytes();
          for (int d = 0; d < hd; ++d) {
            k_row[d] = unit(rng);
            v_row[d] = unit(rng) * 3.0f;
          }
          reference::QuantizeKvRow(k_row.data(), hd, dtype, block + layout.KOffset(pos % bs));
          reference::QuantizeKvRow(v_row.data(), hd, dtype, block + layout.VOffset(pos % bs));
        }
      }
      const LayerBlockTable table{ids.data(), num_kv_heads, max_blocks};
      const size_t row_floats = size_t(num_heads) * hd;
      std::vector<float> q(context * row_floats);
      for (float& x : q) x = unit(rng) * 3.0f;
      const float scale = 1.0f / std::sqrt(float(hd));

      // Rows [begin, begin + n) as one step; returns their outputs.
      auto run = [&](int begin, int n) {
        const int32_t query_start[2] = {0, n};
        const int32_t start_pos[1] = {begin};
        std::vector<float> out(n * row_floats, kNaN);
        cpu::PagedAttention(q.data() + begin * row_floats, pool.data(),
                            BatchLayout{1, query_start, start_pos}, table, specs.data(), layout,
                            num_heads, scale, out.data());
        return out;
      };
      const std::vector<float> whole = run(0, context);
      std::vector<float> chunked;
      for (int begin = 0, i = 0; begin < context; ++i) {
        const int n = std::min(context - begin, std::vector<int>{7, 13, 1, 30, 2}[i % 5]);
        const std::vector<float> part = run(begin, n);
        chunked.insert(chunked.end(), part.begin(), part.end());
        begin += n;
      }
      std::vector<float> decoded;
      for (int pos = 0; pos < context; ++pos) {
        const std::vector<float> part = run(pos, 1);
        decoded.insert(decoded.end(), part.begin(), part.end());
      }
      ASSERT_EQ(chunked.size(), whole.size());
      ASSERT_EQ(decoded.size(), whole.size());
      EXPECT_EQ(std::memcmp(chunked.data(), whole.data(), whole.size() * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(decoded.data(), whole.data(), whole.size() * sizeof(float)), 0);
      EXPECT_FALSE(std::isnan(whole.back()));
    }
  }
}

// AppendKv writes exactly the K and V rows of each token and nothing else.
TEST(AppendKvTest, WritesThroughTableOnly) {
  const KvCacheLayout layout{4, 8};
  const int num_kv_heads = 2, max_blocks = 3, num_blocks = 9;
  // seq 0: positions 5..7 (blocks 1); seq 1: position 0 and 1 (block 0).
  const std::vector<int32_t> query_start = {0, 3, 5}, start_pos = {5, 0};
  const std::vector<int32_t> ids = {-1, 7, -1, /*h1*/ -1, 2, -1,
                                    /*seq1*/ 4, -1, -1, /*h1*/ 0, -1, -1};
  const BatchLayout batch{2, query_start.data(), start_pos.data()};
  const LayerBlockTable table{ids.data(), num_kv_heads, max_blocks};
  std::vector<float> k(5 * num_kv_heads * 8), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = float(i);
    v[i] = -float(i) - 1.0f;
  }
  std::vector<uint8_t> pool(num_blocks * layout.BlockBytes(), kNaNByte);
  cpu::AppendKv(k.data(), v.data(), batch, table, layout, pool.data());

  std::vector<uint8_t> expected(pool.size(), kNaNByte);
  auto put = [&](int row, int h, int block, int in_block) {
    uint8_t* b = expected.data() + block * layout.BlockBytes();
    std::memcpy(b + layout.KOffset(in_block), &k[(row * num_kv_heads + h) * 8], 8 * sizeof(float));
    std::memcpy(b + layout.VOffset(in_block), &v[(row * num_kv_heads + h) * 8], 8 * sizeof(float));
  };
  for (int j = 0; j < 3; ++j) {
    put(j, 0, 7, 1 + j);
    put(j, 1, 2, 1 + j);
  }
  for (int j = 0; j < 2; ++j) {
    put(3 + j, 0, 4, j);
    put(3 + j, 1, 0, j);
  }
  for (size_t i = 0; i < pool.size(); ++i) EXPECT_EQ(pool[i], expected[i]) << "byte " << i;
}

// The 8- and 4-bit rows against hand-computed groups: scales, rounding of
// ties (to even for q8_0), the nibble order, all-zero groups, and f16's
// rounding and overflow.
TEST(KvCodecTest, RowsByHand) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;  // d = 1
  x[1] = 2.5f;    // a tie: 2
  x[2] = -3.5f;   // a tie: -4
  x[3] = 0.4f;
  std::vector<uint8_t> row(34);
  reference::QuantizeKvRow(x.data(), 32, KvCacheDtype::kQ8_0, row.data());
  EXPECT_EQ(row[0] | (row[1] << 8), 0x3C00);  // f16 1.0
  EXPECT_EQ(int8_t(row[2]), 127);
  EXPECT_EQ(int8_t(row[3]), 2);
  EXPECT_EQ(int8_t(row[4]), -4);
  EXPECT_EQ(int8_t(row[5]), 0);
  std::vector<float> back(32);
  reference::DequantizeKvRow(row.data(), 32, KvCacheDtype::kQ8_0, back.data());
  EXPECT_EQ(back[0], 127.0f);
  EXPECT_EQ(back[2], -4.0f);

  // q4_0: the value of largest magnitude is -8 (d = 1); value 16 goes to
  // the high nibble of byte 0.
  std::fill(x.begin(), x.end(), 0.0f);
  x[0] = -8.0f;
  x[16] = 7.0f;
  x[1] = 3.2f;
  row.assign(18, 0);
  reference::QuantizeKvRow(x.data(), 32, KvCacheDtype::kQ4_0, row.data());
  EXPECT_EQ(row[0] | (row[1] << 8), 0x3C00);
  EXPECT_EQ(row[2], uint8_t(0 | (15 << 4)));  // -8 -> 0, 7 -> 15
  EXPECT_EQ(row[3] & 15, 11);                 // 3.2 -> floor(11.7) = 11
  reference::DequantizeKvRow(row.data(), 32, KvCacheDtype::kQ4_0, back.data());
  EXPECT_EQ(back[0], -8.0f);
  EXPECT_EQ(back[16], 7.0f);
  EXPECT_EQ(back[1], 3.0f);

  std::fill(x.begin(), x.end(), 0.0f);
  for (KvCacheDtype dtype :
       {KvCacheDtype::kQ8_0, KvCacheDtype::kQ4_0, KvCacheDtype::kQ4_0Hadamard}) {
    row.assign(KvCacheLayout{1, 32, dtype}.RowBytes(), 0xAA);
    reference::QuantizeKvRow(x.data(), 32, dtype, row.data());
    reference::DequantizeKvRow(row.data(), 32, dtype, back.data());
    for (float b : back) EXPECT_EQ(b, 0.0f) << KvCacheDtypeName(dtype);
  }

  EXPECT_EQ(reference::FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(reference::FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(reference::FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(reference::FloatToHalf(65520.0f), 0x7C00);            // rounds up to infinity
  EXPECT_EQ(reference::FloatToHalf(1.0f + 1.0f / 2048), 0x3C00);  // a tie: to even
  EXPECT_EQ(reference::FloatToHalf(1.0f + 3.0f / 2048), 0x3C02);  // a tie: to even, up
  EXPECT_EQ(reference::FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(reference::FloatToHalf(std::ldexp(1.0f, -26)), 0x0000);  // below half of it
}

// The rotation of q4_0_hadamard: a lone channel spreads evenly over its
// group, and rotating twice gives the values back.
TEST(KvCodecTest, HadamardSpreadsAChannelAndIsItsOwnInverse) {
  std::vector<float> x(64, 0.0f);
  x[5] = 1.0f;
  x[40] = -2.0f;
  std::vector<float> y = x;
  reference::Hadamard32Groups(y.data(), 64);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(std::fabs(y[i]), 1.0f / std::sqrt(32.0f), 1e-7f) << i;
  for (int i = 32; i < 64; ++i) EXPECT_NEAR(std::fabs(y[i]), 2.0f / std::sqrt(32.0f), 1e-7f) << i;
  reference::Hadamard32Groups(y.data(), 64);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(y[i], x[i], 1e-6f) << i;
}

// q4_0 values whose x * (1/d) + 8.5 lands within an ulp of a step boundary:
// the format rounds once (fma), so an encoder that rounds the product first
// (or a compiler that fuses only one of two builds) gives other nibbles.
TEST(KvCodecTest, Q4BoundariesRoundOnceAsTheFormatSays) {
  const KvCacheLayout layout{1, 32, KvCacheDtype::kQ4_0};
  const float m = -24.0f;  // d = 3: 1/d is not exact in f32
  const float id = 1.0f / (m / -8.0f);
  int rounding_matters = 0;
  for (int k = -7; k <= 7; ++k) {
    float x = 3.0f * (float(k) - 0.5f);
    for (int step = 0; step < 8; ++step, x = std::nextafter(x, 0.0f)) {
      std::vector<float> row(32, 0.0f);
      row[0] = m;
      row[1] = x;
      const int32_t query_start[2] = {0, 1}, start_pos[1] = {0}, ids[1] = {0};
      std::vector<uint8_t> pool(layout.BlockBytes(), kNaNByte), want(layout.RowBytes());
      cpu::AppendKv(row.data(), row.data(), BatchLayout{1, query_start, start_pos},
                    LayerBlockTable{ids, 1, 1}, layout, pool.data());
      reference::QuantizeKvRow(row.data(), 32, KvCacheDtype::kQ4_0, want.data());
      ASSERT_EQ(std::memcmp(pool.data(), want.data(), want.size()), 0) << "x = " << x;
      rounding_matters += std::floor(std::fma(x, id, 8.5f)) != std::floor(x * id + 8.5f);
    }
  }
  std::printf("[ measured ] %d of 120 values round differently when x * id is rounded first\n",
              rounding_matters);
}

// The CPU kernel's encoder and decoder against the reference's, bit for bit,
// on random rows of every scale, NaN and infinity aside.
TEST(KvCodecTest, KernelRowsEqualTheReference) {
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 20);
  for (KvCacheDtype dtype : {KvCacheDtype::kFloat16, KvCacheDtype::kQ8_0, KvCacheDtype::kQ4_0,
                             KvCacheDtype::kQ4_0Hadamard}) {
    const int hd = 128;
    const KvCacheLayout layout{1, hd, dtype};
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<float> x(hd);
      const int e = exponent(rng);
      for (float& v : x) v = std::ldexp(unit(rng), e);
      if (trial % 7 == 0) std::fill(x.begin(), x.begin() + 32, 0.0f);
      // AppendKv of one token into a one-block pool is the kernel's encoder.
      const int32_t query_start[2] = {0, 1}, start_pos[1] = {0}, ids[1] = {0};
      std::vector<uint8_t> pool(layout.BlockBytes(), kNaNByte), want(layout.RowBytes());
      cpu::AppendKv(x.data(), x.data(), BatchLayout{1, query_start, start_pos},
                    LayerBlockTable{ids, 1, 1}, layout, pool.data());
      reference::QuantizeKvRow(x.data(), hd, dtype, want.data());
      ASSERT_EQ(std::memcmp(pool.data(), want.data(), want.size()), 0)
          << KvCacheDtypeName(dtype) << " trial " << trial << " exponent " << e;
    }
  }
}

}  // namespace
}  // namespace headway
