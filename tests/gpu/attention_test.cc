// kernels/cuda/attention.h against the CPU backend (cpu::PagedAttention,
// cpu::Rope + cpu::AppendKv) on host copies of the same pool.
//
// Pools are filled with NaN (0xFF bytes: NaN in f32, in f16 and as a q
// block's f16 scale) except the keys some query row of the step sees,
// and block ids are a random permutation with spare blocks left NaN, so a
// read of an unused block, of a recycled (-1) entry, or of a key outside a
// window turns the output into NaN (reported as an infinite error). Outputs
// start as NaN too, so a row the kernel forgets to write fails.
//
// Tolerance: both sides compute in f32 with online softmax; they differ in
// summation order and exp (device expf vs the CPU's Cephes polynomial, both
// about 1e-7 relative). With |q|, |k|, |v| <= 1 the outputs are averages of
// values in [-1, 1], so errors sit near 1e-6; 1e-4 absolute catches any real
// bug (a wrong key, mask or split merge is off by O(0.01) or more).
//
// KV cache dtypes: both sides read the same encoded bytes (written by
// reference::QuantizeKvRow) and attend over the same decoded values, so the
// tolerance is float32's. The GPU's own encoding (RopeAppendKv) is checked
// byte for byte against reference::QuantizeKvRow of its float32 rows.
#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/elementwise.h"
#include "kernels/kv_cache.h"
#include "kernels/reference/reference.h"
#include "tests/gpu/gpu_test.h"

namespace headway {
namespace {

using testing::MaxAbsDiff;
using testing::RandomFloats;
using testing::RecordError;
using testing::Sync;
using testing::ToDevice;
using testing::ToHost;

constexpr double kAttentionTolerance = 1e-4;
constexpr double kRopeTolerance = 1e-5;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct SeqRows {
  int start_pos;
  int q_len;
};

struct Scenario {
  std::string name;
  int num_kv_heads = 2;
  int group = 4;  // query heads per KV head
  int head_dim = 128;
  int block_size = 16;
  KvCacheDtype dtype = KvCacheDtype::kFloat32;
  std::vector<SeqRows> seqs;
  std::vector<SlotSpec> specs;  // [num_kv_heads], cycled if shorter
  int num_heads() const { return num_kv_heads * group; }
};

// Whether some row of the step (positions [p_first, p_last]) sees `pos`.
bool AnyRowSees(const SlotSpec& spec, int p_first, int p_last, int pos) {
  if (pos > p_last) return false;
  if (!spec.IsSliding()) return true;
  return pos < spec.sink || pos > p_first - spec.window;
}

// A batch and its pool on the host, as the step executor would hold them.
struct HostBatch {
  std::vector<int32_t> query_start, start_pos, token_seq, positions;
  std::vector<int32_t> block_ids;  // [num_seqs, num_kv_heads, max_blocks]
  std::vector<SlotSpec> specs;     // [num_kv_heads]
  std::vector<uint8_t> pool;       // [num_blocks, BlockBytes()] in layout.dtype
  KvCacheLayout layout;
  int max_blocks = 0;
  int max_query_len = 0;
  int max_context_len = 0;
  int num_tokens() const { return query_start.back(); }
};

// Builds the batch of `sc`: block ids are a shuffled subset of a larger
// pool; a sliding slot's blocks wholly outside the sink and the window of
// the step's first row are -1 (recycled). K/V of keys some row sees are
// random in [-1, 1], encoded in sc.dtype; every other pool byte is 0xFF.
HostBatch BuildBatch(const Scenario& sc, uint64_t seed) {
  HostBatch b;
  b.layout.block_size = sc.block_size;
  b.layout.head_dim = sc.head_dim;
  b.layout.dtype = sc.dtype;
  const int num_seqs = int(sc.seqs.size());
  const int bs = sc.block_size;
  b.query_start.push_back(0);
  for (int s = 0; s < num_seqs; ++s) {
    const SeqRows& r = sc.seqs[s];
    b.start_pos.push_back(r.start_pos);
    for (int j = 0; j < r.q_len; ++j) {
      b.token_seq.push_back(s);
      b.positions.push_back(r.start_pos + j);
    }
    b.query_start.push_back(b.query_start.back() + r.q_len);
    b.max_query_len = std::max(b.max_query_len, r.q_len);
    b.max_context_len = std::max(b.max_context_len, r.start_pos + r.q_len);
    b.max_blocks = std::max(b.max_blocks, (r.start_pos + r.q_len + bs - 1) / bs + 2);
  }
  for (int h = 0; h < sc.num_kv_heads; ++h) b.specs.push_back(sc.specs[h % sc.specs.size()]);

  // Which logical blocks each slot keeps.
  b.block_ids.assign(size_t(num_seqs) * sc.num_kv_heads * b.max_blocks, -1);
  int needed = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const int p_first = sc.seqs[s].start_pos;
    const int p_last = p_first + sc.seqs[s].q_len - 1;
    for (int h = 0; h < sc.num_kv_heads; ++h) {
      for (int i = 0; i * bs <= p_last; ++i) {
        bool keep = false;
        for (int pos = i * bs; pos < (i + 1) * bs && !keep; ++pos) {
          keep = AnyRowSees(b.specs[h], p_first, p_last, pos);
        }
        if (keep) b.block_ids[(size_t(s) * sc.num_kv_heads + h) * b.max_blocks + i] = needed++;
      }
    }
  }
  const int num_blocks = needed + needed / 2 + 3;  // spare blocks stay NaN
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int32_t& id : b.block_ids) {
    if (id >= 0) id = perm[id];
  }

  b.pool.assign(size_t(num_blocks) * b.layout.BlockBytes(), 0xFF);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> k_row(sc.head_dim), v_row(sc.head_dim);
  for (int s = 0; s < num_seqs; ++s) {
    const int p_first = sc.seqs[s].start_pos;
    const int p_last = p_first + sc.seqs[s].q_len - 1;
    for (int h = 0; h < sc.num_kv_heads; ++h) {
      const int32_t* row = b.block_ids.data() + (size_t(s) * sc.num_kv_heads + h) * b.max_blocks;
      for (int pos = 0; pos <= p_last; ++pos) {
        if (!AnyRowSees(b.specs[h], p_first, p_last, pos)) continue;
        const int32_t id = row[pos / bs];
        EXPECT_GE(id, 0);
        if (id < 0) continue;
        uint8_t* block = b.pool.data() + size_t(id) * b.layout.BlockBytes();
        for (int d = 0; d < sc.head_dim; ++d) {
          k_row[d] = dist(rng);
          v_row[d] = dist(rng);
        }
        reference::QuantizeKvRow(k_row.data(), sc.head_dim, sc.dtype,
                                 block + b.layout.KOffset(pos % bs));
        reference::QuantizeKvRow(v_row.data(), sc.head_dim, sc.dtype,
                                 block + b.layout.VOffset(pos % bs));
      }
    }
  }
  return b;
}

// The batch's index arrays on the device; DeviceBatch points into it.
struct DeviceArrays {
  cuda::DeviceBuffer query_start, start_pos, token_seq, positions, block_ids, specs;
  cuda::DeviceBatch batch;
  LayerBlockTable table;
};

DeviceArrays ToDeviceArrays(const HostBatch& b, int num_kv_heads) {
  DeviceArrays d;
  d.query_start = ToDevice(b.query_start);
  d.start_pos = ToDevice(b.start_pos);
  d.token_seq = ToDevice(b.token_seq);
  d.positions = ToDevice(b.positions);
  d.block_ids = ToDevice(b.block_ids);
  d.specs = ToDevice(b.specs);
  d.batch.num_seqs = int(b.start_pos.size());
  d.batch.num_tokens = b.num_tokens();
  d.batch.query_start = d.query_start.as<int32_t>();
  d.batch.start_pos = d.start_pos.as<int32_t>();
  d.batch.token_seq = d.token_seq.as<int32_t>();
  d.batch.positions = d.positions.as<int32_t>();
  d.batch.max_query_len = b.max_query_len;
  d.batch.max_context_len = b.max_context_len;
  d.table.block_ids = d.block_ids.as<int32_t>();
  d.table.num_kv_heads = num_kv_heads;
  d.table.max_blocks = b.max_blocks;
  return d;
}

struct AttentionCheck {
  double max_abs_error = 0.0;
  int splits = 0;
};

// Runs cuda::PagedAttention and cpu::PagedAttention on `sc` and compares.
AttentionCheck RunAttention(const Scenario& sc, uint64_t seed) {
  AttentionCheck check;
  const HostBatch b = BuildBatch(sc, seed);
  const int n_tokens = b.num_tokens();
  const int num_heads = sc.num_heads();
  const size_t out_floats = size_t(n_tokens) * num_heads * sc.head_dim;
  const std::vector<float> q = RandomFloats(out_floats, seed + 1);
  const float scale = 1.0f / std::sqrt(float(sc.head_dim));

  std::vector<float> want(out_floats);
  const BatchLayout layout{int(b.start_pos.size()), b.query_start.data(), b.start_pos.data()};
  const LayerBlockTable host_table{b.block_ids.data(), sc.num_kv_heads, b.max_blocks};
  cpu::PagedAttention(q.data(), b.pool.data(), layout, host_table, b.specs.data(), b.layout,
                      num_heads, scale, want.data());

  DeviceArrays d = ToDeviceArrays(b, sc.num_kv_heads);
  cuda::DeviceBuffer q_d = ToDevice(q);
  cuda::DeviceBuffer pool_d = ToDevice(b.pool);
  cuda::DeviceBuffer out_d = ToDevice(std::vector<float>(out_floats, kNaN));
  auto workspace = cuda::DeviceBuffer::Allocate(
      cuda::PagedAttentionWorkspaceBytes(n_tokens, num_heads, sc.head_dim));
  EXPECT_TRUE(workspace.ok()) << workspace.status().ToString();
  if (!workspace.ok()) return {std::numeric_limits<double>::infinity(), 0};
  check.splits = cuda::PagedAttentionSplits(d.batch, num_heads, sc.num_kv_heads, sc.head_dim);
  cuda::PagedAttention(q_d.as<float>(), pool_d.as<uint8_t>(), d.batch, d.table,
                       d.specs.as<SlotSpec>(), b.layout, num_heads, scale, workspace->data(),
                       out_d.as<float>(), nullptr);
  const Status launched = cuda::CheckLastError("PagedAttention");
  EXPECT_TRUE(launched.ok()) << launched.ToString();
  Sync("PagedAttention");
  const std::vector<float> got = ToHost<float>(out_d.data(), out_floats);
  check.max_abs_error = MaxAbsDiff(got, want);
  return check;
}

std::string Describe(const Scenario& sc, const AttentionCheck& check) {
  std::ostringstream os;
  os << sc.name << ": " << KvCacheDtypeName(sc.dtype) << ", head_dim " << sc.head_dim << ", group " << sc.group << ", kv heads "
     << sc.num_kv_heads << ", block " << sc.block_size << ", splits " << check.splits
     << ", max abs error " << check.max_abs_error;
  return os.str();
}

const std::vector<SlotSpec> kMixedSpecs = {
    {0, 0},     // full
    {7, 0},     // window smaller than a block
    {40, 4},    // window of a few blocks, sink inside the first block
    {300, 20},  // sink over a block boundary
};

// Decode rows and prefill chunks over cached prefixes, in one batch.
std::vector<SeqRows> MixedSeqs() {
  return {{0, 1},  {16, 1},   {299, 1},   {2499, 1},    // decode
          {0, 37}, {100, 50}, {1000, 20}, {2000, 70}};  // prefill chunks
}

TEST(CudaPagedAttention, MixedBatchMatchesCpu) {
  HW_SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (int head_dim : {64, 128, 256}) {
    for (int group : {1, 3, 4, 8}) {
      Scenario sc;
      sc.name = "mixed";
      sc.num_kv_heads = 4;
      sc.group = group;
      sc.head_dim = head_dim;
      sc.seqs = MixedSeqs();
      sc.specs = kMixedSpecs;
      const AttentionCheck check = RunAttention(sc, seed++);
      EXPECT_LE(RecordError(check.max_abs_error), kAttentionTolerance) << Describe(sc, check);
      std::printf("%s\n", Describe(sc, check).c_str());
    }
  }
}

TEST(CudaPagedAttention, BlockSizesAndWindows) {
  HW_SKIP_WITHOUT_GPU();
  const std::vector<SlotSpec> specs = {
      {1, 0},     // only itself
      {1, 1},     // itself and position 0
      {5000, 3},  // window past the context: full with a sink
      {16, 16},   // window and sink exactly one 16-block
      {9, 2},     // window inside a block, sink of two
      {0, 0},     // full
  };
  uint64_t seed = 200;
  for (int block_size : {8, 16, 32}) {
    Scenario sc;
    sc.name = "windows";
    sc.num_kv_heads = 6;
    sc.group = 2;
    sc.head_dim = 128;
    sc.block_size = block_size;
    sc.seqs = {{0, 1}, {5, 1}, {700, 1}, {31, 33}, {64, 100}, {333, 17}};
    sc.specs = specs;
    const AttentionCheck check = RunAttention(sc, seed++);
    EXPECT_LE(RecordError(check.max_abs_error), kAttentionTolerance) << Describe(sc, check);
    std::printf("%s\n", Describe(sc, check).c_str());
  }
}

TEST(CudaPagedAttention, LongDecodeSplitsMatchCpu) {
  HW_SKIP_WITHOUT_GPU();
  uint64_t seed = 300;
  for (int head_dim : {64, 128, 256}) {
    Scenario sc;
    sc.name = "long decode";
    sc.num_kv_heads = 2;
    sc.group = 4;
    sc.head_dim = head_dim;
    sc.seqs = {{3999, 1}, {2999, 1}, {0, 1}, {1234, 1}};
    sc.specs = {{0, 0}, {1000, 16}};
    const AttentionCheck check = RunAttention(sc, seed++);
    EXPECT_LE(RecordError(check.max_abs_error), kAttentionTolerance) << Describe(sc, check);
    EXPECT_GT(check.splits, 1) << Describe(sc, check);
    std::printf("%s\n", Describe(sc, check).c_str());
  }
}

TEST(CudaPagedAttention, LargePrefillWithoutSplitMatchesCpu) {
  HW_SKIP_WITHOUT_GPU();
  Scenario sc;
  sc.name = "large prefill";
  sc.num_kv_heads = 2;
  sc.group = 4;
  sc.head_dim = 128;
  sc.seqs = {{200, 1100}, {50, 1}};
  sc.specs = {{0, 0}, {100, 4}};
  const AttentionCheck check = RunAttention(sc, 400);
  EXPECT_LE(RecordError(check.max_abs_error), kAttentionTolerance) << Describe(sc, check);
  EXPECT_EQ(check.splits, 1) << Describe(sc, check);  // out written directly
  std::printf("%s\n", Describe(sc, check).c_str());
}

TEST(CudaPagedAttention, GroupLargerThanTileMatchesCpu) {
  HW_SKIP_WITHOUT_GPU();
  // head_dim 256 tiles 16 query vectors, so a group of 20 spans two CTAs.
  Scenario sc;
  sc.name = "wide group";
  sc.num_kv_heads = 2;
  sc.group = 20;
  sc.head_dim = 256;
  sc.seqs = {{0, 3}, {90, 1}, {500, 12}};
  sc.specs = {{0, 0}, {33, 5}};
  const AttentionCheck check = RunAttention(sc, 500);
  EXPECT_LE(RecordError(check.max_abs_error), kAttentionTolerance) << Describe(sc, check);
  std::printf("%s\n", Describe(sc, check).c_str());
}

std::vector<float> AsFloats(const std::vector<uint8_t>& bytes) {
  std::vector<float> floats(bytes.size() / sizeof(float));
  std::memcpy(floats.data(), bytes.data(), floats.size() * sizeof(float));
  return floats;
}

const KvCacheDtype kSmallDtypes[] = {KvCacheDtype::kFloat16, KvCacheDtype::kQ8_0,
                                     KvCacheDtype::kQ4_0, KvCacheDtype::kQ4_0Hadamard};

TEST(CudaPagedAttention, EveryKvCacheDtypeMatchesCpu) {
  HW_SKIP_WITHOUT_GPU();
  uint64_t seed = 700;
  for (KvCacheDtype dtype : kSmallDtypes) {
    for (int head_dim : {64, 128, 256}) {
      Scenario sc;
      sc.name = "mixed";
      sc.dtype = dtype;
      sc.num_kv_heads = 4;
      sc.group = 3;
      sc.head_dim = head_dim;
      sc.seqs = MixedSeqs();
      sc.specs = kMixedSpecs;
      AttentionCheck check = RunAttention(sc, seed++);
      EXPECT_LE(RecordError(check.max_abs_error), kAttentionTolerance) << Describe(sc, check);
      std::printf("%s\n", Describe(sc, check).c_str());

      sc.name = "long decode";
      sc.group = 4;
      sc.num_kv_heads = 2;
      sc.seqs = {{3999, 1}, {2999, 1}, {0, 1}, {1234, 1}};
      sc.specs = {{0, 0}, {1000, 16}};
      check = RunAttention(sc, seed++);
      EXPECT_LE(RecordError(check.max_abs_error), kAttentionTolerance) << Describe(sc, check);
      EXPECT_GT(check.splits, 1) << Describe(sc, check);
      std::printf("%s\n", Describe(sc, check).c_str());
    }
  }
}

TEST(CudaRopeAppendKv, MatchesCpuRopeAndAppendKv) {
  HW_SKIP_WITHOUT_GPU();
  uint64_t seed = 600;
  for (int head_dim : {64, 128, 256}) {
    for (cpu::RopeStyle style : {cpu::RopeStyle::kInterleaved, cpu::RopeStyle::kNeox}) {
      Scenario sc;
      sc.num_kv_heads = 2;
      sc.group = 3;
      sc.head_dim = head_dim;
      sc.seqs = {{0, 1}, {17, 1}, {70000, 1}, {0, 40}, {95, 30}};
      sc.specs = {{16, 0}};  // sliding: only blocks near the step are allocated
      HostBatch b = BuildBatch(sc, seed++);
      const int n_tokens = b.num_tokens();
      const int num_heads = sc.num_heads();
      const int kv_width = sc.num_kv_heads * head_dim;
      // Blocks of this step's positions only; the prefix blocks become -1 so
      // the kernel must not touch them (they stay NaN on both sides).
      for (int s = 0; s < int(sc.seqs.size()); ++s) {
        for (int h = 0; h < sc.num_kv_heads; ++h) {
          int32_t* row = b.block_ids.data() + (size_t(s) * sc.num_kv_heads + h) * b.max_blocks;
          for (int i = 0; i < b.max_blocks; ++i) {
            if ((i + 1) * sc.block_size <= sc.seqs[s].start_pos) row[i] = -1;
          }
        }
      }
      std::fill(b.pool.begin(), b.pool.end(), 0xFF);
      std::vector<float> q = RandomFloats(size_t(n_tokens) * num_heads * head_dim, seed + 10);
      const std::vector<float> k = RandomFloats(size_t(n_tokens) * kv_width, seed + 11);
      const std::vector<float> v = RandomFloats(size_t(n_tokens) * kv_width, seed + 12);
      const float freq_base = 10000.0f;

      DeviceArrays d = ToDeviceArrays(b, sc.num_kv_heads);
      cuda::DeviceBuffer q_d = ToDevice(q);
      cuda::DeviceBuffer k_d = ToDevice(k);
      cuda::DeviceBuffer v_d = ToDevice(v);
      cuda::DeviceBuffer pool_d = ToDevice(b.pool);
      cuda::RopeAppendKv(q_d.as<float>(), k_d.as<float>(), v_d.as<float>(), d.batch, d.table,
                         b.layout, num_heads, freq_base, style, pool_d.as<uint8_t>(), nullptr);
      const Status launched = cuda::CheckLastError("RopeAppendKv");
      EXPECT_TRUE(launched.ok()) << launched.ToString();
      Sync("RopeAppendKv");
      const std::vector<float> got_q = ToHost<float>(q_d.data(), q.size());
      const std::vector<uint8_t> got_pool_bytes = ToHost<uint8_t>(pool_d.data(), b.pool.size());
      const std::vector<float> k_before = ToHost<float>(k_d.data(), k.size());

      std::vector<float> k_rot = k;
      cpu::Rope(q.data(), b.positions.data(), n_tokens, num_heads, head_dim, freq_base, style);
      cpu::Rope(k_rot.data(), b.positions.data(), n_tokens, sc.num_kv_heads, head_dim, freq_base,
                style);
      const BatchLayout layout{int(b.start_pos.size()), b.query_start.data(), b.start_pos.data()};
      const LayerBlockTable host_table{b.block_ids.data(), sc.num_kv_heads, b.max_blocks};
      cpu::AppendKv(k_rot.data(), v.data(), layout, host_table, b.layout, b.pool.data());

      const double q_error = MaxAbsDiff(got_q, q);
      const double pool_error = MaxAbsDiff(AsFloats(got_pool_bytes), AsFloats(b.pool));
      const char* style_name = style == cpu::RopeStyle::kNeox ? "neox" : "interleaved";
      EXPECT_LE(RecordError(q_error), kRopeTolerance)
          << "q, head_dim " << head_dim << ", " << style_name;
      EXPECT_LE(RecordError(pool_error, "pool_max_abs_error"), kRopeTolerance)
          << "pool, head_dim " << head_dim << ", " << style_name;
      EXPECT_EQ(MaxAbsDiff(k_before, k), 0.0) << "k must not change";
      std::printf("RopeAppendKv head_dim %d %s: q max abs error %g, pool max abs error %g\n",
                  head_dim, style_name, q_error, pool_error);
    }
  }
}

// Each small dtype's append writes reference::QuantizeKvRow of the float32
// kernel's rows, byte for byte (the rotation's roundings are explicit, so
// the f32 rows are the same bits in every instantiation); bytes of rows the
// step does not write stay as they were.
TEST(CudaRopeAppendKv, EveryKvCacheDtypeEncodesTheFloat32RowsAsTheReference) {
  HW_SKIP_WITHOUT_GPU();
  uint64_t seed = 800;
  for (KvCacheDtype dtype : kSmallDtypes) {
    for (int head_dim : {64, 128, 256}) {
      Scenario sc;
      sc.num_kv_heads = 2;
      sc.group = 3;
      sc.head_dim = head_dim;
      sc.seqs = {{0, 1}, {17, 1}, {70000, 1}, {0, 40}, {95, 30}};
      sc.specs = {{16, 0}};
      const HostBatch b = BuildBatch(sc, seed++);  // float32: the tables and block count
      const int n_tokens = b.num_tokens();
      const int num_heads = sc.num_heads();
      const int kv_width = sc.num_kv_heads * head_dim;
      const std::vector<float> q = RandomFloats(size_t(n_tokens) * num_heads * head_dim, seed);
      const std::vector<float> k = RandomFloats(size_t(n_tokens) * kv_width, seed + 1);
      const std::vector<float> v = RandomFloats(size_t(n_tokens) * kv_width, seed + 2);
      const size_t num_blocks = b.pool.size() / b.layout.BlockBytes();
      KvCacheLayout small = b.layout;
      small.dtype = dtype;

      DeviceArrays d = ToDeviceArrays(b, sc.num_kv_heads);
      auto append = [&](const KvCacheLayout& layout, std::vector<float>* q_out) {
        cuda::DeviceBuffer q_d = ToDevice(q);
        cuda::DeviceBuffer k_d = ToDevice(k);
        cuda::DeviceBuffer v_d = ToDevice(v);
        cuda::DeviceBuffer pool_d =
            ToDevice(std::vector<uint8_t>(num_blocks * layout.BlockBytes(), 0xFF));
        cuda::RopeAppendKv(q_d.as<float>(), k_d.as<float>(), v_d.as<float>(), d.batch, d.table,
                           layout, num_heads, 10000.0f, cpu::RopeStyle::kNeox,
                           pool_d.as<uint8_t>(), nullptr);
        const Status launched = cuda::CheckLastError("RopeAppendKv");
        EXPECT_TRUE(launched.ok()) << launched.ToString();
        Sync("RopeAppendKv");
        *q_out = ToHost<float>(q_d.data(), q.size());
        return ToHost<uint8_t>(pool_d.data(), num_blocks * layout.BlockBytes());
      };
      std::vector<float> q_f32, q_small;
      const std::vector<uint8_t> f32_pool = append(b.layout, &q_f32);
      const std::vector<uint8_t> got = append(small, &q_small);

      std::vector<uint8_t> want(got.size(), 0xFF);
      int rows_written = 0;
      for (size_t blk = 0; blk < num_blocks; ++blk) {
        for (int r = 0; r < 2 * sc.block_size; ++r) {
          const uint8_t* src = f32_pool.data() + blk * b.layout.BlockBytes() + r * b.layout.RowBytes();
          uint32_t first = 0;
          std::memcpy(&first, src, sizeof(first));
          if (first == 0xFFFFFFFFu) continue;  // not written by this step
          std::vector<float> row(head_dim);
          std::memcpy(row.data(), src, sizeof(float) * head_dim);
          reference::QuantizeKvRow(row.data(), head_dim, dtype,
                                   want.data() + blk * small.BlockBytes() + r * small.RowBytes());
          ++rows_written;
        }
      }
      size_t mismatches = 0;
      for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != want[i];
      EXPECT_GT(rows_written, 0);
      EXPECT_EQ(mismatches, 0u) << KvCacheDtypeName(dtype) << ", head_dim " << head_dim;
      EXPECT_EQ(MaxAbsDiff(q_small, q_f32), 0.0) << "q must rotate as in the float32 kernel";
      std::printf("RopeAppendKv %s head_dim %d: %d rows, %zu bytes differ from the reference\n",
                  KvCacheDtypeName(dtype), head_dim, rows_written, mismatches);
    }
  }
}

}  // namespace
}  // namespace headway
