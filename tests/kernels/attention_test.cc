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
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/reference/reference.h"

namespace headway {
namespace {

constexpr float kTolerance = 2e-5f;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

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
  return s + " seed=" + std::to_string(c.seed);
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
  const KvCacheLayout layout{bs, hd};
  const LayerBlockTable table{table_ids.data(), num_kv_heads, max_blocks};
  std::vector<float> pool(size_t(num_blocks) * layout.BlockFloats(), kNaN);

  // The cached prefix goes straight into the pool, as earlier steps left it.
  hist_offset = 0;
  for (int s = 0; s < num_seqs; ++s) {
    for (int h = 0; h < num_kv_heads; ++h) {
      const int32_t* row = table.Row(s, h);
      for (int pos = 0; pos < start_pos[s]; ++pos) {
        const int32_t id = row[pos / bs];
        if (id < 0) continue;
        float* block = pool.data() + size_t(id) * layout.BlockFloats();
        const size_t src = ((hist_offset + pos) * num_kv_heads + h) * hd;
        std::copy_n(k_hist.begin() + src, hd, block + layout.KOffset(pos % bs));
        std::copy_n(v_hist.begin() + src, hd, block + layout.VOffset(pos % bs));
      }
    }
    hist_offset += context_len[s];
  }

  cpu::AppendKv(k_new.data(), v_new.data(), batch, table, layout, pool.data());

  const float scale = 1.0f / std::sqrt(float(hd));
  std::vector<float> out(q.size(), kNaN), ref(q.size(), kNaN);
  cpu::PagedAttention(q.data(), pool.data(), batch, table, c.specs.data(), layout, num_heads,
                      scale, out.data());
  reference::Attention(q.data(), k_hist.data(), v_hist.data(), batch, c.specs.data(),
                       num_heads, num_kv_heads, hd, scale, ref.data());

  int reported = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!(std::fabs(out[i] - ref[i]) <= kTolerance)) {  // also catches NaN
      const size_t row = i / (size_t(num_heads) * hd);
      const size_t head = i / hd % num_heads;
      ADD_FAILURE() << "row " << row << " head " << head << " dim " << i % hd << ": got "
                    << out[i] << " want " << ref[i];
      if (++reported >= 5) break;
    }
  }
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

// A row's output is the same bits however its sequence's rows are cut into
// steps: all at once (prefill), in uneven chunks, or one per step (decode).
// Preemption and recompute, chunked prefill and prefix caching rely on it:
// the K/V a row writes does not depend on how it was scheduled.
TEST(AttentionTest, RowBitsDoNotDependOnChunking) {
  const int context = 90;
  for (int bs : {1, 16, 32}) {
    for (int hd : {64, 80}) {
      SCOPED_TRACE("block_size=" + std::to_string(bs) + " head_dim=" + std::to_string(hd));
      const std::vector<SlotSpec> specs = {SlotSpec{}, SlotSpec{20, 4}, SlotSpec{1, 3},
                                           SlotSpec{16, 17}};
      const int num_kv_heads = int(specs.size()), group = 3, num_heads = num_kv_heads * group;
      const KvCacheLayout layout{bs, hd};
      const int max_blocks = (context + bs - 1) / bs;
      std::mt19937_64 rng(7 + bs + hd);
      std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
      std::vector<int32_t> ids(size_t(num_kv_heads) * max_blocks);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      std::vector<float> pool(ids.size() * layout.BlockFloats(), kNaN);
      for (int h = 0; h < num_kv_heads; ++h) {
        for (int pos = 0; pos < context; ++pos) {
          float* block = pool.data() + size_t(ids[size_t(h) * max_blocks + pos / bs]) *
                                           layout.BlockFloats();
          for (int d = 0; d < hd; ++d) {
            block[layout.KOffset(pos % bs) + d] = unit(rng);
            block[layout.VOffset(pos % bs) + d] = unit(rng) * 3.0f;
          }
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
  std::vector<float> pool(num_blocks * layout.BlockFloats(), kNaN);
  cpu::AppendKv(k.data(), v.data(), batch, table, layout, pool.data());

  std::vector<float> expected(pool.size(), kNaN);
  auto put = [&](int row, int h, int block, int in_block) {
    float* b = expected.data() + block * layout.BlockFloats();
    for (int d = 0; d < 8; ++d) {
      b[layout.KOffset(in_block) + d] = k[(row * num_kv_heads + h) * 8 + d];
      b[layout.VOffset(in_block) + d] = v[(row * num_kv_heads + h) * 8 + d];
    }
  };
  for (int j = 0; j < 3; ++j) {
    put(j, 0, 7, 1 + j);
    put(j, 1, 2, 1 + j);
  }
  for (int j = 0; j < 2; ++j) {
    put(3 + j, 0, 4, j);
    put(3 + j, 1, 0, j);
  }
  for (size_t i = 0; i < pool.size(); ++i) {
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(pool[i])) << "float " << i << " written";
    } else {
      EXPECT_EQ(pool[i], expected[i]) << "float " << i;
    }
  }
}

}  // namespace
}  // namespace headway
