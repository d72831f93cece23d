#include "coordinator/engine/registration.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "comm/kv_write_auth.h"
#include "common/kv_layout.h"
#include "tests/coordinator/fake_model_spec.h"

namespace headway {
namespace {

// The sizes these tests name are float32 blocks': the dtype is explicit.
Config TwoInstances() {
  Config config;
  config.block_size = 16;
  config.kv_cache_dtype = KvCacheDtype::kFloat32;
  PoolConfig pool;
  InstanceConfig tp1;
  InstanceConfig tp3;
  tp3.tp_size = 3;
  pool.instances = {tp1, tp3};
  config.pools = {pool};
  return config;
}

// What a worker of a deployment with one KV cache dtype, `dtype`, sends.
proto::RegisterRequest Good(const ModelSpec& spec, int instance, int rank, int tp,
                            KvCacheDtype dtype = KvCacheDtype::kFloat32) {
  proto::RegisterRequest r;
  r.set_instance_id(instance);
  r.set_tp_rank(rank);
  r.set_tp_size(tp);
  r.set_model_name(spec.name);
  r.set_num_layers(spec.num_layers);
  r.set_num_local_kv_heads(spec.num_kv_heads / tp);
  r.set_head_dim(spec.head_dim);
  r.set_block_size(16);
  r.set_kv_cache_dtype(KvCacheDtypeName(dtype));
  r.set_kv_cache_dtype_sliding(KvCacheDtypeName(dtype));
  const size_t block_bytes = KvCacheLayout{16, spec.head_dim, dtype}.BlockBytes();
  r.set_block_bytes(block_bytes);
  r.set_num_blocks(100);
  // One dtype: a chunk is a block (common/kv_arena.h).
  r.set_chunk_bytes(block_bytes);
  r.set_num_chunks(100);
  r.set_vocab_size(spec.vocab_size);
  return r;
}

TEST(RegistrationTest, AcceptsMatchingWorkers) {
  ModelSpec spec = testing::FakeLlamaSpec();
  Config config = TwoInstances();
  EXPECT_TRUE(ValidateRegisterRequest(Good(spec, 0, 0, 1), "i0r0", config, spec).ok());
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(ValidateRegisterRequest(Good(spec, 1, r, 3), "i1r" + std::to_string(r), config, spec).ok());
  }
}

TEST(RegistrationTest, RejectsMismatchesNamingTheField) {
  ModelSpec spec = testing::FakeLlamaSpec();
  Config config = TwoInstances();
  auto expect = [&](proto::RegisterRequest r, const std::string& peer, const std::string& frag) {
    Status s = ValidateRegisterRequest(r, peer, config, spec);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << frag;
    EXPECT_NE(s.message().find(frag), std::string::npos) << s.message();
  };
  expect(Good(spec, 2, 0, 1), "i2r0", "instance_id 2");
  expect(Good(spec, 0, 0, 3), "i0r0", "tp_size");
  expect(Good(spec, 1, 3, 3), "i1r3", "tp_rank 3");
  expect(Good(spec, 0, 0, 1), "i0r1", "routing identity");
  auto r = Good(spec, 0, 0, 1);
  r.set_block_size(32);
  expect(r, "i0r0", "block_size is 32");
  r = Good(spec, 0, 0, 1);
  r.set_num_layers(5);
  expect(r, "i0r0", "num_layers");
  r = Good(spec, 1, 0, 3);
  r.set_num_local_kv_heads(3);
  expect(r, "i1r0", "num_local_kv_heads is 3");
  r = Good(spec, 0, 0, 1);
  r.set_head_dim(128);
  expect(r, "i0r0", "head_dim");
  r = Good(spec, 0, 0, 1);
  r.set_model_name("other");
  expect(r, "i0r0", "model_name");
  r = Good(spec, 0, 0, 1);
  r.set_num_blocks(0);
  expect(r, "i0r0", "num_blocks");
  // A rank started with another cache.kv_cache_dtype: both dtypes named.
  r = Good(spec, 0, 0, 1);
  r.set_kv_cache_dtype("q8_0");
  expect(r, "i0r0", "kv_cache_dtype is `q8_0` but the deployment's cache.kv_cache_dtype is `float32`");
}

// Ranks of a deployment in q8_0 register with q8_0 blocks, their byte size
// taken from the q8_0 layout; a float32 rank is refused naming both dtypes.
TEST(RegistrationTest, KvCacheDtypeMustBeTheDeployments) {
  ModelSpec spec = testing::FakeLlamaSpec();
  Config config = TwoInstances();
  config.kv_cache_dtype = KvCacheDtype::kQ8_0;
  config.kv_transfer_enabled = true;
  const KvCacheLayout q8{16, spec.head_dim, KvCacheDtype::kQ8_0};
  auto with_endpoint = [&](const char* dtype, uint64_t block_bytes) {
    proto::RegisterRequest r = Good(spec, 0, 0, 1, KvCacheDtype::kQ8_0);
    r.set_kv_cache_dtype(dtype);
    proto::KvEndpoint* e = r.mutable_kv_endpoint();
    e->set_worker_address("ucx-address");
    e->set_block_bytes(block_bytes);
    e->set_num_blocks(100);
    e->set_layout_version(kKvBlockLayoutVersion);
    e->set_dtype(dtype);
    e->add_kv_heads(0);
    e->add_kv_heads(1);
    e->add_kv_heads(2);
    r.set_kv_write_key(std::string(kKvWriteKeyBytes, 'k'));
    return r;
  };
  Status ok = ValidateRegisterRequest(with_endpoint("q8_0", q8.BlockBytes()), "i0r0", config, spec);
  EXPECT_TRUE(ok.ok()) << ok.message();
  Status f32 = ValidateRegisterRequest(
      with_endpoint("float32", KvCacheLayout{16, spec.head_dim}.BlockBytes()), "i0r0", config, spec);
  EXPECT_EQ(f32.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(f32.message().find("`float32` but the deployment's cache.kv_cache_dtype is `q8_0`"),
            std::string::npos)
      << f32.message();
  proto::RegisterRequest wrong_bytes = with_endpoint("q8_0", KvCacheLayout{16, spec.head_dim}.BlockBytes());
  Status bytes = ValidateRegisterRequest(wrong_bytes, "i0r0", config, spec);
  EXPECT_NE(bytes.message().find("kv_endpoint.block_bytes"), std::string::npos) << bytes.message();
}

// With kv_transfer on, a worker whose block layout could not be read by its
// transfer peers is refused at registration, not in the middle of a transfer.
TEST(RegistrationTest, KvEndpointLayoutMustMatch) {
  ModelSpec spec = testing::FakeLlamaSpec();
  Config config = TwoInstances();
  config.kv_transfer_enabled = true;
  auto with_endpoint = [&](int instance, int rank, int tp) {
    proto::RegisterRequest r = Good(spec, instance, rank, tp);
    proto::KvEndpoint* e = r.mutable_kv_endpoint();
    e->set_worker_address("ucx-address");
    e->set_block_bytes(KvCacheLayout{16, spec.head_dim}.BlockBytes());
    e->set_num_blocks(100);
    e->set_layout_version(kKvBlockLayoutVersion);
    e->set_dtype("float32");
    const TpShard shard = ShardForRank(spec, tp, rank);
    for (int h = shard.kv_head_begin; h < shard.kv_head_end; ++h) e->add_kv_heads(h);
    r.set_kv_write_key(std::string(kKvWriteKeyBytes, 'k'));
    return r;
  };
  EXPECT_TRUE(ValidateRegisterRequest(with_endpoint(0, 0, 1), "i0r0", config, spec).ok());
  EXPECT_TRUE(ValidateRegisterRequest(with_endpoint(1, 2, 3), "i1r2", config, spec).ok());
  auto expect = [&](const proto::RegisterRequest& r, const std::string& peer,
                    const std::string& frag) {
    Status s = ValidateRegisterRequest(r, peer, config, spec);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << frag;
    EXPECT_NE(s.message().find(frag), std::string::npos) << s.message();
  };
  expect(Good(spec, 0, 0, 1), "i0r0", "no KV endpoint");
  proto::RegisterRequest r = with_endpoint(0, 0, 1);
  r.mutable_kv_endpoint()->set_layout_version(kKvBlockLayoutVersion + 1);
  expect(r, "i0r0", "kv_endpoint.layout_version");
  r = with_endpoint(0, 0, 1);
  r.mutable_kv_endpoint()->set_block_bytes(4096);
  expect(r, "i0r0", "kv_endpoint.block_bytes is 4096");
  r = with_endpoint(0, 0, 1);
  r.mutable_kv_endpoint()->set_dtype("bf16");
  expect(r, "i0r0", "kv_endpoint.dtype");
  r = with_endpoint(1, 1, 3);
  r.mutable_kv_endpoint()->set_kv_heads(0, 2);
  expect(r, "i1r1", "kv_endpoint.kv_heads[0]");
  r = with_endpoint(0, 0, 1);
  r.mutable_kv_endpoint()->clear_worker_address();
  expect(r, "i0r0", "no UCX worker address");
  // Without its write key no sender could be granted its blocks.
  r = with_endpoint(0, 0, 1);
  r.clear_kv_write_key();
  expect(r, "i0r0", "kv_write_key bytes is 0 but the coordinator expects 32");
}

// A worker's pool with one dtype is an arena of one-block chunks: what
// registered before chunks existed, with chunk_bytes == block_bytes and
// num_chunks == num_blocks.
TEST(RegistrationTest, OneDtypeRegistersChunksOfOneBlock) {
  ModelSpec spec = testing::FakeLlamaSpec();
  Config config = TwoInstances();
  auto expect = [&](const proto::RegisterRequest& r, const std::string& frag) {
    Status s = ValidateRegisterRequest(r, "i0r0", config, spec);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << frag;
    EXPECT_NE(s.message().find(frag), std::string::npos) << s.message();
  };
  const uint64_t block_bytes = KvCacheLayout{16, spec.head_dim}.BlockBytes();
  proto::RegisterRequest r = Good(spec, 0, 0, 1);
  EXPECT_EQ(r.chunk_bytes(), block_bytes);
  r.set_chunk_bytes(2 * block_bytes);
  expect(r, "chunk_bytes is " + std::to_string(2 * block_bytes) +
                " but the coordinator expects " + std::to_string(block_bytes));
  // A worker from before chunks sends none.
  r = Good(spec, 0, 0, 1);
  r.clear_chunk_bytes();
  r.clear_num_chunks();
  expect(r, "chunk_bytes is 0 but the coordinator expects " + std::to_string(block_bytes));
  r = Good(spec, 0, 0, 1);
  r.set_num_chunks(0);
  expect(r, "num_chunks is 0");
  r = Good(spec, 0, 0, 1);
  r.set_num_chunks(99);
  expect(r, "num_blocks is 100 but num_chunks 99");
  r = Good(spec, 0, 0, 1);
  r.clear_kv_cache_dtype_sliding();
  expect(r, "kv_cache_dtype_sliding is `` but the deployment's cache.kv_cache_dtype_sliding is "
            "`float32`");
}

// The fake llama with layer 0 sliding (all three KV heads) and layer 1 full.
ModelSpec SlidingLayerSpec() {
  ModelSpec spec = testing::FakeLlamaSpec();
  for (int h = 0; h < spec.num_kv_heads; ++h) spec.slot_specs[size_t(h)] = SlotSpec{512, 0};
  return spec;
}

// float32 full slots and q8_0 sliding ones: blocks of two sizes in chunks
// of their least common multiple; num_blocks counts float32 blocks.
TEST(RegistrationTest, TwoDtypesRegisterTheArenasChunks) {
  const ModelSpec spec = SlidingLayerSpec();
  Config config = TwoInstances();
  config.kv_cache_dtype_sliding = KvCacheDtype::kQ8_0;
  const uint64_t f32 = KvCacheLayout{16, spec.head_dim, KvCacheDtype::kFloat32}.BlockBytes();
  const uint64_t q8 = KvCacheLayout{16, spec.head_dim, KvCacheDtype::kQ8_0}.BlockBytes();
  const uint64_t chunk = std::lcm(f32, q8);
  ASSERT_GT(chunk, f32);
  auto mixed = [&](int instance, int rank, int tp) {
    proto::RegisterRequest r = Good(spec, instance, rank, tp);
    r.set_kv_cache_dtype_sliding("q8_0");
    r.set_chunk_bytes(chunk);
    r.set_num_chunks(10);
    r.set_num_blocks(uint32_t(10 * chunk / f32));
    return r;
  };
  Status ok = ValidateRegisterRequest(mixed(0, 0, 1), "i0r0", config, spec);
  EXPECT_TRUE(ok.ok()) << ok.ToString();
  for (int rank = 0; rank < 3; ++rank) {
    Status s = ValidateRegisterRequest(mixed(1, rank, 3), "i1r" + std::to_string(rank), config, spec);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  auto expect = [&](const proto::RegisterRequest& r, const std::string& frag) {
    Status s = ValidateRegisterRequest(r, "i0r0", config, spec);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << frag;
    EXPECT_NE(s.message().find(frag), std::string::npos) << s.message();
  };
  // A rank started without the sliding key: its sliding slots in float32.
  expect(Good(spec, 0, 0, 1),
         "kv_cache_dtype_sliding is `float32` but the deployment's cache.kv_cache_dtype_sliding "
         "is `q8_0`");
  proto::RegisterRequest r = mixed(0, 0, 1);
  r.set_chunk_bytes(f32);
  expect(r, "chunk_bytes is " + std::to_string(f32) + " but the coordinator expects " +
                std::to_string(chunk));
  r = mixed(0, 0, 1);
  r.set_num_blocks(10);
  expect(r, "num_blocks is 10 but num_chunks 10 of " + std::to_string(chunk) + " bytes hold " +
                std::to_string(10 * chunk / f32) + " float32 blocks");
}

// A sliding dtype the model has no slot for changes no block size, but the
// rank must still have been started with the deployment's config.
TEST(RegistrationTest, SlidingDtypeWithoutSlidingSlotsKeepsOneBlockSize) {
  const ModelSpec spec = testing::FakeLlamaSpec();
  Config config = TwoInstances();
  config.kv_cache_dtype_sliding = KvCacheDtype::kQ4_0;
  proto::RegisterRequest r = Good(spec, 0, 0, 1);
  r.set_kv_cache_dtype_sliding("q4_0");
  Status s = ValidateRegisterRequest(r, "i0r0", config, spec);
  EXPECT_TRUE(s.ok()) << s.ToString();
  r.set_kv_cache_dtype_sliding("float32");
  EXPECT_EQ(ValidateRegisterRequest(r, "i0r0", config, spec).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace headway
